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
class StreamedTokens:
    """One step's streamed tokens of the requests whose output is a token and nothing else
    (announced, not finished, no log-probs, no per-output cache hits), as columns. Building
    and pickling 256 of them cost ~0.08 ms against ~1.3 ms for 256 TokenOutputs (a CPU
    microbenchmark; on an H200 server at 256 streams the throughput did not change:
    docs/benchmarks.md). The detokenizer turns them back into TokenOutputs
    (`token_outputs`), so nothing after it changes."""

    rids: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    completion_tokens: list[int] = field(default_factory=list)
    cached_tokens: list[int] = field(default_factory=list)
    encoder_cache_hits: list[bool] = field(default_factory=list)

    def add(self, rid: str, token: int, prompt: int, completion: int, cached: int,
            hit: bool) -> None:
        self.rids.append(rid)
        self.token_ids.append(token)
        self.prompt_tokens.append(prompt)
        self.completion_tokens.append(completion)
        self.cached_tokens.append(cached)
        self.encoder_cache_hits.append(hit)

    def outputs(self) -> list[TokenOutput]:
        return [TokenOutput(rid, [t], None, p, n, c, h) for rid, t, p, n, c, h in zip(
            self.rids, self.token_ids, self.prompt_tokens, self.completion_tokens,
            self.cached_tokens, self.encoder_cache_hits)]


OutputItem = TokenOutput | StreamedTokens  # what a scheduler step returns, in order


def token_outputs(items: list[OutputItem]) -> list[TokenOutput]:
    """`items` with each StreamedTokens as its TokenOutputs, in place (a request's outputs keep
    their order: within one StreamedTokens a request has one row)."""
    if not any(isinstance(i, StreamedTokens) for i in items):
        return items  # type: ignore[return-value]
    out: list[TokenOutput] = []
    for i in items:
        if isinstance(i, StreamedTokens):
            out += i.outputs()
        else:
            out.append(i)
    return out


@dataclass
class BatchTokenOutput:
    """A scheduler step's outputs as sent to the detokenizer (StreamedTokens among them), and
    as the detokenizer sends them on (TokenOutputs only)."""

    outputs: list[OutputItem]
