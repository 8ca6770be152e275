"""The scheduler's side of grammar-constrained decoding (`runtime/grammar/`): each request
with a grammar holds a matcher (`Req.grammar`), made when the request arrives; before a step
is launched the host fills the token bitmask of the batch's grammar rows, and after the step
is read each row accepts its token.

The mask of a step needs the token of the step before. In the overlap schedule a step is
launched before the host has read the one in flight, so its grammar rows' masks are filled
late: the forward is queued at launch, the host reads the step before (the matchers take
their tokens), fills the masks and then queues the sampler (`StepLauncher.complete`), while
the device runs the forward. With tensor parallelism (the other ranks sample from the batch
they were sent) grammar rows keep every step waiting for the one before.
"""

from __future__ import annotations

import torch

from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.grammar.bitmask import step_bitmask
from seq2serve.runtime.grammar.compiler import GrammarCache
from seq2serve.runtime.grammar.matcher import RowGrammar, accept_rows, fill_rows
from seq2serve.runtime.scheduler.beam_search import BeamGroup
from seq2serve.runtime.scheduler.req import READS_HISTORY, Req

DEAD_END = ("the grammar allows no token of this model's vocabulary at this point of the "
            "output (the vocabulary cannot write what the grammar requires next)")


class Grammars:
    """The scheduler's grammar cache, made at the first request with a grammar (reading the
    vocabulary takes ~0.7 s for 128k tokens). `row` may run on a compile thread
    (grammar_compiles.py) while the loop calls `cached_row`."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: tuple[int, ...],
                 backend: str = "xgrammar") -> None:
        self.tokenizer = tokenizer
        self.backend = backend
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self.cache: GrammarCache | None = None

    def row(self, sp: SamplingParams) -> RowGrammar | None:
        """A new request's matcher (None without a grammar); ValueError naming the problem."""
        if sp.grammar is None:
            return None
        if self.tokenizer is None:
            raise ValueError(f"{sp.grammar[0]} needs the model's tokenizer; this model "
                             f"directory has none")
        if self.cache is None:
            self.cache = GrammarCache(self.tokenizer, self.vocab_size, backend=self.backend)
        return self.cache.matcher(*sp.grammar, self._stops(sp))

    def cached_row(self, sp: SamplingParams) -> RowGrammar | None:
        """`row(sp)` when its grammar is compiled already (no compile on the caller's thread),
        else None."""
        cache = self.cache
        if sp.grammar is None or cache is None or not cache.has(*sp.grammar):
            return None
        return cache.matcher(*sp.grammar, self._stops(sp))

    def _stops(self, sp: SamplingParams) -> tuple[int, ...]:
        # the model's EOS ends a grammar's output even with ignore_eos: the grammar decides
        # where the output may end, and nothing may follow its end
        return tuple(sorted(set(sp.stop_token_ids) | set(self.eos_ids)))

    def stats(self) -> dict[str, int]:
        c = self.cache
        return {"grammar_cache_hits": c.hits if c else 0,
                "grammar_cache_misses": c.misses if c else 0}


def grammar_masks(reqs: list[Req], vocab_size: int) -> tuple[list[int], torch.Tensor] | None:
    """The batch rows with a grammar and a bitmask of a row per batch row, theirs filled now
    on the host (None if no row has one)."""
    if not any(map(READS_HISTORY, reqs)):  # (a grammar row reads its history: a C loop)
        return None
    rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
    if not rows:
        return None
    mask = step_bitmask(len(reqs), vocab_size)
    fill_rows([(i, reqs[i].grammar) for i in rows], mask)
    return rows, mask


def accept_tokens(reqs: list[Req], rows: list[int], ids: list[int]) -> dict[int, bool]:
    """After a step is read: the grammar rows among `rows` (the batch rows that take their
    token) take it, all of them together (llguidance's on its threads); batch row -> whether
    the grammar allowed it."""
    rows = [i for i in rows if reqs[i].grammar is not None]
    if not rows:
        return {}
    return dict(zip(rows, accept_rows([(reqs[i].grammar, ids[i]) for i in rows])))


def beam_grammars(group: BeamGroup, choices: list[tuple[int, int]]) -> list[RowGrammar] | None:
    """After a beam step: row j continues row `choices[j][0]` with token `choices[j][1]`, so
    its matcher is a copy of that row's advanced by the token (None without a grammar)."""
    if group.rows[0].grammar is None:
        return None
    out = []
    for parent, token in choices:
        g = group.rows[parent].grammar.fork()
        g.accept(token)  # a -inf candidate's token may be refused: that row is dead
        out.append(g)
    return out


def set_beam_grammars(group: BeamGroup, grammars: list[RowGrammar] | None) -> None:
    if grammars is not None:
        for row, g in zip(group.rows, grammars):
            row.grammar = g
