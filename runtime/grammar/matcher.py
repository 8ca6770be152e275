"""`RowGrammar`: one decoder row's place in its grammar, owned by the scheduler's request,
whichever backend made it (`xgr_row.py`, `llg_row.py`).

Each step the host fills the row's line of the batch's token bitmask (bit t of word t // 32:
token t allowed; both backends' layout) before the sampler runs, and after the step is read
the row accepts its token. The request's stop tokens are allowed exactly where the grammar
accepts the output; accepting one terminates the row. A beam row that continues another
row's sequence takes a copy of that row's state (`fork`). A step's rows are filled together
(`fill_rows`: each backend's batch filler, on `FILL_THREADS` threads).

A row is dead once it accepted a token its grammar did not allow: only a beam row scored
-inf (a candidate HF's beam rules keep when too few are allowed) gets one; it never wins,
and its mask allows every token.
"""

from __future__ import annotations

from typing import Protocol

import torch

# xgrammar's default (half the cores) is slower: decode steps of 64 JSON-schema rows (Llama
# 3.2 1B shape, H200, 16-core host) took a median 1.96, 1.68, 3.95 and 4.00 ms with the masks
# filled on 1, 2, 4 and 8 threads, 1.62 ms without grammars (docs/grammar.md)
FILL_THREADS = 2


class RowGrammar(Protocol):
    stop_ids: tuple[int, ...]
    dead: bool

    @property
    def terminated(self) -> bool:
        """A stop token was accepted (or, with no stop tokens, the grammar is complete)."""

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write this row's allowed tokens into `bitmask[row]` (int32, on the host)."""

    def accept(self, token: int) -> bool:
        """Advance by the row's sampled token; False (and the row is dead) if the grammar
        did not allow it."""

    def fork(self) -> RowGrammar: ...

    def reset(self) -> None: ...

    @staticmethod
    def fill_many(rows: list[tuple[int, RowGrammar]], bitmask: torch.Tensor) -> None:
        """`bitmask[i]` for each (i, row) of live rows of this backend, filled together."""

    @staticmethod
    def accept_many(rows: list[tuple[RowGrammar, int]]) -> list[bool]:
        """`row.accept(token)` for each (row, token) of this backend, together."""


def fill_rows(rows: list[tuple[int, RowGrammar]], bitmask: torch.Tensor) -> None:
    """`bitmask[i]` for each (i, row): the live rows' filled together by their backend, the
    others (dead, or terminated) allowing every token."""
    live: dict[type, list[tuple[int, RowGrammar]]] = {}
    for i, g in rows:
        if g.dead or g.terminated:
            bitmask[i] = -1
        else:
            live.setdefault(type(g), []).append((i, g))
    for kind, group in live.items():
        kind.fill_many(group, bitmask)


def accept_rows(rows: list[tuple[RowGrammar, int]]) -> list[bool]:
    """`row.accept(token)` for each (row, token), each backend's rows together."""
    out = [False] * len(rows)
    by_kind: dict[type, list[int]] = {}
    for k, (g, _) in enumerate(rows):
        by_kind.setdefault(type(g), []).append(k)
    for kind, at in by_kind.items():
        for k, ok in zip(at, kind.accept_many([rows[k] for k in at])):
            out[k] = ok
    return out
