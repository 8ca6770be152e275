"""EncoderCache: an encoder's output as a first-class cached object.

An entry is keyed by (scope, content hash of the encoder input) and has up to three tiers:
- hot: its cross-attention K/V in CrossKVPool pages, which requests read directly (no copy);
- host (`--host-cache-gb`): the same K/V copied to a `HostKVPool` when evicted from the
  device, copied back on a later hit instead of running the encoder;
- warm: the encoder's hidden states, much smaller, kept after the K/V are evicted while the
  hidden-state budget allows, so a later hit costs one K/V projection per cross layer
  instead of an encoder pass.

The scope is the request's namespace (its user under `--cache-isolation user`). Under
`shared` isolation (a `SharingRule`) an entry is private to its user (scope: the user id)
until enough distinct users have sent the same input within the window; then the private
entries merge into one public entry (scope `PUBLIC`) and the duplicates' pages are freed.

Ownership and locking contract: the cache owns every entry's pages and hidden states.
`acquire` returns an entry with a reference held for the caller; the caller passes it to
`release` exactly once. Entries with references are never evicted; one merged away while
referenced is detached (no new request finds it) and freed at its last release. Without
caching (`enabled=False`) an entry is dropped as soon as its last reference is released.
"""

from __future__ import annotations

import enum
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from seq2serve.cross_attention.cross_kv_pool import CrossKVHandle, CrossKVPool
from seq2serve.encoders.encoder_input import EncoderSegment
from seq2serve.runtime.memory.cache_sharing import ANONYMOUS, PUBLIC, SharingRule, UsageWindow
from seq2serve.runtime.memory.host_kv_pool import HostKVPool


class EncodeWork(enum.Enum):
    NONE = "none"  # K/V are (or are being) written: nothing to do
    ENCODE = "encode"  # run the encoder, then project to K/V
    PROJECT = "project"  # hidden states are cached: only project to K/V


@dataclass(eq=False)
class EncoderCacheEntry:
    key: tuple[str | None, str]  # (scope, content hash)
    length: int  # cross K/V tokens
    handle: CrossKVHandle | None = None  # hot tier
    hidden: torch.Tensor | None = field(default=None, repr=False)  # warm tier
    host_pages: list[int] | None = None  # host tier (its K/V in HostKVPool pages)
    # the encoder output's mean over the input's tokens, L2-normalised (float32, d_model):
    # set by the encoder stage, kept with the entry (an embedding request reads it)
    embedding: torch.Tensor | None = field(default=None, repr=False)
    refs: int = 0
    detached: bool = False  # merged into a public entry while referenced

    @property
    def ready(self) -> bool:
        return self.handle is not None and self.handle.ready

    @property
    def public(self) -> bool:
        return self.key[0] is PUBLIC


@dataclass
class EncoderJob:
    """Cross K/V the encoder stage must still write for one cache entry."""

    entry: EncoderCacheEntry
    work: EncodeWork
    segment: EncoderSegment


@dataclass(eq=False)
class _Content:
    """Shared isolation: one input's counters and the scopes holding an entry of it."""

    usage: UsageWindow = field(default_factory=UsageWindow)
    scopes: set = field(default_factory=set)


class EncoderCache:
    def __init__(self, pool: CrossKVPool, enabled: bool, hidden_budget_bytes: int,
                 sharing: SharingRule | None = None, host: HostKVPool | None = None) -> None:
        self.pool = pool
        self.enabled = enabled
        self.hidden_budget_bytes = hidden_budget_bytes if enabled else 0
        self.sharing = sharing
        self.host = host if enabled else None
        self.entries: OrderedDict[tuple[str | None, str], EncoderCacheEntry] = OrderedDict()  # LRU
        self.contents: dict[str, _Content] = {}  # shared isolation, by content hash
        self.detached: list[EncoderCacheEntry] = []
        # unreferenced indexed entries holding K/V pages (`idle_hot`) or hidden states
        # (`idle_hidden`), least recently released first: what eviction may take, found
        # without walking every entry (a referenced entry is in neither; `_sync` keeps them)
        self.idle_hot: OrderedDict[EncoderCacheEntry, int] = OrderedDict()  # -> its pages
        self.idle_hidden: OrderedDict[EncoderCacheEntry, None] = OrderedDict()
        self.idle_hot_pages = 0
        self.hidden_bytes = 0
        self.lookups = self.hits = self.evictions = 0
        self.host_stores = self.host_hits = 0

    # --- acquiring and releasing -------------------------------------------------------------
    def acquire(self, key: tuple[str, str], length: int,
                user: str | None = None) -> tuple[EncoderCacheEntry, EncodeWork] | None:
        """A referenced entry for `key` and the work still needed to fill its K/V; None (and
        nothing held) if the pool cannot make room even after evicting unused entries. Under
        shared isolation `user` is counted on the input and sees public entries and its own."""
        self.lookups += 1
        if self.sharing is not None and self.enabled:
            key = self._scoped(key[1], user or ANONYMOUS)
        try:
            return self._acquire(key, length)
        finally:
            content = self.contents.get(key[1])
            if content is not None and not content.scopes:
                del self.contents[key[1]]

    def _acquire(self, key, length: int) -> tuple[EncoderCacheEntry, EncodeWork] | None:
        entry = self.entries.get(key)
        if entry is not None and entry.handle is not None:
            self.hits += 1
            return self._ref(entry), EncodeWork.NONE
        if not self._make_room(self.pool.pages_for(length), keep=entry):
            return None
        handle = self.pool.alloc(length)
        if entry is not None and entry.host_pages is not None:  # host hit: copy the K/V back
            self.hits += 1
            self.host_hits += 1
            self.host.load(entry.host_pages, handle.pages)
            self.host.free(entry.host_pages)
            entry.host_pages, entry.handle, handle.ready = None, handle, True
            return self._ref(entry), EncodeWork.NONE
        if entry is not None:  # warm hit: hidden states kept
            self.hits += 1
            entry.handle = handle
            return self._ref(entry), EncodeWork.PROJECT
        entry = EncoderCacheEntry(key=key, length=length, handle=handle)
        self._add(entry)
        return self._ref(entry), EncodeWork.ENCODE

    def release(self, entry: EncoderCacheEntry) -> None:
        assert entry.refs > 0, "encoder cache entry released more often than acquired"
        entry.refs -= 1
        if entry.refs == 0 and entry.detached:  # the last reader of a merged-away copy
            self.detached.remove(entry)
            self._free(entry)
        elif entry.refs == 0 and (not self.enabled or not entry.ready):
            self._drop(entry)  # no caching, or its K/V were never written (aborted)
        else:
            self._sync(entry)

    def keep_hidden(self, entry: EncoderCacheEntry, hidden: torch.Tensor) -> None:
        """Offer an entry's encoder output to the warm tier (kept if the budget allows)."""
        size = hidden.numel() * hidden.element_size()
        if not self.enabled or entry.detached or entry.hidden is not None or \
                size > self.hidden_budget_bytes:
            return
        while self.hidden_bytes + size > self.hidden_budget_bytes and self.idle_hidden:
            self._drop_hidden(next(iter(self.idle_hidden)))  # least recently released first
        if self.hidden_bytes + size <= self.hidden_budget_bytes:
            entry.hidden = hidden
            self.hidden_bytes += size
            self._sync(entry)

    def _ref(self, entry: EncoderCacheEntry) -> EncoderCacheEntry:
        entry.refs += 1
        self.entries.move_to_end(entry.key)
        self._sync(entry)
        return entry

    def _sync(self, entry: EncoderCacheEntry) -> None:
        """Put `entry` in (or take it out of) the idle sets its state calls for; an entry
        already in one keeps its place."""
        idle = entry.refs == 0 and not entry.detached and self.entries.get(entry.key) is entry
        if idle and entry.handle is not None:
            if entry not in self.idle_hot:
                self.idle_hot[entry] = len(entry.handle.pages)
                self.idle_hot_pages += self.idle_hot[entry]
        else:
            self._not_idle_hot(entry)
        if idle and entry.hidden is not None:
            self.idle_hidden.setdefault(entry)
        else:
            self.idle_hidden.pop(entry, None)

    def _not_idle_hot(self, entry: EncoderCacheEntry) -> None:
        self.idle_hot_pages -= self.idle_hot.pop(entry, 0)

    # --- shared isolation --------------------------------------------------------------------
    def _scoped(self, digest: str, user: str) -> tuple[str | None, str]:
        """Count `user` on the input; the key of the entry they may use (public or theirs)."""
        content = self.contents.setdefault(digest, _Content())
        if not self.sharing.touch(content.usage, user):
            return (user, digest)
        if content.scopes and PUBLIC not in content.scopes:
            self._promote(digest, content)
        return (PUBLIC, digest)

    def cached(self, key: tuple[str, str], user: str | None = None) -> bool:
        """Whether an entry `user` may use exists (nothing counted)."""
        if self.sharing is None or not self.enabled:
            return key in self.entries
        return (PUBLIC, key[1]) in self.entries or (user or ANONYMOUS, key[1]) in self.entries

    def _promote(self, digest: str, content: _Content) -> None:
        """Merge every private entry of one input into one public entry (the one furthest
        along: K/V on the device, then on the host, then hidden states)."""
        copies = [self.entries[(s, digest)] for s in content.scopes]
        keep = max(copies, key=lambda e: (e.ready, e.handle is not None,
                                          e.host_pages is not None, e.hidden is not None))
        for e in copies:
            if e is keep:
                continue
            if keep.hidden is None and e.hidden is not None:
                keep.hidden, e.hidden = e.hidden, None  # (its bytes stay counted)
            if keep.embedding is None:
                keep.embedding = e.embedding
            self._forget(e)
            self.sharing.merged_pages += (len(e.handle.pages) if e.handle else 0) + \
                len(e.host_pages or ())
            if e.refs:
                e.detached = True
                self.detached.append(e)
            else:
                self._free(e)
        del self.entries[keep.key]  # re-keyed in place: the content keeps its counters
        keep.key = (PUBLIC, digest)
        self.entries[keep.key] = keep
        self._sync(keep)
        content.scopes = {PUBLIC}
        self.sharing.promotions += 1

    def _add(self, entry: EncoderCacheEntry) -> None:
        self.entries[entry.key] = entry
        if self.sharing is not None:
            self.contents.setdefault(entry.key[1], _Content()).scopes.add(entry.key[0])

    def _forget(self, entry: EncoderCacheEntry) -> None:
        """Take an entry out of the index (what it holds is the caller's to free or keep)."""
        self._not_idle_hot(entry)
        self.idle_hidden.pop(entry, None)
        if self.entries.get(entry.key) is entry:
            del self.entries[entry.key]
            content = self.contents.get(entry.key[1])
            if content is not None:
                content.scopes.discard(entry.key[0])
                if not content.scopes:
                    del self.contents[entry.key[1]]

    # --- eviction ----------------------------------------------------------------------------
    def _make_room(self, pages: int, keep: EncoderCacheEntry | None = None) -> bool:
        """Evict unreferenced entries' K/V (least recently released first; under shared
        isolation fewest users and hits first) until `pages` are free; with a host tier they move
        there. `keep`'s host copy stays. Nothing is evicted when even all of them would not
        make room."""
        if self.pool.allocator.num_free >= pages:
            return True
        if self.pool.allocator.num_free + self.idle_hot_pages < pages:
            return False
        order = list(self.idle_hot)  # least recently released first
        if self.sharing is not None:  # (a stable sort: released order among equals)
            order.sort(key=lambda e: self.sharing.priority(self.contents[e.key[1]].usage))
        for entry in order:
            if self.pool.allocator.num_free >= pages:
                break
            if entry.ready and self.host is not None:
                self._store(entry, keep)
            self.pool.free(entry.handle)
            entry.handle = None
            self.evictions += 1
            self._sync(entry)
            self._forget_if_empty(entry)
        return self.pool.allocator.num_free >= pages

    def _store(self, entry: EncoderCacheEntry, keep: EncoderCacheEntry | None) -> None:
        """Copy an entry's K/V to the host tier, dropping older host copies to make room."""
        n = len(entry.handle.pages)
        victims, free = [], self.host.allocator.num_free
        for other in self.entries.values():  # least recently used first
            if free >= n:
                break
            if other.host_pages is not None and other is not keep:
                victims.append(other)
                free += len(other.host_pages)
        for other in victims:
            self.host.free(other.host_pages)
            other.host_pages = None
            self._forget_if_empty(other)
        pages = self.host.allocator.alloc(n)
        if pages is not None:
            self.host.store(entry.handle.pages, pages)
            entry.host_pages = pages
            self.host_stores += 1

    def flush(self) -> int:
        """Drop every entry nobody references; returns how many."""
        unused = [e for e in self.entries.values() if e.refs == 0]
        for e in unused:
            self._drop(e)
        return len(unused)

    def _forget_if_empty(self, entry: EncoderCacheEntry) -> None:
        if entry.handle is None and entry.hidden is None and entry.host_pages is None:
            self._forget(entry)

    def _drop(self, entry: EncoderCacheEntry) -> None:
        self._forget(entry)
        self._free(entry)

    def _free(self, entry: EncoderCacheEntry) -> None:
        if entry.handle is not None:
            self.pool.free(entry.handle)
            entry.handle = None
        if entry.host_pages is not None:
            self.host.free(entry.host_pages)
            entry.host_pages = None
        self._drop_hidden(entry)

    def _drop_hidden(self, entry: EncoderCacheEntry) -> None:
        if entry.hidden is not None:
            self.hidden_bytes -= entry.hidden.numel() * entry.hidden.element_size()
            entry.hidden = None
            self.idle_hidden.pop(entry, None)
            self._forget_if_empty(entry)

    # --- accounting --------------------------------------------------------------------------
    def all_entries(self) -> list[EncoderCacheEntry]:
        """Indexed and detached entries: everything that may hold pages or references."""
        return [*self.entries.values(), *self.detached]

    def owned_pages(self) -> list[int]:
        return list(itertools.chain.from_iterable(
            e.handle.pages for e in self.all_entries() if e.handle is not None))

    def host_pages(self) -> list[int]:
        return [p for e in self.entries.values() for p in e.host_pages or ()]

    def stats(self) -> dict[str, float]:
        hot = [e for e in self.entries.values() if e.handle is not None]
        out = {"encoder_cache_entries": len(self.entries),
               "encoder_cache_hot_tokens": sum(e.length for e in hot),
               "encoder_cache_hidden_bytes": self.hidden_bytes,
               "encoder_cache_lookups": self.lookups, "encoder_cache_hits": self.hits,
               "encoder_cache_evictions": self.evictions}
        if self.sharing is not None:
            public = sum(e.public for e in self.entries.values())
            out.update(encoder_cache_public_entries=public,
                       encoder_cache_private_entries=len(self.entries) - public,
                       encoder_cache_promotions=self.sharing.promotions,
                       encoder_cache_merged_tokens=self.sharing.merged_pages * self.pool.page_size)
        if self.host is not None:
            out.update(encoder_cache_host_tokens=len(self.host_pages()) * self.pool.page_size,
                       encoder_cache_host_stores=self.host_stores,
                       encoder_cache_host_hits=self.host_hits)
        return out
