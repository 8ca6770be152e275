"""ModelLimits: what a request may be for this model and these pools, and the one check of it.

The scheduler knows the limits (the model's vocabulary, its pools' sizes) and sends them at
start-up with its info; the TokenizerManager checks every request against them before it is
sent, so that a caller gets a 400 naming the limit. The scheduler runs the same check on what
it receives (an Engine or a future frontend could skip the first), so a request that could
never run is refused, never admitted. One rule, one place: this file."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelLimits:
    vocab_size: int  # decoder token ids are in [0, vocab_size)
    input_vocab_size: int  # encoder / prompt token ids (Mllama: + its <|image|> token)
    is_encoder_decoder: bool
    context_length: int  # decoder tokens of one request, prompt and generated
    max_encoder_len: int  # encoder (or image) tokens of one request
    kv_capacity_tokens: int  # the decoder KV pool
    cross_capacity_tokens: int  # the cross-attention KV pool

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> ModelLimits:
        return cls(**{f.name: info[f.name] for f in dataclasses.fields(cls)})

    def check(self, encoder_ids: list[int], decoder_ids: list[int], max_new_tokens: int,
              image_tokens: int = 0) -> None:
        """ValueError naming the problem if a request of these inputs could never run.
        `image_tokens`: the cross K/V tokens of the model's own encoder inputs (Mllama's
        images, Whisper's audio windows)."""
        if self.is_encoder_decoder and not encoder_ids and not image_tokens:
            raise ValueError("the encoder input is empty")
        if not decoder_ids:
            raise ValueError("the decoder input is empty")
        # a decoder-only model's decoder input is the prompt (Mllama's may hold <|image|>)
        decoder = (("decoder_input_ids", decoder_ids, self.vocab_size) if self.is_encoder_decoder
                   else ("input_ids", decoder_ids, self.input_vocab_size))
        for name, ids, limit in (("input_ids", encoder_ids, self.input_vocab_size), decoder):
            bad = [t for t in ids if not 0 <= t < limit]
            if bad:
                raise ValueError(f"{name} has token id {bad[0]} outside [0, {limit})")
        limit = min(self.max_encoder_len, self.cross_capacity_tokens)
        if image_tokens > limit:
            what = "images" if not self.is_encoder_decoder else "encoder inputs (audio)"
            raise ValueError(f"the {what} need {image_tokens} cross-attention tokens, over the "
                             f"limit of {limit} (max_encoder_len / cross-KV pool)")
        if len(encoder_ids) + image_tokens > limit:
            raise ValueError(f"the input is {len(encoder_ids) + image_tokens} tokens, longer "
                             f"than the limit of {limit} (max_encoder_len / cross-KV pool)")
        total = len(decoder_ids) + max_new_tokens
        limit = min(self.context_length, self.kv_capacity_tokens)
        if total > limit:
            what = "decoder prefix" if self.is_encoder_decoder else "prompt"
            raise ValueError(f"the {what} ({len(decoder_ids)} tokens) plus max_new_tokens "
                             f"({max_new_tokens}) is {total}, over the limit of {limit} "
                             f"(context length / KV pool)")
