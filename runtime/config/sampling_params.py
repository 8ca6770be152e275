"""Sampling parameters with SGLang's names, validated with messages that name the field."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

_DISABLED_TOP_K = -1
MAX_BEAMS = 32
GRAMMAR_KINDS = ("json_schema", "regex", "ebnf")


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = _DISABLED_TOP_K  # -1 (or 0) means no top-k cut
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    n: int = 1
    seed: int | None = None
    # beam search (HF's `generate(num_beams=..., do_sample=False)`): num_beams 1 = off
    num_beams: int = 1
    num_return_sequences: int = 1  # results per prompt, best first (<= num_beams)
    length_penalty: float = 1.0  # finished score = sum of log-probs / length ** length_penalty
    early_stopping: bool | str = False  # True, False or "never" (HF's meaning)
    no_repeat_ngram_size: int = 0  # no n-gram of this size occurs twice (any decoding)
    # grammar-constrained decoding (SGLang's names; at most one): a JSON Schema as text, a
    # regular expression, an EBNF grammar (runtime/grammar/)
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    # Whisper: the timestamp rules (HF's WhisperTimeStampLogitsProcessor) over the generated
    # tokens; the decoder prompt then ends without <|notimestamps|>
    timestamps: bool = False

    @classmethod
    def from_dict(cls, params: dict[str, Any] | None) -> SamplingParams:
        """Build from a user's dict; unknown keys and bad values raise ValueError naming them."""
        if params is None:
            params = {}
        if isinstance(params, SamplingParams):
            params.validate()
            return params
        if not isinstance(params, dict):
            raise ValueError(f"sampling_params must be a dict, got {type(params).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {', '.join(map(str, unknown))}")
        params = {k: v for k, v in params.items() if v is not None or k == "seed"}
        if isinstance(params.get("stop"), str):
            params["stop"] = [params["stop"]]
        sp = cls(**params)
        sp.validate()
        return sp

    def validate(self, vocab_size: int | None = None) -> None:
        # 0: nothing generated; with logprob_start_len, the prompt is only scored
        _int("max_new_tokens", self.max_new_tokens, lo=0)
        _int("min_new_tokens", self.min_new_tokens, lo=0)
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens ({self.min_new_tokens}) must not exceed "
                f"max_new_tokens ({self.max_new_tokens})"
            )
        _num("temperature", self.temperature, lo=0.0, hi=100.0)
        _num("top_p", self.top_p, lo=0.0, hi=1.0, lo_open=True)
        _int("top_k", self.top_k, lo=-1)
        _num("min_p", self.min_p, lo=0.0, hi=1.0)
        _num("repetition_penalty", self.repetition_penalty, lo=0.0, hi=10.0, lo_open=True)
        _num("frequency_penalty", self.frequency_penalty, lo=-2.0, hi=2.0)
        _num("presence_penalty", self.presence_penalty, lo=-2.0, hi=2.0)
        _int("n", self.n, lo=1, hi=128)
        if self.seed is not None:
            _int("seed", self.seed, lo=0, hi=2**63 - 1)
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("stop must be a non-empty string or a list of non-empty strings")
        if len(self.stop) > 16:
            raise ValueError(f"stop accepts at most 16 strings, got {len(self.stop)}")
        if not isinstance(self.stop_token_ids, list):
            raise ValueError("stop_token_ids must be a list of token ids")
        for t in self.stop_token_ids:
            _int("stop_token_ids", t, lo=0, hi=None if vocab_size is None else vocab_size - 1)
        for name in ("ignore_eos", "skip_special_tokens", "timestamps"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean, got {getattr(self, name)!r}")
        self._validate_beams()
        self._validate_grammar()

    def _validate_grammar(self) -> None:
        given = [name for name in GRAMMAR_KINDS if getattr(self, name) is not None]
        for name in given:
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string")
        if len(given) > 1:
            raise ValueError(f"only one grammar per request: {', '.join(given)} were given")

    def _validate_beams(self) -> None:
        _int("num_beams", self.num_beams, lo=1, hi=MAX_BEAMS)
        _int("num_return_sequences", self.num_return_sequences, lo=1)
        if self.num_return_sequences > self.num_beams:
            raise ValueError(f"num_return_sequences ({self.num_return_sequences}) must not "
                             f"exceed num_beams ({self.num_beams})")
        _num("length_penalty", self.length_penalty, lo=-100.0, hi=100.0)
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise ValueError(f'early_stopping must be true, false or "never", got '
                             f"{self.early_stopping!r}")
        _int("no_repeat_ngram_size", self.no_repeat_ngram_size, lo=0)
        if self.num_beams == 1:
            return
        if self.max_new_tokens == 0:
            raise ValueError("num_beams > 1 needs max_new_tokens >= 1")
        # beam search is deterministic (HF's do_sample=False): what it cannot honour is refused
        refused = [name for name, on in (
            ("n", self.n != 1), ("stop", bool(self.stop)),
            ("frequency_penalty", self.frequency_penalty != 0.0),
            ("presence_penalty", self.presence_penalty != 0.0)) if on]
        if refused:
            raise ValueError(f"{', '.join(refused)} cannot be combined with num_beams > 1 "
                             f"(use num_return_sequences for several results; stop_token_ids "
                             f"end a hypothesis)")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def grammar(self) -> tuple[str, str] | None:
        """(kind, text) of the request's grammar, if it has one."""
        for name in GRAMMAR_KINDS:
            if getattr(self, name) is not None:
                return name, getattr(self, name)
        return None

    @property
    def is_beam(self) -> bool:
        return self.num_beams > 1

    @property
    def top_k_or_none(self) -> int | None:
        return None if self.top_k in (0, _DISABLED_TOP_K) else self.top_k

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )


def _int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be <= {hi}, got {value}")


def _num(name: str, value: Any, lo: float, hi: float, lo_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if value != value:  # NaN
        raise ValueError(f"{name} must be a number, got NaN")
    if (value <= lo if lo_open else value < lo) or value > hi:
        bracket = "(" if lo_open else "["
        raise ValueError(f"{name} must be in {bracket}{lo}, {hi}], got {value}")
