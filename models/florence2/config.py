"""The Florence-2 configuration: a DaViT vision tower (`vision_config`) whose projected
features, with the task prompt's token embeddings after them, are the input of a BART
encoder-decoder (`text_config`, the BART family's "bart" blocks)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from seq2serve.models.bart.config import BartConfig
from seq2serve.models.family import FamilyConfig
from seq2serve.models.florence2.original_layout import convert_config, is_original
from seq2serve.models.florence2.tasks import TASKS, TASKS_WITH_INPUT
from seq2serve.runtime.kernels.activations import ACTIVATIONS

# config.json's vision_config defaults (HF's Florence2VisionConfig: Florence-2-base's tower)
_VISION_DEFAULTS = dict(in_channels=3, depths=(1, 1, 9, 1), patch_size=(7, 3, 3, 3),
                        patch_stride=(4, 2, 2, 2), patch_padding=(3, 1, 1, 1),
                        patch_prenorm=(False, True, True, True), embed_dim=(128, 256, 512, 1024),
                        num_heads=(4, 8, 16, 32), num_groups=(4, 8, 16, 32), window_size=12,
                        mlp_ratio=4.0, qkv_bias=True, activation_function="gelu",
                        projection_dim=1024, max_position_embeddings=50,
                        max_temporal_embeddings=100)
_STAGE_FIELDS = ("depths", "patch_size", "patch_stride", "patch_padding", "patch_prenorm",
                 "embed_dim", "num_heads", "num_groups")


@dataclass(frozen=True)
class Florence2VisionConfig:
    in_channels: int
    depths: tuple[int, ...]  # blocks per stage; every per-stage field has one entry a stage
    patch_size: tuple[int, ...]  # each stage's patch-embedding convolution
    patch_stride: tuple[int, ...]
    patch_padding: tuple[int, ...]
    patch_prenorm: tuple[bool, ...]  # its LayerNorm before the convolution (else after)
    embed_dim: tuple[int, ...]
    num_heads: tuple[int, ...]  # window attention's heads
    num_groups: tuple[int, ...]  # channel attention's groups
    window_size: int
    mlp_ratio: float
    qkv_bias: bool
    activation_function: str
    projection_dim: int  # the projector's output: the language model's d_model
    max_position_embeddings: int  # rows (and columns) of the 2-D position table
    max_temporal_embeddings: int

    @classmethod
    def from_hf(cls, v: dict[str, Any]) -> Florence2VisionConfig:
        kw = {k: v.get(k, d) for k, d in _VISION_DEFAULTS.items()}
        kw.update({k: tuple(kw[k]) for k in _STAGE_FIELDS})
        if len({len(kw[k]) for k in _STAGE_FIELDS}) != 1:
            raise ValueError(f"config.json: vision_config's per-stage fields "
                             f"({', '.join(_STAGE_FIELDS)}) differ in length")
        if kw["activation_function"] not in ACTIVATIONS:
            raise ValueError(f"config.json: vision_config.activation_function "
                             f"{kw['activation_function']!r} is not supported")
        for dim, heads, groups in zip(kw["embed_dim"], kw["num_heads"], kw["num_groups"]):
            if dim % heads or dim % groups:
                raise ValueError(f"config.json: vision_config.embed_dim {dim} is not a "
                                 f"multiple of its num_heads {heads} and num_groups {groups}")
        return cls(**kw)

    @property
    def stages(self) -> list[tuple[int, int, int]]:
        """(kernel, stride, padding) of each stage's patch convolution."""
        return list(zip(self.patch_size, self.patch_stride, self.patch_padding))


@dataclass(frozen=True)
class Florence2Config(FamilyConfig):
    text: BartConfig  # the language model, without BART's final_logits_bias
    vision: Florence2VisionConfig
    image_token_id: int  # the processor's placeholder for the image's features
    tie_head: bool  # lm_head shares the decoder's embedding (config.json's tie_word_embeddings)
    # the checkpoint is in the original Hub layout (microsoft/Florence-2-*), not transformers 5's
    original_layout: bool = False

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> Florence2Config:
        if "text_config" not in cfg or "vision_config" not in cfg:
            raise ValueError("config.json: Florence-2 needs text_config and vision_config")
        original = is_original(cfg)
        if original:
            cfg = convert_config(cfg)
        text = dict(cfg["text_config"])
        text.setdefault("model_type", "bart")
        if text["model_type"] != "bart":
            raise ValueError(f"config.json: text_config.model_type {text['model_type']!r}; "
                             f"Florence-2's language model is BART")
        bart = BartConfig.from_hf(text)
        # Florence-2's head has no final_logits_bias
        bart = dataclasses.replace(bart, family=dataclasses.replace(bart.family,
                                                                    logits_bias=False))
        vision = Florence2VisionConfig.from_hf(cfg["vision_config"])
        if vision.projection_dim != bart.d_model:
            raise ValueError(f"config.json: vision_config.projection_dim "
                             f"{vision.projection_dim} differs from text_config.d_model "
                             f"{bart.d_model}")
        return cls(text=bart, vision=vision, image_token_id=int(cfg.get("image_token_id", 51289)),
                   tie_head=bool(cfg.get("tie_word_embeddings", True)),
                   original_layout=original)

    # --- the pool shape: the language model's ----------------------------------------------
    is_encoder_decoder = True

    @property
    def vocab_size(self) -> int:
        return self.text.vocab_size

    @property
    def input_vocab_size(self) -> int:
        """Prompt ids may hold the image placeholder (HF's processor puts it first)."""
        return max(self.text.vocab_size, self.image_token_id + 1)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.text.eos_token_ids

    @property
    def num_self_attn_layers(self) -> int:
        return self.text.num_self_attn_layers

    @property
    def num_cross_attn_layers(self) -> int:
        return self.text.num_cross_attn_layers

    @property
    def num_kv_heads(self) -> int:
        return self.text.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.text.head_dim

    @property
    def max_length(self) -> int:
        return self.text.max_length

    @property
    def decoder_start_token_id(self) -> int:
        return self.text.decoder_start_token_id

    @property
    def forced_bos_token_id(self) -> int | None:
        return self.text.forced_bos_token_id

    @property
    def forced_eos_token_ids(self) -> tuple[int, ...]:
        return self.text.forced_eos_token_ids

    def frontend_info(self) -> dict[str, Any]:
        """What the TokenizerManager needs: the image's token count comes from its processed
        size through the tower's patch convolutions (`stages`, plus the projector's one pooled
        token), within the 2-D position table's rows and columns; the task tokens and the
        prompts they stand for (HF's Florence2Processor's)."""
        return {"has_vision": True, "image_prompt": True, "image_token_id": self.image_token_id,
                "image_stages": self.vision.stages, "image_extra_tokens": 1,
                "image_max_grid": self.vision.max_position_embeddings,
                "task_prompts": dict(TASKS), "task_prompts_with_input": dict(TASKS_WITH_INPUT)}
