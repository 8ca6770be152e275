"""Messages between the tokenizer manager, the scheduler and the detokenizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from seq2serve.runtime.sampling_params import SamplingParams


@dataclass
class TokenizedRequest:
    """A validated, tokenized request on its way to the scheduler."""

    rid: str
    encoder_input_ids: list[int]
    decoder_input_ids: list[int]
    sampling_params: SamplingParams
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    encoder_key: str | None = None


@dataclass
class AbortRequest:
    rid: str


@dataclass
class TokenOutput:
    """New tokens of one request from one scheduler step (every token so far if finished)."""

    rid: str
    new_token_ids: list[int]
    finished_reason: dict[str, Any] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    encoder_cache_hit: bool = False
    new_logprobs: list[float] | None = None
    new_top_logprobs: list[list[tuple[int, float]]] | None = None
    error: str | None = None  # set when the request was refused (bad input)
    extra: dict[str, Any] = field(default_factory=dict)
