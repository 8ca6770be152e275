"""A radix cache node (its copies by owner, on the device and the host) and a lookup's result.
The tree's rules are `radix_cache.py`'s."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from seq2serve.runtime.memory.cache_sharing import PUBLIC, UsageWindow

Namespace = tuple
Owner = str | None  # PUBLIC (None) or a user id
MISSING = object()  # `visible`: no copy this owner may read


@dataclass(eq=False)
class RadixNode:
    tokens: tuple[int, ...] = ()  # a multiple of page_size tokens
    copies: dict[Owner, list[int]] = field(default_factory=dict)  # owner -> device pages
    host: dict[Owner, list[int]] = field(default_factory=dict)  # owner -> host-tier pages
    parent: RadixNode | None = None
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)  # by first page
    lock_ref: int = 0
    last_used: float = field(default_factory=time.monotonic)
    namespace: Namespace | None = None  # set on roots only
    usage: UsageWindow | None = None  # shared isolation: hits and users per window
    retired: list[list[int]] = field(default_factory=list)  # merged copies still being read

    @property
    def pages(self) -> list[int]:
        """The public device copy (the only copy without shared isolation)."""
        return self.copies.get(PUBLIC, [])

    def visible(self, owner: Owner):
        """Which copy `owner` reads here (PUBLIC or owner), or MISSING."""
        for o in (PUBLIC, owner):
            if o in self.copies or o in self.host:
                return o
        return MISSING


@dataclass
class PrefixMatch:
    pages: list[int]  # device pages of the matched prefix, in order
    node: RadixNode  # the deepest matched node (to lock)
    public_pages: int = 0  # how many of `pages` came from public copies


def needed_below(node: RadixNode, owner: Owner, host: bool) -> bool:
    """Does a deeper copy read through `owner`'s copy at `node`? A device copy is needed by
    device copies below it (host ones stay reachable once it moves to the host); a host copy
    by any copy below it."""
    for c in node.children.values():
        for o in (*c.copies, *(c.host if host else ())):
            if owner is PUBLIC or o == owner:
                return True
    return False


def common_pages(a: tuple[int, ...], b: list[int], ps: int) -> int:
    """How many leading whole pages two token sequences share."""
    n = 0
    limit = min(len(a), len(b)) // ps
    while n < limit and tuple(a[n * ps:(n + 1) * ps]) == tuple(b[n * ps:(n + 1) * ps]):
        n += 1
    return n
