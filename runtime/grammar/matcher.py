"""`RowGrammar`: one decoder row's place in its grammar (an xgrammar matcher), owned by the
scheduler's request.

Each step the host fills the row's line of the batch's token bitmask (bit t of word t // 32:
token t allowed) before the step is launched, and after the step is read the row accepts its
token. The request's stop tokens are allowed exactly where the grammar accepts the output;
accepting one terminates the matcher. A beam row that continues another row's sequence takes a
copy of that row's state (`fork`). A step's rows are filled together (`fill_rows`: xgrammar's
batch matcher on `FILL_THREADS` threads).
"""

from __future__ import annotations

import torch
import xgrammar as xgr


class RowGrammar:
    def __init__(self, compiled: xgr.CompiledGrammar, stop_ids: tuple[int, ...],
                 matcher: xgr.GrammarMatcher | None = None) -> None:
        self.compiled = compiled
        self.stop_ids = stop_ids
        # without stop tokens (a model with no EOS) the matcher ends when the grammar does
        self.matcher = matcher or xgr.GrammarMatcher(
            compiled, override_stop_tokens=list(stop_ids) or None,
            terminate_without_stop_token=not stop_ids)
        # a token the grammar did not allow was accepted: only a beam row scored -inf (a
        # candidate HF's beam rules keep when too few are allowed) gets one; it never wins
        self.dead = False

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write this row's allowed tokens into `bitmask[row]` (int32, on the host). A dead
        row allows every token (its score is -inf whatever it takes)."""
        if self.dead or self.terminated:
            bitmask[row] = -1
        else:
            self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token: int) -> bool:
        """Advance by the row's sampled token; False (and the row is dead) if the grammar did
        not allow it."""
        if self.dead or self.terminated:
            return False
        if not self.matcher.accept_token(token):
            self.dead = True
        return not self.dead

    def fork(self) -> RowGrammar:
        twin = RowGrammar(self.compiled, self.stop_ids, self.matcher.fork())
        twin.dead = self.dead
        return twin

    def reset(self) -> None:
        self.matcher.reset()
        self.dead = False


# xgrammar's default (half the cores) is slower: decode steps of 64 JSON-schema rows (Llama
# 3.2 1B shape, H200, 16-core host) took a median 1.96, 1.68, 3.95 and 4.00 ms with the masks
# filled on 1, 2, 4 and 8 threads, 1.62 ms without grammars (docs/grammar.md)
FILL_THREADS = 2
_batch: xgr.BatchGrammarMatcher | None = None


def fill_rows(rows: list[tuple[int, RowGrammar]], bitmask: torch.Tensor) -> None:
    """`bitmask[i]` for each (i, row): the live rows' filled together in threads, the others
    (dead, or terminated) allowing every token, as `RowGrammar.fill` does one at a time."""
    global _batch
    live = [(i, g) for i, g in rows if not (g.dead or g.terminated)]
    for i, g in rows:
        if g.dead or g.terminated:
            bitmask[i] = -1
    if live:
        if _batch is None:
            _batch = xgr.BatchGrammarMatcher(FILL_THREADS)
        _batch.batch_fill_next_token_bitmask([g.matcher for _, g in live], bitmask,
                                             [i for i, _ in live])
