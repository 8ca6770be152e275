"""xgrammar as the grammar backend: a row's grammar state is a `GrammarMatcher`
(`RowGrammar`, matcher.py), with the request's stop tokens overriding the vocabulary's.

JSON is written without free whitespace (`any_whitespace=False`: `", "` and `": "` only): with
any amount allowed, a weak or random model loops in whitespace until its token limit.
Compiling is milliseconds for most schemas; reading the vocabulary ~0.7 s for Llama 3's 128k
tokens.
"""

from __future__ import annotations

import re

import torch
import xgrammar as xgr

from seq2serve.runtime.grammar import matcher

_LOCATION = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")


class XgrBackend:
    name = "xgrammar"

    def __init__(self, pieces: list[bytes]) -> None:
        # stop tokens: none here (each matcher is given its request's)
        info = xgr.TokenizerInfo(pieces, xgr.VocabType.RAW, vocab_size=len(pieces),
                                 stop_token_ids=[])
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, kind: str, text: str) -> xgr.CompiledGrammar:
        """ValueError naming the problem."""
        try:
            if kind == "json_schema":
                return self.compiler.compile_json_schema(text, any_whitespace=False)
            if kind == "regex":
                return self.compiler.compile_regex(text)
            return self.compiler.compile_grammar(text)
        except (RuntimeError, ValueError, TypeError) as e:
            raise ValueError(f"{kind} is not valid: {_reason(e)}") from None

    def row(self, compiled: xgr.CompiledGrammar, stop_ids: tuple[int, ...]) -> XgrRow:
        try:
            return XgrRow(compiled, stop_ids)
        except RuntimeError as e:  # the backend's own checks
            raise ValueError(_reason(e)) from None


class XgrRow:
    def __init__(self, compiled: xgr.CompiledGrammar, stop_ids: tuple[int, ...],
                 state: xgr.GrammarMatcher | None = None) -> None:
        self.compiled = compiled
        self.stop_ids = stop_ids
        # without stop tokens (a model with no EOS) the matcher ends when the grammar does
        self.matcher = state or xgr.GrammarMatcher(
            compiled, override_stop_tokens=list(stop_ids) or None,
            terminate_without_stop_token=not stop_ids)
        self.dead = False

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        if self.dead or self.terminated:
            bitmask[row] = -1
        else:
            self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token: int) -> bool:
        if self.dead or self.terminated:
            return False
        if not self.matcher.accept_token(token):
            self.dead = True
        return not self.dead

    def fork(self) -> XgrRow:
        twin = XgrRow(self.compiled, self.stop_ids, self.matcher.fork())
        twin.dead = self.dead
        return twin

    def reset(self) -> None:
        self.matcher.reset()
        self.dead = False

    @staticmethod
    def accept_many(rows: list[tuple[XgrRow, int]]) -> list[bool]:
        return [g.accept(token) for g, token in rows]

    @staticmethod
    def fill_many(rows: list[tuple[int, XgrRow]], bitmask: torch.Tensor) -> None:
        global _batch
        if _batch is None:
            _batch = xgr.BatchGrammarMatcher(matcher.FILL_THREADS)
        _batch.batch_fill_next_token_bitmask([g.matcher for _, g in rows], bitmask,
                                             [i for i, _ in rows])


_batch: xgr.BatchGrammarMatcher | None = None


def _reason(e: Exception) -> str:
    """xgrammar's message without its time and source location ("[07:44:55] /x/y.cc:83: ")."""
    lines = str(e).strip().splitlines()
    return _LOCATION.sub("", lines[0]) if lines else type(e).__name__
