"""RadixCache: decoder token prefixes whose K/V stay in the paged TokenToKVPool for reuse.

Keys are page-aligned token sequences inside a namespace: for models with cross-attention
the namespace starts with the encoder keys (a decoder prefix is only valid under the
same encoder output), and with the user when per-user isolation is on.

Locking contract: `match_prefix` returns the deepest matching node; the caller must
`lock` it before the next eviction can run and `unlock` it exactly once when done. Locked
nodes (and their ancestors) are never evicted. The tree owns every page it holds; `insert`
adopts the caller's pages for the new part of a sequence and returns the caller's pages that
duplicate ones already in the tree, which the caller frees.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from seq2serve.runtime.memory.page_allocator import PageAllocator

Namespace = tuple


@dataclass(eq=False)
class RadixNode:
    tokens: tuple[int, ...] = ()  # a multiple of page_size tokens
    pages: list[int] = field(default_factory=list)  # one page per page_size tokens
    parent: RadixNode | None = None
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)  # by first page
    lock_ref: int = 0
    last_used: float = field(default_factory=time.monotonic)
    namespace: Namespace | None = None  # set on roots only


class RadixCache:
    def __init__(self, allocator: PageAllocator, page_size: int, enabled: bool) -> None:
        self.allocator = allocator
        self.page_size = page_size
        self.enabled = enabled
        self.roots: dict[Namespace, RadixNode] = {}
        self.matched_tokens = self.queried_tokens = 0
        self.evicted_pages = 0

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

    # --- lookups -----------------------------------------------------------------------------
    def match_prefix(self, ns: Namespace, tokens: list[int]) -> tuple[list[int], RadixNode]:
        """The pages of the longest cached page-aligned prefix of `tokens`, and its node."""
        node = self._root(ns)
        pages: list[int] = []
        ps = self.page_size
        n = len(tokens) // ps * ps
        self.queried_tokens += len(tokens)
        if not self.enabled:
            return pages, node
        pos = 0
        while pos < n:
            child = node.children.get(tuple(tokens[pos:pos + ps]))
            if child is None:
                break
            common = _common_pages(child.tokens, tokens[pos:n], ps)
            if common < len(child.pages):
                child = self._split(child, common)
            pages += child.pages
            pos += len(child.tokens)
            node = child
            node.last_used = time.monotonic()
        self.matched_tokens += len(pages) * ps
        return pages, node

    def lock(self, node: RadixNode) -> None:
        while node is not None:
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        while node is not None:
            assert node.lock_ref > 0, "radix node unlocked more often than locked"
            node.lock_ref -= 1
            self._drop_if_empty(node)
            node = node.parent

    # --- inserting ---------------------------------------------------------------------------
    def insert(self, ns: Namespace, tokens: list[int], pages: list[int]) -> list[int]:
        """Cache `tokens` (page-aligned) stored in `pages`. Returns the caller's pages the tree
        did not adopt (it already held those tokens); the caller frees them."""
        ps = self.page_size
        assert len(tokens) == len(pages) * ps
        if not self.enabled:
            return list(pages)
        node, pos, duplicates = self._root(ns), 0, []
        while pos < len(tokens):
            key = tuple(tokens[pos:pos + ps])
            child = node.children.get(key)
            if child is None:
                new = RadixNode(tokens=tuple(tokens[pos:]), pages=list(pages[pos // ps:]),
                                parent=node)
                node.children[key] = new
                return duplicates
            common = _common_pages(child.tokens, tokens[pos:], ps)
            if common < len(child.pages):
                child = self._split(child, common)
            mine = pages[pos // ps: pos // ps + common]
            duplicates += [p for p, q in zip(mine, child.pages) if p != q]
            child.last_used = time.monotonic()
            pos += common * ps
            node = child
        return duplicates

    def _split(self, node: RadixNode, pages: int) -> RadixNode:
        """Split `node` after its first `pages` pages; returns the new upper part."""
        ps = self.page_size
        upper = RadixNode(tokens=node.tokens[:pages * ps], pages=node.pages[:pages],
                          parent=node.parent, lock_ref=node.lock_ref, last_used=node.last_used)
        upper.parent.children[upper.tokens[:ps]] = upper
        node.tokens, node.pages, node.parent = node.tokens[pages * ps:], node.pages[pages:], upper
        upper.children[node.tokens[:ps]] = node
        return upper

    # --- eviction ----------------------------------------------------------------------------
    def evict(self, num_pages: int) -> int:
        """Free up to `num_pages` pages from unlocked leaves, least recently used first."""
        freed = 0
        while freed < num_pages:
            leaves = [n for n in self._nodes() if not n.children and n.lock_ref == 0]
            if not leaves:
                break
            leaf = min(leaves, key=lambda n: n.last_used)
            self.allocator.free(leaf.pages)
            freed += len(leaf.pages)
            self.evicted_pages += len(leaf.pages)
            del leaf.parent.children[leaf.tokens[:self.page_size]]
            self._drop_if_empty(leaf.parent)
        return freed

    def evictable_pages(self) -> int:
        return sum(len(n.pages) for n in self._nodes() if n.lock_ref == 0)

    def flush(self) -> int:
        """Free everything no request holds; returns the pages freed."""
        freed = self.evict(self.evictable_pages())
        for root in list(self.roots.values()):
            self._drop_if_empty(root)
        return freed

    def _nodes(self):
        stack = [c for r in self.roots.values() for c in r.children.values()]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def owned_pages(self) -> list[int]:
        return [p for n in self._nodes() for p in n.pages]

    def stats(self) -> dict[str, float]:
        return {"radix_cache_tokens": len(self.owned_pages()) * self.page_size,
                "radix_matched_tokens": self.matched_tokens,
                "radix_queried_tokens": self.queried_tokens,
                "radix_evicted_tokens": self.evicted_pages * self.page_size}


def _common_pages(a: tuple[int, ...], b: list[int], ps: int) -> int:
    """How many leading whole pages two token sequences share."""
    n = 0
    limit = min(len(a), len(b)) // ps
    while n < limit and tuple(a[n * ps:(n + 1) * ps]) == tuple(b[n * ps:(n + 1) * ps]):
        n += 1
    return n
