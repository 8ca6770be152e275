"""`GrammarCache`: a request's grammar compiled against the model's vocabulary by the grammar
backend (`xgr_row.py`: xgrammar, `llg_row.py`: llguidance; `--grammar-backend`), cached by
its text, and a fresh matcher for each request row.

Kinds, by SGLang's names: `json_schema` (a JSON Schema as text; OpenAI's `json_object` is the
schema of any object), `regex`, `ebnf` (xgrammar's EBNF, root rule `root`; llguidance reads
it as GBNF). JSON is written without free whitespace (`", "` and `": "` only): with any amount
allowed, a weak or random model loops in whitespace until its token limit. Bad input is a
ValueError naming the problem (the frontend's 400).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

from seq2serve.runtime.grammar.bitmask import new_bitmask
from seq2serve.runtime.grammar.expressible import missing_chars
from seq2serve.runtime.grammar.matcher import RowGrammar
from seq2serve.runtime.grammar.vocabulary import token_bytes, vocabulary_chars

KINDS = ("json_schema", "regex", "ebnf")
BACKENDS = ("xgrammar", "llguidance")
MAX_GRAMMAR_CHARS = 100_000


def make_backend(name: str, pieces: list[bytes], eos_token_id: int | None):
    if name == "xgrammar":
        from seq2serve.runtime.grammar.xgr_row import XgrBackend
        return XgrBackend(pieces)
    if name == "llguidance":
        from seq2serve.runtime.grammar.llg_row import LlgBackend
        return LlgBackend(pieces, eos_token_id)
    raise ValueError(f"grammar backend must be one of {', '.join(BACKENDS)}, got {name!r}")


class GrammarCache:
    """Compiled grammars by (kind, text), least recently used dropped past `capacity`.
    Lives in the scheduler process (the matchers are the scheduler's); compiles run on its
    compile thread (runtime/scheduler/grammar_compiles.py)."""

    def __init__(self, tokenizer, vocab_size: int, capacity: int = 256,
                 backend: str = "xgrammar") -> None:
        self.pieces = token_bytes(tokenizer, vocab_size)
        self.vocab_size = vocab_size
        self.chars = vocabulary_chars(self.pieces)
        self.backend = make_backend(backend, self.pieces,
                                    getattr(tokenizer, "eos_token_id", None))
        self.capacity = capacity
        self._compiled: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.hits = self.misses = 0
        self._lock = threading.Lock()

    def has(self, kind: str, text: str) -> bool:
        with self._lock:
            return (kind, text) in self._compiled

    def compiled(self, kind: str, text: str) -> Any:
        """Thread-safe: a compile thread may run this while the scheduler's loop takes hits
        (one compile at a time: the compiler runs on one thread)."""
        key = (kind, text)
        with self._lock:
            found = self._compiled.get(key)
            if found is not None:
                self.hits += 1
                self._compiled.move_to_end(key)
                return found
            self.misses += 1
        grammar = self._compile(kind, text)  # (outside the lock: the loop goes on)
        with self._lock:
            self._compiled[key] = grammar
            if len(self._compiled) > self.capacity:
                self._compiled.popitem(last=False)
        return grammar

    def matcher(self, kind: str, text: str, stop_ids: tuple[int, ...]) -> RowGrammar:
        """A new request row's matcher; ValueError if the grammar is bad or the model's
        vocabulary cannot start it."""
        compiled = self.compiled(kind, text)
        try:
            m = self.backend.row(compiled, stop_ids)
        except ValueError as e:
            raise ValueError(f"{kind}: {e}") from None
        mask = new_bitmask(1, self.vocab_size)
        m.fill(mask, 0)
        if not m.terminated and not mask.any():
            raise ValueError(f"{kind}: no token of this model's vocabulary can begin an output "
                             f"the grammar allows")
        return m

    def _compile(self, kind: str, text: str) -> Any:
        if kind not in KINDS:
            raise ValueError(f"unknown grammar kind {kind!r}; one of {', '.join(KINDS)}")
        if not isinstance(text, str) or not text:
            raise ValueError(f"{kind} must be a non-empty string")
        if len(text) > MAX_GRAMMAR_CHARS:
            raise ValueError(f"{kind} is {len(text)} characters, over {MAX_GRAMMAR_CHARS}")
        if kind == "json_schema":
            self._check_schema(text)
        return self.backend.compile(kind, text)

    def _check_schema(self, text: str) -> None:
        try:
            schema: Any = json.loads(text)
        except ValueError as e:
            raise ValueError(f"json_schema is not JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise ValueError("json_schema must be a JSON Schema (an object)")
        missing = missing_chars(schema, self.chars)
        if missing:
            raise ValueError(
                f"json_schema cannot be written with this model's vocabulary: every valid "
                f"output contains {' '.join(repr(c) for c in missing)}, which no token "
                f"contains (arrays, enums and regexes without those characters can be)")

