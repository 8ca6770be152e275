"""One request's whole state: its encoder part and its decoder part."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from seq2serve.runtime.config.sampling_params import SamplingParams

if TYPE_CHECKING:
    from seq2serve.encoders.encoder_cache import EncoderCacheEntry
    from seq2serve.encoders.encoder_input import EncoderPayload, EncoderSegment
    from seq2serve.runtime.scheduler.radix_node import RadixNode


_SHORT_WINDOW = 16  # tokens decoded per token for stop strings (the newest one's text)
_INCOMPLETE = "\ufffd"  # a partial UTF-8 character


@dataclass
class FinishReason:
    type: str  # "stop" | "length" | "abort"
    matched: int | str | None = None  # the stop token id or stop string that ended it
    message: str | None = None  # why an abort happened

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": self.type}
        if self.matched is not None:
            d["matched"] = self.matched
        if self.message is not None:
            d["message"] = self.message
        return d


# whether a request reads its generated tokens every step (`Req.reads_history`), for C loops
# over a batch
READS_HISTORY = attrgetter("reads_history")


@dataclass(eq=False)
class Req:
    # --- set by the tokenizer manager ---
    rid: str
    encoder_input_ids: list[int]  # the encoder's input; [] for decoder-only models
    decoder_input_ids: list[int]  # the decoder prompt (T5: start token + any forced prefix)
    sampling_params: SamplingParams
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int | None = None  # score the decoder input from this position on
    encoder_key: str | None = None  # identifies the encoder input (for the encoder cache)
    encoder_inputs: list[EncoderPayload] = field(default_factory=list)  # besides text
    cross_spans: list[tuple[int, int, int]] | None = None  # cross K/V each position reads
    user: str | None = None  # the caller's user id (cache isolation)
    beam_rids: list[str] | None = None  # beam search: the rids of its results, best first
    embed: bool = False  # finished after the encoder stage with its input's embedding

    # --- set by the scheduler: encoder part ---
    segments: list[EncoderSegment] = field(default_factory=list)
    namespace: tuple = ()  # cache namespace: user (if isolated) + encoder keys
    cross_entries: list[EncoderCacheEntry] = field(default_factory=list)  # refs held
    encoder_cache_hit: bool = False  # no encoder pass ran for this request
    encoder_public_hits: int = 0  # inputs served by public entries (shared isolation)
    # --- set by the scheduler: decoder part ---
    req_pool_idx: int | None = None  # row in the ReqToTokenPool
    kv_pages: list[int] = field(default_factory=list)  # TokenToKVPool pages, in order
    prefix_pages: int = 0  # leading kv_pages owned by the radix cache (locked)
    prefix_node: RadixNode | None = None  # the locked radix node
    cached_tokens: int = 0  # decoder tokens whose K/V came from the radix cache
    cached_public_tokens: int = 0  # of those, the tokens of public entries (shared isolation)
    kv_len: int = 0  # decoder positions whose K/V are (being) computed; slots cover exactly these
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    # the decoder input's log-probs from logprob_start_len on, set by its first extend
    input_logprobs: list[float | None] | None = None
    input_logprobs_part: list[float] = field(default_factory=list)  # chunks before the last
    finished_reason: FinishReason | None = None
    num_retractions: int = 0
    fair_tag: int = 0  # admission order across callers (policy.FairPolicy)
    beam: Any = None  # beam search: the BeamGroup this row belongs to (beam_search.py)
    grammar: Any = None  # its RowGrammar (runtime/grammar/matcher.py) with a grammar
    announced: bool = False  # its detokenizer settings went out with its first output
    # stop strings: the text's last (longest stop - 1) characters, as of `stop_tail_at` tokens
    stop_tail: str = ""
    stop_tail_at: int = -1
    # --- timing (set by the scheduler) ---
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    finish_time: float | None = None

    def __post_init__(self) -> None:
        sp = self.sampling_params
        # fixed for the request's life; the scheduler checks them every step. Penalties, n-gram
        # bans, grammars and Whisper's timestamp rules read every generated token: a step that
        # runs ahead of the host makes their sampling fields late (step_plan.overlappable)
        self.reads_history = (sp.has_penalties or sp.no_repeat_ngram_size > 0
                              or sp.grammar is not None or sp.timestamps)
        self.plain_greedy = (sp.is_greedy and not sp.is_beam and not self.reads_history
                             and not self.return_logprob)

    @property
    def fill_ids(self) -> list[int]:
        """Every decoder token: the prompt followed by what has been generated."""
        return self.decoder_input_ids + self.output_ids

    @property
    def wants_input_logprobs(self) -> bool:
        return self.logprob_start_len is not None and self.input_logprobs is None

    @property
    def max_cached_prefix(self) -> int:
        """Decoder tokens a cached prefix may cover: all but the last (its logits are needed),
        and, while its input is still to be scored, none from the one before the first scored
        token on (each token's log-prob comes from the logits of the token before it)."""
        if self.wants_input_logprobs:
            return max(0, min(self.seq_len, self.logprob_start_len) - 1)
        return self.seq_len - 1

    @property
    def seq_len(self) -> int:
        return len(self.decoder_input_ids) + len(self.output_ids)

    @property
    def encoder_len(self) -> int:
        """Cross K/V length: the text encoder's tokens plus every other input's."""
        if not self.encoder_inputs:  # (text alone: read every decode step, for every row)
            return len(self.encoder_input_ids)
        return len(self.encoder_input_ids) + sum(p.num_tokens for p in self.encoder_inputs)

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    @property
    def cross_ready(self) -> bool:
        """Every segment's cross K/V are written (or there are none)."""
        return all(e.ready for e in self.cross_entries)

    def check_finished(self, eos_ids: tuple[int, ...], tail_text) -> None:
        """Set finished_reason after a token was appended. `tail_text(ids)` decodes ids."""
        sp = self.sampling_params
        token = self.output_ids[-1]
        if len(self.output_ids) >= sp.min_new_tokens:
            if token in sp.stop_token_ids:
                self.finished_reason = FinishReason("stop", matched=token)
                return
            if not sp.ignore_eos and token in eos_ids:
                self.finished_reason = FinishReason("stop", matched=token)
                return
            if sp.stop:
                matched = self._new_stop_string(tail_text)
                if matched is not None:
                    self.finished_reason = FinishReason("stop", matched=matched)
                    return
        if len(self.output_ids) >= sp.max_new_tokens:
            self.finished_reason = FinishReason("length")

    def _new_stop_string(self, tail_text) -> str | None:
        """The stop string that the newest token completes, if any (an occurrence that ended
        earlier, before min_new_tokens, does not count: HF's rule). The text shown is cut
        there by the detokenizer (`IncrementalDetokenizer.add(matched_stop=...)`).

        The newest token's text comes from a short window, appended to the kept tail, so a
        token costs the same whatever the stop strings' length (decoding a window as long as
        the longest stop string cost 550 us per token at 1,024 characters); only where the
        short window disagrees with the tail (a multi-byte character, a tokenizer
        normalizing across the boundary) is the long window decoded."""
        stop = self.sampling_params.stop
        longest = max(len(s) for s in stop)
        window = self.output_ids[-_SHORT_WINDOW:]
        text, before = tail_text(window), tail_text(window[:-1])
        if (self.stop_tail_at == len(self.output_ids) - 1 and text.startswith(before)
                and _INCOMPLETE not in text):
            start, text = len(self.stop_tail), self.stop_tail + text[len(before):]
        else:  # enough tokens to cover the string even when tokens are partial characters
            window = self.output_ids[-(longest + 8):]
            text, before = tail_text(window), tail_text(window[:-1])
            start = len(before)
        self.stop_tail = text[max(0, len(text) - longest + 1):] if longest > 1 else ""
        self.stop_tail_at = len(self.output_ids)
        for s in stop:
            if text.find(s, max(0, start - len(s) + 1)) >= 0:
                return s
        return None
