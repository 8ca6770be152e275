"""Hands out page ids. Knows nothing of tensors, so it is trivially checkable."""

from __future__ import annotations


class PageAllocator:
    """A free list of page ids in [first_page, first_page + num_pages).

    Ownership contract: a page id returned by `alloc` belongs to the caller until it passes it
    to `free` exactly once. Freeing an id that is not allocated is an internal error.
    """

    def __init__(self, num_pages: int, first_page: int = 0) -> None:
        self.num_pages = num_pages
        self.first_page = first_page
        # popping from the end hands out low ids first, which keeps early allocations compact
        self._free = list(range(first_page + num_pages - 1, first_page - 1, -1))
        self._in_use = bytearray(num_pages)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        """Return n page ids, or None (and allocate nothing) when fewer than n are free."""
        if n > len(self._free):
            return None
        if n == 0:
            return []
        pages = self._free[-n:]
        del self._free[-n:]
        for p in pages:
            self._in_use[p - self.first_page] = 1
        return pages

    def free(self, pages: list[int]) -> None:
        for p in pages:
            i = p - self.first_page
            assert 0 <= i < self.num_pages and self._in_use[i], f"page {p} freed but not in use"
            self._in_use[i] = 0
        self._free.extend(pages)

    def check(self, owned: list[int]) -> None:
        """Raise if `owned` (every page the callers hold) and the free list don't partition."""
        seen = bytearray(self.num_pages)
        for p in self._free:
            i = p - self.first_page
            if seen[i]:
                raise AssertionError(f"page {p} is on the free list twice")
            seen[i] = 1
        for p in owned:
            i = p - self.first_page
            if seen[i]:
                raise AssertionError(f"page {p} is both free and owned, or owned twice")
            seen[i] = 1
        if sum(seen) != self.num_pages:
            lost = [self.first_page + i for i, s in enumerate(seen) if not s][:8]
            raise AssertionError(f"{self.num_pages - sum(seen)} page(s) leaked, e.g. {lost}")
