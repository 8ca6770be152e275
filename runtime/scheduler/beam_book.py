"""The host's books of every running beam row, as arrays: its decoder pages and its generated
tokens, one array row per table row (`Req.req_pool_idx`).

A beam step moves rows: row j continues row p's sequence. In lists that is a copy of p's
tokens and page list for every moved row and a set difference for the pages no row holds any
more, per group, in Python (~10 us a row a step). Here one step of all groups is a few
array operations: a gather of the parents' token and page rows, and a count of the rows
holding each page (`refs`), whose zeros are the pages to free.

A beam row's `Req.output_ids` and `Req.kv_pages` are live views of its book rows
(`BookTokens`, `BookPages`), so what reads a row's tokens or pages (penalties, n-gram bans,
grammars, the memory checks) reads them as before; they become plain lists again when the
group leaves the book (finish, abort, retract).

Ownership: the book holds no pages of its own. A group's rows hold the pages in their
`pages` rows' columns [prefix_pages, npages); `refs[page]` counts the rows holding it (a
group's pages are its own: beams of different groups share none, and prefix pages belong to
the radix cache and are not counted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from seq2serve.runtime.scheduler.group_memo import GroupMemo

if TYPE_CHECKING:
    from seq2serve.runtime.scheduler.beam_search import BeamGroup


class BeamBook:
    def __init__(self, rows: int, num_pages: int, page_size: int) -> None:
        self.page_size = page_size
        self.pages = np.zeros((rows, 8), dtype=np.int64)  # [table row, page index] -> page id
        self.tokens = np.zeros((rows, 32), dtype=np.int64)  # [table row, step] -> token
        self.refs = np.zeros(num_pages + 1, dtype=np.int32)  # page id -> rows holding it
        self.version = 0  # counts the groups that entered or left (GroupMemo)
        self._rows = GroupMemo(_row_columns, self)
        self._prompts = GroupMemo(_prompt_columns, self)
        self._heads = GroupMemo(_head_columns, self)

    def _fit(self, pages: int = 0, tokens: int = 0) -> None:
        """Grow the arrays' columns (doubling) to hold `pages` pages and `tokens` tokens."""
        for name, need in (("pages", pages), ("tokens", tokens)):
            a = getattr(self, name)
            if need > a.shape[1]:
                b = np.zeros((a.shape[0], max(need, 2 * a.shape[1])), dtype=a.dtype)
                b[:, :a.shape[1]] = a
                setattr(self, name, b)

    # --- a group enters and leaves ----------------------------------------------------------
    def enter(self, group: BeamGroup, table_rows: list[int], pages: list[list[int]],
              tokens: list[int], prefix: int) -> None:
        """The group's rows (all of one length, `pages` each, `prefix` of them radix-owned)
        after its first step: row j generated `tokens[j]`."""
        self.enter_many([(group, table_rows, pages, tokens, prefix)])

    def enter_many(self, entries: list[tuple]) -> None:
        """`enter` for many groups, (group, table_rows, pages, tokens, prefix) each, in a few
        array operations (a wave of first steps enters hundreds at once)."""
        if not entries:
            return
        ns = [len(pages[0]) for _, _, pages, _, _ in entries]
        assert all(len(p) == n for (_, _, pages, _, _), n in zip(entries, ns) for p in pages), \
            "a group's rows hold equally many pages"
        width = max(ns)
        self._fit(pages=width, tokens=1)
        sizes = np.array([len(rows) for _, rows, _, _, _ in entries], dtype=np.int64)
        rows = np.fromiter((r for _, t, _, _, _ in entries for r in t), dtype=np.int64,
                           count=int(sizes.sum()))
        held = np.zeros((len(rows), width), dtype=np.int64)  # (columns past a group's n: 0)
        at = 0
        for (_, _, pages, _, _), n in zip(entries, ns):
            held[at:at + len(pages), :n] = pages
            at += len(pages)
        self.pages[rows, :width] = held
        self.tokens[rows, 0] = [t for _, _, _, tokens, _ in entries for t in tokens]
        group_of = np.repeat(np.arange(len(entries)), sizes)
        cols = np.arange(width)[None, :]
        first = np.array([prefix for *_, prefix in entries], dtype=np.int64)[group_of]
        last = np.array(ns, dtype=np.int64)[group_of]
        own = (cols >= first[:, None]) & (cols < last[:, None])
        flat = held[own]  # (row by row)
        np.add.at(self.refs, flat, 1)
        # each group's distinct own pages (different groups' own pages are distinct)
        _, firsts = np.unique(flat, return_index=True)
        counts = np.bincount(np.repeat(group_of, own.sum(1))[firsts], minlength=len(entries))
        start = np.cumsum(sizes) - sizes
        for (group, _, _, _, prefix), n, a, b, h in zip(entries, ns, start.tolist(),
                                                        (start + sizes).tolist(),
                                                        counts.tolist()):
            group.table_rows, group.npages, group.steps = rows[a:b], n, 1
            group.held = h
            group.peak_pages = max(group.peak_pages, prefix + h)
        self.version += 1

    def leave(self, group: BeamGroup, prefix: int) -> list[int]:
        """The group's pages past `prefix` (each once), which it no longer holds: the caller
        frees them."""
        own = np.unique(self.pages[group.table_rows, prefix:group.npages])
        self.refs[own] = 0
        group.table_rows = None
        self.version += 1
        return own.tolist()

    # --- each step ---------------------------------------------------------------------------
    def rows_of(self, groups: list[BeamGroup]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each group's row count, their table rows (group by group) and each row's group
        index (the same arrays as the step before while the groups are the same)."""
        return self._rows(groups)

    def prompts_of(self, groups: list[BeamGroup]) -> tuple[np.ndarray, np.ndarray]:
        """Each group's decoder prompt length and radix-owned pages (fixed while it is in the
        book; the same arrays as the step before while the groups are the same)."""
        return self._prompts(groups)

    def forget(self) -> None:
        """Let go of the groups the memos keep (no group runs)."""
        for memo in (self._rows, self._prompts, self._heads):
            memo.clear()

    def heads_of(self, groups: list[BeamGroup]) -> tuple[np.ndarray, bool]:
        """Each group's encoder length, and whether any group reads cross ranges (fixed for
        a request's life; the same arrays as the step before while the groups are the
        same)."""
        return self._heads(groups)

    def grow(self, groups: list[BeamGroup], new_pages: list[int]) -> None:
        """A page more for every row of `groups` (each at a page boundary), from `new_pages`
        (in row order)."""
        self._fit(pages=max(g.npages for g in groups) + 1)
        rows = np.concatenate([g.table_rows for g in groups])
        cols = np.concatenate([np.full(len(g.table_rows), g.npages) for g in groups])
        new = np.array(new_pages, dtype=np.int64)
        self.pages[rows, cols] = new
        self.refs[new] = 1
        for g in groups:
            g.npages += 1
            g.held += len(g.table_rows)

    def slots(self, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The KV slot of each (table row, decoder position)."""
        ps = self.page_size
        return self.pages[rows, positions // ps] * ps + positions % ps

    def follow(self, groups: list[BeamGroup], parents: np.ndarray, tokens: np.ndarray,
               lengths: np.ndarray, prefix: np.ndarray) -> list[int]:
        """One step of `groups` (the device has made it: `move_pages`): their rows, in order,
        continue rows `parents` (indices into the same concatenation of the groups' rows) with
        `tokens`, after `lengths[g]` decoder positions written (`prefix[g]` pages radix-owned).
        A moved row takes its parent's tokens and full pages and keeps its own last pages (the
        one the device copied the parent's partial page into, and any the next step's launch
        has added). Returns the pages no row holds any more (the caller frees them)."""
        sizes, rows, group_of = self.rows_of(groups)
        src = rows[parents]
        steps = np.array([g.steps for g in groups], dtype=np.int64)
        self._fit(tokens=int(steps.max()) + 1)
        freed: list[int] = []
        moved = np.flatnonzero(src != rows)
        if moved.size:
            which = group_of[moved]  # each moved row's group
            dst, src_m = rows[moved], src[moved]
            # (a row's columns past its group's steps are never read before this step or a
            # later one writes them: the parents' whole rows up to the longest are copied)
            w = int(steps[which].max())
            self.tokens[dst, :w] = self.tokens[src_m, :w]
            full = (lengths // self.page_size)[which]
            pre = prefix[which]
            w = int(full.max())
            if w:
                col = np.arange(w)[None, :]
                shared = col < full[:, None]
                old, new = self.pages[dst, :w], self.pages[src_m, :w]
                # the counted columns (past the radix-owned prefix) whose page changes: a
                # row's first pages are mostly its parent's already (beams share their past)
                own = shared & (col >= pre[:, None]) & (old != new)
                np.add.at(self.refs, old[own], -1)
                np.add.at(self.refs, new[own], 1)
                self.pages[dst, :w] = np.where(shared, new, old)
                gone = old[own]
                dead = self.refs[gone] == 0
                if dead.any():
                    pages, first = np.unique(gone[dead], return_index=True)
                    owner = np.broadcast_to(which[:, None], old.shape)[own][dead][first]
                    lost = np.bincount(owner, minlength=len(groups))
                    for g, k in zip(groups, lost.tolist()):
                        g.held -= k
                    freed = pages.tolist()
        self.tokens[rows, np.repeat(steps, sizes)] = tokens
        for g, pre_g in zip(groups, prefix.tolist()):
            g.steps += 1
            g.peak_pages = max(g.peak_pages, pre_g + g.held)
        return freed

    # --- integrity ---------------------------------------------------------------------------
    def owned(self, group: BeamGroup, prefix: int) -> list[int]:
        """The group's pages past `prefix`, each once; raises AssertionError where `refs`
        disagrees with the rows holding them."""
        held = self.pages[group.table_rows, prefix:group.npages].ravel()
        pages, counts = np.unique(held, return_counts=True)
        if not np.array_equal(self.refs[pages], counts):
            raise AssertionError("beam book: a page's row count differs from its holders")
        if len(pages) != group.held:
            raise AssertionError(f"beam book: the group holds {len(pages)} pages, its count "
                                 f"says {group.held}")
        return pages.tolist()


class _BookRow(Sequence):
    """A read-only view of one table row of a book array, as long as its group says."""

    __slots__ = ("book", "row", "group")

    def __init__(self, book: BeamBook, row: int, group: BeamGroup) -> None:
        self.book, self.row, self.group = book, row, group

    def _array(self) -> np.ndarray:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def tolist(self) -> list[int]:
        return self._array()[self.row, :len(self)].tolist()

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.tolist()[i]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        return int(self._array()[self.row, i % n])

    def __iter__(self):
        return iter(self.tolist())

    def __add__(self, other) -> list[int]:
        return self.tolist() + list(other)

    def __radd__(self, other) -> list[int]:
        return list(other) + self.tolist()

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and self.tolist() == list(other)

    __hash__ = None  # (a mutable view)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.tolist()})"


class BookTokens(_BookRow):
    """A beam row's generated tokens (`Req.output_ids` while its group is in the book)."""

    __slots__ = ()

    def _array(self) -> np.ndarray:
        return self.book.tokens

    def __len__(self) -> int:
        return self.group.steps


class BookPages(_BookRow):
    """A beam row's decoder pages (`Req.kv_pages` while its group is in the book)."""

    __slots__ = ()

    def _array(self) -> np.ndarray:
        return self.book.pages

    def __len__(self) -> int:
        return self.group.npages


def _row_columns(groups: list[BeamGroup]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sizes = np.array([len(g.table_rows) for g in groups], dtype=np.int64)
    return (sizes, np.concatenate([g.table_rows for g in groups]),
            np.repeat(np.arange(len(groups)), sizes))


def _prompt_columns(groups: list[BeamGroup]) -> tuple[np.ndarray, np.ndarray]:
    heads = [g.rows[0] for g in groups]
    return (np.array([len(h.decoder_input_ids) for h in heads], dtype=np.int64),
            np.array([h.prefix_pages for h in heads], dtype=np.int64))


def _head_columns(groups: list[BeamGroup]) -> tuple[np.ndarray, bool]:
    heads = [g.rows[0] for g in groups]
    return (np.array([h.encoder_len for h in heads], dtype=np.int64),
            any(h.cross_spans is not None for h in heads))
