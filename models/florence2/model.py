"""Florence-2: a DaViT vision tower whose projected features, followed by the task prompt's
token embeddings, are the input of a BART encoder-decoder (the BART family's blocks, learned
positions over the whole input, no final_logits_bias).

An encoder input is one image and its prompt (`encoders.image_prompt.ImagePrompt`, packed by
its `batch` as an `ImagePromptBatch`): the encoder reads [image tokens, prompt tokens] as one
sequence, exactly where HF's processor puts the image's placeholder tokens (first, before the
prompt's BOS). The decoder, its cross-attention and the head are BART's.

Tensor parallelism splits the language model as BART's (models/bart/model.py); the vision
tower and the projector are whole on every rank, each of which runs them on the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from seq2serve.models.bart.model import BartForConditionalGeneration
from seq2serve.models.bart.positions import segment_positions
from seq2serve.models.family import ModelFamily
from seq2serve.models.florence2 import original_layout
from seq2serve.models.florence2.config import Florence2Config
from seq2serve.models.florence2.vision import DaViT, ImageProjector
from seq2serve.models.florence2.weights import hf_to_param, load_priority

if TYPE_CHECKING:
    from seq2serve.runtime.attention.forward_batch import EncodeForwardBatch, ForwardBatch

_HEAD = "language_model.lm_head.weight"
WARM_SIDE = 768  # the image side compile_encoder compiles for


class Florence2ForConditionalGeneration(ModelFamily):
    config_class = Florence2Config
    tensor_parallel = True  # the language model's layers (BART's); the vision tower whole

    def __init__(self, cfg: Florence2Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.vision_tower = DaViT(cfg.vision)
        self._compiled_tower: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.multi_modal_projector = ImageProjector(cfg.vision)
        self.language_model = BartForConditionalGeneration(cfg.text)

    # --- the encoder stage -------------------------------------------------------------------
    def encode(self, fb: EncodeForwardBatch) -> torch.Tensor:
        """Each input's image tokens, then its prompt's embeddings, through BART's encoder;
        a text-only batch (the start-up warm-up's) is BART's text encoder, as HF without
        pixel_values."""
        lm, batch = self.language_model, fb.model_input
        if batch is None:
            return lm.encode(fb)
        assert fb.token_ids is None, "Florence-2's inputs are images with their prompts"
        dtype = self.multi_modal_projector.image_projection.weight.dtype
        tower = self._compiled_tower or self.vision_tower
        images = self.multi_modal_projector(tower(batch.pixel_values.to(dtype)))
        text = lm.shared(batch.token_ids) * lm.embed_scale
        parts = []
        for image, prompt in zip(images, text.split(batch.text_lens)):
            parts += [image, prompt]
        x = torch.cat(parts)
        assert x.shape[0] == sum(fb.segment_lens), "an image's token count differs from its size's"
        rows = segment_positions(fb.segment_lens, x.device) + lm.encoder_positions.offset
        return lm.encode_embeddings(x, rows, fb)

    def compile_encoder(self) -> bool:
        """The vision tower (on an H200, 6.4 of the encoder stage's ~8 ms an image, and half
        of its eager CUDA time elementwise kernels that inductor fuses: 4.5 ms an image
        compiled, benchmarks/bench_florence_vision.py) as one graph for every batch size,
        compiled now on 768x768 images (every Florence-2 processor's size; another size
        compiles on first use)."""
        compiled = torch.compile(self.vision_tower)

        def tower(pixels: torch.Tensor) -> torch.Tensor:
            if pixels.shape[0] > 1:  # (one image is a graph of its own: size 1 specializes)
                torch._dynamo.mark_dynamic(pixels, 0)
            return compiled(pixels)

        weight = self.multi_modal_projector.image_projection.weight
        with torch.inference_mode():
            for images in (1, 2):
                tower(torch.zeros(images, self.cfg.vision.in_channels, WARM_SIDE, WARM_SIDE,
                                  dtype=weight.dtype, device=weight.device))
        self._compiled_tower = tower
        return True

    def store_cross_kv(self, encoder_hidden: torch.Tensor, fb: EncodeForwardBatch) -> None:
        self.language_model.store_cross_kv(encoder_hidden, fb)

    # --- the decoder: BART's -----------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                fb: ForwardBatch) -> torch.Tensor:
        return self.language_model(input_ids, positions, fb)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.language_model.compute_logits(hidden)

    # --- weights -----------------------------------------------------------------------------
    def weight_map(self, name: str) -> list[tuple[str, int | None]] | None:
        return hf_to_param(name, self.cfg)

    load_priority = staticmethod(load_priority)

    def convert_tensor(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """The original layout's projection is stored transposed (`original_layout.py`)."""
        return original_layout.as_stored(name, tensor) if self.cfg.original_layout else tensor

    def tie_missing(self, missing: set[str]) -> set[str]:
        """The head shares the decoder's embedding where the checkpoint has none and
        config.json's (top-level) tie_word_embeddings allows (under tensor parallelism: this
        rank's vocabulary rows of both)."""
        if _HEAD in missing and self.cfg.tie_head:
            lm = self.language_model
            embed = lm.shared if lm.decoder_embed is None else lm.decoder_embed
            lm.lm_head.weight = embed.weight
            missing = missing - {_HEAD}
        return missing

    def init_buffers(self) -> None:
        self.language_model.init_buffers()
