"""EncoderCache: an encoder's output as a first-class cached object.

An entry is keyed by (namespace, content hash of the encoder input) and has two tiers:
- hot: its cross-attention K/V in CrossKVPool pages, which requests read directly (no copy);
- warm: the encoder's hidden states, much smaller, kept after the K/V are evicted while the
  hidden-state budget allows, so a later hit costs one K/V projection per cross layer
  instead of an encoder pass.

Ownership and locking contract: the cache owns every entry's pages and hidden states.
`acquire` returns an entry with a reference held for the caller; the caller passes it to
`release` exactly once. Entries with references are never evicted. Without caching
(`enabled=False`) an entry is dropped as soon as its last reference is released.
"""

from __future__ import annotations

import enum
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from seq2serve.cross_attention.cross_kv_pool import CrossKVHandle, CrossKVPool
from seq2serve.encoders.encoder_input import EncoderSegment


class EncodeWork(enum.Enum):
    NONE = "none"  # K/V are (or are being) written: nothing to do
    ENCODE = "encode"  # run the encoder, then project to K/V
    PROJECT = "project"  # hidden states are cached: only project to K/V


@dataclass(eq=False)
class EncoderCacheEntry:
    key: tuple[str, str]  # (namespace, content hash)
    length: int  # cross K/V tokens
    handle: CrossKVHandle | None = None  # hot tier
    hidden: torch.Tensor | None = field(default=None, repr=False)  # warm tier
    refs: int = 0

    @property
    def ready(self) -> bool:
        return self.handle is not None and self.handle.ready


@dataclass
class EncoderJob:
    """Cross K/V the encoder stage must still write for one cache entry."""

    entry: EncoderCacheEntry
    work: EncodeWork
    segment: EncoderSegment


class EncoderCache:
    def __init__(self, pool: CrossKVPool, enabled: bool, hidden_budget_bytes: int) -> None:
        self.pool = pool
        self.enabled = enabled
        self.hidden_budget_bytes = hidden_budget_bytes if enabled else 0
        self.entries: OrderedDict[tuple[str, str], EncoderCacheEntry] = OrderedDict()  # LRU
        self.hidden_bytes = 0
        self.lookups = self.hits = self.evictions = 0

    # --- acquiring and releasing -------------------------------------------------------------
    def acquire(self, key: tuple[str, str], length: int) -> tuple[EncoderCacheEntry,
                                                                  EncodeWork] | None:
        """A referenced entry for `key` and the work still needed to fill its K/V; None (and
        nothing held) if the pool cannot make room even after evicting unused entries."""
        self.lookups += 1
        entry = self.entries.get(key)
        if entry is not None and entry.handle is not None:
            self.hits += 1
            return self._ref(entry), EncodeWork.NONE
        if not self._make_room(self.pool.pages_for(length)):
            return None
        handle = self.pool.alloc(length)
        if entry is not None:  # warm hit: hidden states kept
            self.hits += 1
            entry.handle = handle
            return self._ref(entry), EncodeWork.PROJECT
        entry = EncoderCacheEntry(key=key, length=length, handle=handle)
        self.entries[key] = entry
        return self._ref(entry), EncodeWork.ENCODE

    def release(self, entry: EncoderCacheEntry) -> None:
        assert entry.refs > 0, "encoder cache entry released more often than acquired"
        entry.refs -= 1
        if entry.refs == 0 and (not self.enabled or not entry.ready):
            self._drop(entry)  # no caching, or its K/V were never written (aborted)

    def keep_hidden(self, entry: EncoderCacheEntry, hidden: torch.Tensor) -> None:
        """Offer an entry's encoder output to the warm tier (kept if the budget allows)."""
        size = hidden.numel() * hidden.element_size()
        if not self.enabled or entry.hidden is not None or size > self.hidden_budget_bytes:
            return
        for other in list(self.entries.values()):  # least recently used first
            if self.hidden_bytes + size <= self.hidden_budget_bytes:
                break
            if other.hidden is not None and other is not entry and other.refs == 0:
                self._drop_hidden(other)
        if self.hidden_bytes + size <= self.hidden_budget_bytes:
            entry.hidden = hidden
            self.hidden_bytes += size

    def _ref(self, entry: EncoderCacheEntry) -> EncoderCacheEntry:
        entry.refs += 1
        self.entries.move_to_end(entry.key)
        return entry

    # --- eviction ----------------------------------------------------------------------------
    def _make_room(self, pages: int) -> bool:
        """Evict unreferenced entries' K/V (least recently used first) until `pages` are free."""
        for entry in list(self.entries.values()):
            if self.pool.allocator.num_free >= pages:
                break
            if entry.refs == 0 and entry.handle is not None:
                self.pool.free(entry.handle)
                entry.handle = None
                self.evictions += 1
                if entry.hidden is None:
                    del self.entries[entry.key]
        return self.pool.allocator.num_free >= pages

    def flush(self) -> int:
        """Drop every entry nobody references; returns how many."""
        unused = [e for e in self.entries.values() if e.refs == 0]
        for e in unused:
            self._drop(e)
        return len(unused)

    def _drop(self, entry: EncoderCacheEntry) -> None:
        if entry.handle is not None:
            self.pool.free(entry.handle)
            entry.handle = None
        self._drop_hidden(entry)
        self.entries.pop(entry.key, None)

    def _drop_hidden(self, entry: EncoderCacheEntry) -> None:
        if entry.hidden is not None:
            self.hidden_bytes -= entry.hidden.numel() * entry.hidden.element_size()
            entry.hidden = None
            if entry.handle is None:
                self.entries.pop(entry.key, None)

    # --- accounting --------------------------------------------------------------------------
    def owned_pages(self) -> list[int]:
        return list(itertools.chain.from_iterable(
            e.handle.pages for e in self.entries.values() if e.handle is not None))

    def stats(self) -> dict[str, float]:
        hot = [e for e in self.entries.values() if e.handle is not None]
        return {"encoder_cache_entries": len(self.entries),
                "encoder_cache_hot_tokens": sum(e.length for e in hot),
                "encoder_cache_hidden_bytes": self.hidden_bytes,
                "encoder_cache_lookups": self.lookups, "encoder_cache_hits": self.hits,
                "encoder_cache_evictions": self.evictions}
