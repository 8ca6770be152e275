"""llguidance as the grammar backend: a row's grammar state is an `LLMatcher`
(`RowGrammar`, matcher.py).

llguidance's vocabulary has one end token (`end`, the tokenizer's EOS or a special token):
its bit in a mask says the output may end there. A request's own stop tokens are allowed
exactly there (the bit copied to theirs, and `end`'s own cleared unless it is one of them,
as xgrammar's `override_stop_tokens` does), and a row that accepts one consumes `end`.
Forced text (`{"` after a schema's start) is tokenized greedily over the vocabulary table
(llguidance allows one tokenization of forced text, xgrammar any); a SentencePiece
tokenizer's own encoding would add the word-start space that is not in the text.

A compiled grammar is a fresh matcher, copied for each row (`deep_copy`, microseconds:
building one compiles the grammar).
"""

from __future__ import annotations

import re

import llguidance
import llguidance.numpy as llnp
import numpy as np
import torch
from llguidance.gbnf_to_lark import gbnf_to_lark

from seq2serve.runtime.grammar import matcher

# JSON as xgrammar's any_whitespace=False writes it: no free whitespace (a weak or random
# model loops in whitespace until its token limit), ", " and ": " between items
JSON_DEFAULTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class _Vocabulary:
    """llguidance's view of the vocabulary table (vocabulary.py: each id's output bytes,
    special ids empty)."""

    is_tokenizer_wrapper = True  # (llguidance checks for it)

    def __init__(self, pieces: list[bytes], end: int) -> None:
        self.tokens = pieces
        self.eos_token_id = end
        self.bos_token_id = None
        self.special_token_ids = [i for i, p in enumerate(pieces) if not p]
        self.tokenizer: llguidance.LLTokenizer | None = None

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self.tokenizer.greedy_tokenize(text)


class LlgBackend:
    name = "llguidance"

    def __init__(self, pieces: list[bytes], eos_token_id: int | None) -> None:
        specials = [i for i, p in enumerate(pieces) if not p]
        self.end = (eos_token_id if eos_token_id is not None and 0 <= eos_token_id < len(pieces)
                    else specials[0] if specials else len(pieces) - 1)
        vocab = _Vocabulary(pieces, self.end)
        self.tokenizer = llguidance.LLTokenizer(vocab, n_vocab=len(pieces))
        vocab.tokenizer = self.tokenizer

    def compile(self, kind: str, text: str) -> llguidance.LLMatcher:
        """A fresh matcher of the grammar; ValueError naming the problem."""
        try:
            if kind == "json_schema":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(text,
                                                                        defaults=JSON_DEFAULTS)
            elif kind == "regex":
                grammar = llguidance.LLMatcher.grammar_from_regex(text)
            else:  # xgrammar's EBNF is GBNF's dialect
                grammar = gbnf_to_lark(text)
        except Exception as e:  # (gbnf_to_lark raises bare Exceptions: "Rule 'x' not found")
            raise ValueError(f"{kind} is not valid: {e}") from None
        fresh = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if fresh.is_error():
            raise ValueError(f"{kind} is not valid: {_reason(fresh.get_error())}")
        return fresh

    def row(self, fresh: llguidance.LLMatcher, stop_ids: tuple[int, ...]) -> LlgRow:
        return LlgRow(fresh, stop_ids, self.end)


class LlgRow:
    def __init__(self, fresh: llguidance.LLMatcher, stop_ids: tuple[int, ...], end: int,
                 state: llguidance.LLMatcher | None = None) -> None:
        self.fresh = fresh  # the compiled grammar's start (shared; never advanced)
        self.stop_ids = stop_ids
        self.end = end
        self.matcher = state or fresh.deep_copy()
        self.dead = False
        self.ended = False  # a stop token was accepted

    @property
    def terminated(self) -> bool:
        # without stop tokens (a model with no EOS) the row ends when the grammar does
        return self.ended or (not self.stop_ids and self.matcher.is_stopped())

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        if self.dead or self.terminated:
            bitmask[row] = -1
        else:
            self.fill_many([(row, self)], bitmask)

    def accept(self, token: int) -> bool:
        return self.accept_many([(self, token)])[0]

    def fork(self) -> LlgRow:
        twin = LlgRow(self.fresh, self.stop_ids, self.end, self.matcher.deep_copy())
        twin.dead, twin.ended = self.dead, self.ended
        return twin

    def reset(self) -> None:
        self.matcher = self.fresh.deep_copy()  # (a dead row's matcher is in its error state)
        self.dead = self.ended = False

    @staticmethod
    def accept_many(rows: list[tuple[LlgRow, int]]) -> list[bool]:
        """Each row's token consumed, the rows on the fill threads together (a row's stop
        token consumes `end`; `end` itself, not one of its stops, is refused)."""
        out = [False] * len(rows)
        todo, at = [], []
        for k, (g, token) in enumerate(rows):
            if g.dead or g.terminated:
                continue
            stop = token in g.stop_ids
            if not stop and token == g.end:
                g.dead = True
                continue
            todo.append((g.matcher, g.end if stop else token))
            at.append(k)
        if len(todo) == 1:
            done = [todo[0][0].consume_token(todo[0][1])]
        else:
            done = llnp.consume_token_par(_pool(), todo) if todo else []
        for k, ok in zip(at, done):
            g, token = rows[k]
            g.dead = not ok
            g.ended = ok and token in g.stop_ids
            out[k] = ok
        return out

    @staticmethod
    def fill_many(rows: list[tuple[int, LlgRow]], bitmask: torch.Tensor) -> None:
        words = bitmask.numpy()
        llnp.fill_next_token_bitmask_par(_pool(), [(g.matcher, i) for i, g in rows], words)
        by_stops: dict[tuple, list[int]] = {}
        for i, g in rows:
            by_stops.setdefault((g.end, g.stop_ids), []).append(i)
        bits = words.view(np.uint32)
        for (end, stops), at in by_stops.items():
            _move_end(bits, np.asarray(at), end, stops)


def _move_end(bits: np.ndarray, rows: np.ndarray, end: int, stops: tuple[int, ...]) -> None:
    """In `bits[rows]`: each stop token allowed where `end` is, `end` only if it is a stop."""
    word, bit = divmod(end, 32)
    may_end = (bits[rows, word] >> np.uint32(bit)) & np.uint32(1)
    bits[rows, word] &= np.uint32(~(1 << bit) & 0xFFFFFFFF)
    for s in stops:
        word, bit = divmod(s, 32)
        bits[rows, word] = ((bits[rows, word] & np.uint32(~(1 << bit) & 0xFFFFFFFF))
                            | (may_end << np.uint32(bit)))


def _reason(error: str) -> str:
    """llguidance's message on one line: its first, without the position in its own
    translation of the grammar ("at 1(8): "), and the cause ("error: ...") if one follows."""
    lines = [line.strip() for line in error.strip().splitlines()]
    if not lines:
        return "rejected"
    causes = [line.removeprefix("error:").strip() for line in lines[1:]
              if line.startswith("error:")]
    return " ".join([re.sub(r"^at \d+\(\d+\):\s*", "", lines[0]), *causes])


_executor: llguidance.LLExecutor | None = None


def _pool() -> llguidance.LLExecutor:
    global _executor
    if _executor is None:
        _executor = llguidance.LLExecutor(matcher.FILL_THREADS)
    return _executor
