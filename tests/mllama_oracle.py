"""Hugging Face's MllamaForConditionalGeneration as the test oracle, with and without the
upstream fix for huggingface/transformers#39379 (rows that precede every image must not
receive cross-attention; the reference implementation and seq2serve mask them)."""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from PIL import Image


def random_image(seed: int, height: int, width: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((height, width, 3)) * 255).astype("uint8"))


@contextlib.contextmanager
def reference_row_masking():
    """Apply the upstream fix (transformers PR #47103): mask the cross-attention output of
    rows with no image, not only the MLP's."""
    from transformers.models.mllama import modeling_mllama as mm

    original = mm.MllamaCrossAttentionDecoderLayer.forward

    def forward(self, hidden_states, cross_attention_states, cross_attention_mask,
                attention_mask, full_text_row_masked_out_mask, position_ids=None,
                past_key_values=None, use_cache=False, position_embeddings=None, **kwargs):
        residual = hidden_states
        h, _ = self.cross_attn(hidden_states=self.input_layernorm(hidden_states),
                               attention_mask=cross_attention_mask,
                               cross_attention_states=cross_attention_states,
                               past_key_values=past_key_values, **kwargs)
        if full_text_row_masked_out_mask is not None:
            h = full_text_row_masked_out_mask[:, 0] * h
        hidden_states = residual + self.cross_attn_attn_gate.tanh() * h
        h = self.mlp(self.post_attention_layernorm(hidden_states))
        if full_text_row_masked_out_mask is not None:
            h = full_text_row_masked_out_mask[:, 0] * h
        return hidden_states + self.cross_attn_mlp_gate.tanh() * h

    mm.MllamaCrossAttentionDecoderLayer.forward = forward
    try:
        yield
    finally:
        mm.MllamaCrossAttentionDecoderLayer.forward = original


class MllamaOracle:
    def __init__(self, path: str) -> None:
        from transformers import AutoProcessor, MllamaForConditionalGeneration

        self.processor = AutoProcessor.from_pretrained(path)
        self.model = MllamaForConditionalGeneration.from_pretrained(
            path, dtype=torch.float32).eval()

    def generate_text(self, prompt: str, images: list, max_new_tokens: int,
                      add_special_tokens: bool = True) -> list[int]:
        """HF's greedy tokens for a raw prompt through HF's own processor (batch 1)."""
        inputs = self.processor(images=[images] if images else None, text=[prompt],
                                add_special_tokens=add_special_tokens, return_tensors="pt")
        return self._generate(inputs, max_new_tokens)

    def generate_ids(self, input_ids: list[int], images: list,
                     max_new_tokens: int) -> list[int]:
        """HF's greedy tokens for given token ids, the mask built by HF's processor helpers."""
        return self._generate(self._inputs(input_ids, images), max_new_tokens)

    def beams(self, input_ids: list[int], images: list, max_new_tokens: int,
              **gen) -> list[tuple[list[int], float]]:
        """HF's beam search hypotheses (generated tokens, sequences_scores), best first."""
        inputs = self._inputs(input_ids, images)
        with torch.no_grad():
            out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                      output_scores=True, return_dict_in_generate=True, **gen)
        n = inputs["input_ids"].shape[1]
        return list(zip(out.sequences[:, n:].tolist(), out.sequences_scores.tolist()))

    def _inputs(self, input_ids: list[int], images: list) -> dict:
        from transformers.models.mllama.processing_mllama import (
            convert_sparse_cross_attention_mask_to_dense,
            get_cross_attention_token_mask,
        )

        inputs = {"input_ids": torch.tensor([input_ids]),
                  "attention_mask": torch.ones(1, len(input_ids), dtype=torch.long)}
        if images:
            pix = self.processor.image_processor(images=[images], return_tensors="pt")
            num_tiles = pix.pop("num_tiles")
            tokens = get_cross_attention_token_mask(input_ids, self.processor.image_token_id)
            mask = convert_sparse_cross_attention_mask_to_dense(
                [tokens], num_tiles, self.processor.image_processor.max_image_tiles,
                len(input_ids))
            inputs.update(pix, cross_attention_mask=torch.tensor(mask))
        return inputs

    def _generate(self, inputs, max_new_tokens: int) -> list[int]:
        with torch.no_grad():
            out = self.model.generate(**inputs, max_new_tokens=max_new_tokens,
                                      do_sample=False, num_beams=1)
        return out[0, inputs["input_ids"].shape[1]:].tolist()
