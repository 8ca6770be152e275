"""RadixCache: decoder token prefixes whose K/V stay in the paged TokenToKVPool for reuse.

Keys are page-aligned token sequences inside a namespace: for models with cross-attention
the namespace starts with the encoder keys (a decoder prefix is only valid under the
same encoder output), and with the user when per-user isolation is on.

A node holds its tokens' K/V as copies by owner: one public copy (owner `PUBLIC`), or, under
`--cache-isolation shared` (a `SharingRule`), private copies of the users who sent those
tokens. A request sees a node's public copy or its own user's, nothing else. When enough
distinct users have sent a node's tokens within the window (counted on the node, whether or
not they could see it), the node is promoted: one copy becomes public and the other private
copies' pages are freed (merged). Every copy at a node is reachable only through a copy its
owner can see at the parent, so a path a user sees is always whole.

With a host tier (`HostKVPool`), a copy evicted from the device moves to host pages and comes
back on a later hit; the same owners and rules apply to it there.

Locking contract: `match_prefix` returns the deepest matching node; the caller must
`lock` it before the next eviction can run and `unlock` it exactly once when done. Locked
nodes (and their ancestors) are never evicted, and a locked node's copies merged away by a
promotion are freed only when its last reader unlocks it (logical free). The tree owns every
page it holds; `insert` adopts the caller's pages for the new part of a sequence and returns
the caller's pages that duplicate ones already in the tree, which the caller frees.
"""

from __future__ import annotations

import heapq
import itertools
import time

from seq2serve.runtime.memory.cache_sharing import ANONYMOUS, PUBLIC, SharingRule, UsageWindow
from seq2serve.runtime.memory.host_kv_pool import HostKVPool
from seq2serve.runtime.memory.page_allocator import PageAllocator
from seq2serve.runtime.scheduler.radix_node import (
    MISSING,
    Namespace,
    Owner,
    PrefixMatch,
    RadixNode,
    common_pages,
    needed_below,
)


class RadixCache:
    def __init__(self, allocator: PageAllocator, page_size: int, enabled: bool,
                 sharing: SharingRule | None = None, host: HostKVPool | None = None) -> None:
        self.allocator = allocator
        self.page_size = page_size
        self.enabled = enabled
        self.sharing = sharing
        self.host = host if enabled else None
        self.roots: dict[Namespace, RadixNode] = {}
        self.matched_tokens = self.queried_tokens = 0
        self.evicted_pages = 0
        self.host_stored_pages = self.host_loaded_pages = 0

    def _root(self, ns: Namespace) -> RadixNode:
        if ns not in self.roots:
            self.roots[ns] = RadixNode(namespace=ns)
        return self.roots[ns]

    def _drop_if_empty(self, node: RadixNode | None) -> None:
        """Forget a namespace's root once nothing is cached under it and no request holds it:
        every distinct source is a namespace, so a server would otherwise keep one root per
        source it ever saw."""
        if node is not None and node.parent is None and not node.children and \
                node.lock_ref == 0 and self.roots.get(node.namespace) is node:
            del self.roots[node.namespace]

    def _owner(self, user: str | None) -> Owner:
        return PUBLIC if self.sharing is None else (user or ANONYMOUS)

    # --- lookups -----------------------------------------------------------------------------
    def match_prefix(self, ns: Namespace, tokens: list[int],
                     user: str | None = None) -> PrefixMatch:
        """The device pages of the longest cached page-aligned prefix of `tokens` that `user`
        may see, and its node. Under shared isolation the walk goes on past what the user sees,
        counting the user on every node whose tokens they sent (and promoting those that
        qualify). Copies on the host tier are loaded back when the device has room."""
        owner = self._owner(user)
        node = self._root(ns)
        found = PrefixMatch([], node)
        ps = self.page_size
        n = len(tokens) // ps * ps
        self.queried_tokens += len(tokens)
        if not self.enabled:
            return found
        pos, seen, now = 0, True, time.monotonic()
        while pos < n:
            child = node.children.get(tuple(tokens[pos:pos + ps]))
            if child is None:
                break
            common = common_pages(child.tokens, tokens[pos:n], ps)
            if common < len(child.tokens) // ps:
                child = self._split(child, common)
            pos += len(child.tokens)
            node = child
            if self.sharing is not None:
                self._count(node, owner, hit=True)
            if seen:
                o = node.visible(owner)
                if o is not MISSING and o not in node.copies and not self._load(node, o, found):
                    o = MISSING
                if o is MISSING:
                    seen = False
                else:
                    found.pages += node.copies[o]
                    found.public_pages += len(node.copies[o]) if o is PUBLIC else 0
                    found.node, node.last_used = node, now
            if not seen and self.sharing is None:
                break
        self.matched_tokens += len(found.pages) * ps
        return found

    def lock(self, node: RadixNode) -> None:
        while node is not None:
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        while node is not None:
            assert node.lock_ref > 0, "radix node unlocked more often than locked"
            node.lock_ref -= 1
            if node.lock_ref == 0 and node.retired:  # the last reader of merged copies left
                for pages in node.retired:
                    self.allocator.free(pages)
                node.retired = []
            self._drop_if_empty(node)
            node = node.parent

    # --- inserting ---------------------------------------------------------------------------
    def insert(self, ns: Namespace, tokens: list[int], pages: list[int],
               user: str | None = None, cached_pages: int = 0) -> list[int]:
        """Cache `tokens` (page-aligned) stored in `pages`, as `user`'s. The first
        `cached_pages` pages came from this cache (`match_prefix`) and stay its own. Returns
        the caller's other pages the tree did not adopt (it already held those tokens); the
        caller frees them."""
        ps = self.page_size
        assert len(tokens) == len(pages) * ps
        if not self.enabled:
            return list(pages[cached_pages:])
        owner = self._owner(user)
        node, pos, duplicates, now = self._root(ns), 0, [], time.monotonic()
        while pos < len(tokens):
            key = tuple(tokens[pos:pos + ps])
            child = node.children.get(key)
            first = pos // ps
            if child is None:
                assert first >= cached_pages, "a cached prefix left the tree while locked"
                new = RadixNode(tokens=tuple(tokens[pos:]), copies={owner: list(pages[first:])},
                                parent=node)
                if self.sharing is not None:
                    new.usage = UsageWindow()
                    self._count(new, owner, hit=False)
                node.children[key] = new
                return duplicates
            common = common_pages(child.tokens, tokens[pos:], ps)
            if common < len(child.tokens) // ps:
                child = self._split(child, common)
            if self.sharing is not None:
                self._count(child, owner, hit=False)
            mine = pages[first:first + common]
            o = child.visible(owner)
            if o is MISSING:  # adopt the caller's pages as its copy
                assert first >= cached_pages, "a cached prefix left the tree while locked"
                child.copies[owner] = list(mine)
            elif o in child.copies:
                duplicates += [p for i, (p, q) in enumerate(zip(mine, child.copies[o]))
                               if p != q and first + i >= cached_pages]
            else:  # the tree's copy is on the host: the caller's device pages replace it
                assert first >= cached_pages
                self.host.free(child.host.pop(o))
                child.copies[o] = list(mine)
            child.last_used = now
            pos += common * ps
            node = child
        return duplicates

    def _split(self, node: RadixNode, pages: int) -> RadixNode:
        """Split `node` after its first `pages` pages; returns the new upper part."""
        ps = self.page_size
        upper = RadixNode(tokens=node.tokens[:pages * ps],
                          copies={o: p[:pages] for o, p in node.copies.items()},
                          host={o: p[:pages] for o, p in node.host.items()},
                          parent=node.parent, lock_ref=node.lock_ref, last_used=node.last_used,
                          usage=None if node.usage is None else node.usage.copy(),
                          retired=[p[:pages] for p in node.retired])
        upper.parent.children[upper.tokens[:ps]] = upper
        node.tokens, node.parent = node.tokens[pages * ps:], upper
        node.copies = {o: p[pages:] for o, p in node.copies.items()}
        node.host = {o: p[pages:] for o, p in node.host.items()}
        node.retired = [p[pages:] for p in node.retired]
        upper.children[node.tokens[:ps]] = node
        return upper

    # --- shared isolation --------------------------------------------------------------------
    def _count(self, node: RadixNode, owner: Owner, hit: bool) -> None:
        if node.usage is None:
            node.usage = UsageWindow()
        if self.sharing.touch(node.usage, owner, hit) and PUBLIC not in node.copies and \
                PUBLIC not in node.host:
            self._promote(node)

    def _promote(self, node: RadixNode) -> None:
        """Make `node` public: one copy (on the device if any is) stays, the others are freed,
        or retired until the last reader lets go. Only under a public parent: the path to a
        public node must be public."""
        parent = node.parent
        if parent.parent is not None and PUBLIC not in parent.copies and \
                PUBLIC not in parent.host:
            return
        if node.copies:
            keep = next(iter(node.copies))
            node.copies, rest = {PUBLIC: node.copies[keep]}, [
                p for o, p in node.copies.items() if o != keep]
            for pages in rest:
                if node.lock_ref:
                    node.retired.append(pages)
                else:
                    self.allocator.free(pages)
                self.sharing.merged_pages += len(pages)
            for pages in node.host.values():
                self.host.free(pages)
                self.sharing.merged_pages += len(pages)
            node.host = {}
        else:
            keep = next(iter(node.host))
            node.host, rest = {PUBLIC: node.host[keep]}, [
                p for o, p in node.host.items() if o != keep]
            for pages in rest:
                self.host.free(pages)
                self.sharing.merged_pages += len(pages)
        self.sharing.promotions += 1

    # --- eviction ----------------------------------------------------------------------------
    def evict(self, num_pages: int, to_host: bool = True) -> int:
        """Free up to `num_pages` device pages from unlocked copies that no deeper device copy
        reads through, lowest rank first (least recently used; under shared isolation, fewest
        users and hits over two windows first). With a host tier they move there.

        One walk of the tree per call: the candidates go on a heap, and a parent's copies
        join it when the eviction of its child's copy leaves nothing below reading through
        them (ranks do not change during a call, so the order is the old full rescan's)."""
        order = itertools.count()

        def candidates(node: RadixNode):
            if node.lock_ref == 0:
                for o in node.copies:
                    if not needed_below(node, o, host=False):
                        yield self._rank(node), next(order), node, o

        heap = [c for n in self._nodes() for c in candidates(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_pages and heap:
            _, _, node, owner = heapq.heappop(heap)
            if owner not in node.copies:
                continue  # (a copy is pushed once per child that freed it)
            pages = node.copies.pop(owner)
            if not (to_host and self.host is not None and self._store(node, owner, pages)):
                self._drop_host_below(node, owner)
            self.allocator.free(pages)
            freed += len(pages)
            self.evicted_pages += len(pages)
            parent = node.parent
            self._forget_if_empty(node)
            if parent is not None and parent.parent is not None:  # (roots hold no copies)
                for c in candidates(parent):
                    heapq.heappush(heap, c)
        return freed

    def _rank(self, node: RadixNode) -> tuple:
        if self.sharing is None:
            return (node.last_used,)
        return (*self.sharing.priority(node.usage), node.last_used)

    def _forget_if_empty(self, node: RadixNode) -> None:
        if not node.copies and not node.host and not node.children and node.lock_ref == 0:
            parent = node.parent
            del parent.children[node.tokens[:self.page_size]]
            self._drop_if_empty(parent)

    def evictable_pages(self) -> int:
        return sum(len(p) for n in self._nodes() if n.lock_ref == 0 for p in n.copies.values())

    def flush(self) -> int:
        """Free everything no request holds (both tiers); returns the device pages freed."""
        freed = self.evict(self.evictable_pages(), to_host=False)
        if self.host is not None:
            self._evict_host(self.host.allocator.num_pages)
        for root in list(self.roots.values()):
            self._drop_if_empty(root)
        return freed

    # --- host tier ---------------------------------------------------------------------------
    def _store(self, node: RadixNode, owner: Owner, pages: list[int]) -> bool:
        """Copy a copy's K/V to the host tier (making room there); False if it cannot fit."""
        if self.host.allocator.num_free < len(pages):
            self._evict_host(len(pages) - self.host.allocator.num_free, keep=node)
        host_pages = self.host.allocator.alloc(len(pages))
        if host_pages is None:
            return False
        self.host.store(pages, host_pages)
        node.host[owner] = host_pages
        self.host_stored_pages += len(pages)
        return True

    def _load(self, node: RadixNode, owner: Owner, found: PrefixMatch) -> bool:
        """Bring a host copy back to device pages (evicting others, never the path matched so
        far); False if the device has no room."""
        n = len(node.host[owner])
        if self.allocator.num_free < n:
            self.lock(node)  # (and the path above it)
            self.evict(n - self.allocator.num_free)
            self.unlock(node)
        pages = self.allocator.alloc(n)
        if pages is None:
            return False
        host_pages = node.host.pop(owner)
        self.host.load(host_pages, pages)
        self.host.free(host_pages)
        node.copies[owner] = pages
        self.host_loaded_pages += n
        return True

    def _evict_host(self, num_pages: int, keep: RadixNode | None = None) -> int:
        """Drop unlocked host copies nothing deeper reads through, lowest rank first."""
        freed = 0
        while freed < num_pages:
            victims = [(n, o) for n in self._nodes() if n is not keep and n.lock_ref == 0
                       for o in n.host if not needed_below(n, o, host=True)]
            if not victims:
                break
            node, owner = min(victims, key=lambda v: self._rank(v[0]))
            pages = node.host.pop(owner)
            self.host.free(pages)
            freed += len(pages)
            self._forget_if_empty(node)
        return freed

    def _drop_host_below(self, node: RadixNode, owner: Owner) -> None:
        """A copy left both tiers: drop the host copies below that read through it."""
        for child in list(node.children.values()):
            for o in list(child.host):
                if owner is PUBLIC or o == owner:
                    self._drop_host_below(child, o)
                    self.host.free(child.host.pop(o))
            self._forget_if_empty(child)

    # --- accounting --------------------------------------------------------------------------
    def _nodes(self):
        stack = [c for r in self.roots.values() for c in r.children.values()]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def owned_pages(self) -> list[int]:
        """Every device page the tree holds, merged copies not yet freed included."""
        return [p for n in self._nodes() for pages in (*n.copies.values(), *n.retired)
                for p in pages]

    def host_pages(self) -> list[int]:
        return [p for n in self._nodes() for pages in n.host.values() for p in pages]

    def stats(self) -> dict[str, float]:
        out = {"radix_cache_tokens": len(self.owned_pages()) * self.page_size,
               "radix_matched_tokens": self.matched_tokens,
               "radix_queried_tokens": self.queried_tokens,
               "radix_evicted_tokens": self.evicted_pages * self.page_size}
        if self.sharing is not None:
            public = private = 0
            for n in self._nodes():
                for o, pages in (*n.copies.items(), *n.host.items()):
                    public += len(pages) if o is PUBLIC else 0
                    private += 0 if o is PUBLIC else len(pages)
            out.update(radix_public_tokens=public * self.page_size,
                       radix_private_tokens=private * self.page_size,
                       radix_promotions=self.sharing.promotions,
                       radix_merged_tokens=self.sharing.merged_pages * self.page_size)
        if self.host is not None:
            out.update(radix_host_tokens=len(self.host_pages()) * self.page_size,
                       radix_host_stored_tokens=self.host_stored_pages * self.page_size,
                       radix_host_loaded_tokens=self.host_loaded_pages * self.page_size)
        return out
