"""Messages between the tokenizer manager, the scheduler and the detokenizer (pickled over ZMQ)."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields
from typing import Any

from seq2serve.encoders.encoder_input import EncoderPayload
from seq2serve.runtime.config.sampling_params import SamplingParams


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
    # score the decoder input from this position on (its log-probs come back once); None: no
    logprob_start_len: int | None = None
    encoder_key: str | None = None
    # the model's own encoder inputs besides text (Mllama: its images), in order
    encoder_inputs: list[EncoderPayload] = field(default_factory=list)
    # which cross K/V each decoder position reads (see encoders.encoder_input.cross_spans);
    # None: every position reads all of them
    cross_spans: list[tuple[int, int, int]] | None = None
    user: str | None = None  # the caller's user id (cache isolation)
    group: str | None = None  # requests of one call (a batch, n samples) share it: fairness
    # beam search with num_return_sequences k: the rids of the k results, best first (the
    # first is `rid`); the scheduler sends one final TokenOutput for each. None: just `rid`
    beam_rids: list[str] | None = None
    # tokens of the decoder prompt after its start token that stand for a first token HF
    # would force as generated (forced_bos_token_id: NLLB's, mBART-50's target language):
    # they count in a beam's length penalty as HF counts them, never in max_new_tokens
    decoder_forced: int = 0
    # an embedding (/v1/embeddings): finished after the encoder stage with its input's
    # pooled encoder output (EncoderCacheEntry.embedding), no decoder step
    embed: bool = False

    @property
    def result_rids(self) -> list[str]:
        """The rids its results come back under: a beam search's k, else its own."""
        return self.beam_rids or [self.rid]


@dataclass
class AbortRequest:
    rid: str


@dataclass
class ControlRequest:
    """A request to the scheduler that gets one ControlReply with the same `tag`."""

    kind: str  # "flush_cache" | "check_integrity" | "stats"
    tag: str


@dataclass
class ControlReply:
    kind: str
    tag: str
    ok: bool
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DetokenizeSettings:
    stop: tuple[str, ...] = ()  # stop strings: the text ends before the first one
    skip_special_tokens: bool = True


@dataclass
class TokenOutput:
    """New tokens of one request from one scheduler step; `text` is filled by the detokenizer."""

    rid: str
    new_token_ids: list[int]
    finished_reason: dict[str, Any] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    encoder_cache_hit: bool = False
    # shared isolation: prefix tokens and encoder inputs served by public / private entries
    cache_hits: dict[str, int] | None = None
    new_logprobs: list[float] | None = None
    new_top_logprobs: list[list[tuple[int, float]]] | None = None
    # log-probs of the decoder input from logprob_start_len on (None at position 0): on the
    # request's first output
    input_logprobs: list[float | None] | None = None
    error: str | None = None  # set when the scheduler refused the request (bad input)
    # what the detokenizer needs to know about the request: on its first output only (the
    # detokenizer keeps it until the request finishes)
    detokenize: DetokenizeSettings | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # scheduler timings, when finished
    # set by the detokenizer
    text: str = ""

    def __reduce__(self):
        # pickled as the fields' values in order, rebuilt by one call: five times faster to
        # load than a dataclass's default (an instance dict rebuilt key by key), and the HTTP
        # process loads one per streamed token
        return TokenOutput, _token_output_values(self)


_token_output_values = operator.attrgetter(*(f.name for f in fields(TokenOutput)))


@dataclass
class BatchTokenOutput:
    outputs: list[TokenOutput]
