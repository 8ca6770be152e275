"""The Mllama (Llama 3.2 Vision) configuration: a vision tower and a Llama text model whose
layers at `cross_attention_layers` are gated cross-attention blocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seq2serve.models.family import FamilyConfig
from seq2serve.models.llama.config import LlamaConfig


@dataclass(frozen=True)
class MllamaVisionConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_global_layers: int
    attention_heads: int
    num_channels: int
    image_size: int
    patch_size: int
    norm_eps: float
    max_num_tiles: int
    max_aspect_ratio_id: int
    intermediate_layers_indices: tuple[int, ...]
    vision_output_dim: int
    hidden_act: str

    @property
    def num_patches(self) -> int:
        """Tokens per tile: one per patch plus the class token."""
        return (self.image_size // self.patch_size) ** 2 + 1

    @classmethod
    def from_hf(cls, v: dict[str, Any]) -> MllamaVisionConfig:
        image_size = v.get("image_size", 448)
        patch_size = v.get("patch_size", 14)
        if isinstance(image_size, (list, tuple)):
            image_size = image_size[0]
        if isinstance(patch_size, (list, tuple)):
            patch_size = patch_size[0]
        ratios = v.get("supported_aspect_ratios") or [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1],
                                                      [2, 2], [3, 1], [4, 1]]
        hidden = v.get("hidden_size", 1280)
        indices = tuple(v.get("intermediate_layers_indices") or (3, 7, 15, 23, 30))
        return cls(
            hidden_size=hidden,
            intermediate_size=v.get("intermediate_size", 5120),
            num_hidden_layers=v.get("num_hidden_layers", 32),
            num_global_layers=v.get("num_global_layers", 8),
            attention_heads=v.get("attention_heads", v.get("num_attention_heads", 16)),
            num_channels=v.get("num_channels", 3),
            image_size=image_size,
            patch_size=patch_size,
            norm_eps=v.get("norm_eps", 1e-5),
            max_num_tiles=v.get("max_num_tiles", 4),
            max_aspect_ratio_id=len(ratios),
            intermediate_layers_indices=indices,
            vision_output_dim=v.get("vision_output_dim", hidden * (len(indices) + 1)),
            hidden_act=v.get("hidden_act", "gelu"),
        )


@dataclass(frozen=True)
class MllamaConfig(FamilyConfig):
    text: LlamaConfig
    vision: MllamaVisionConfig
    cross_attention_layers: tuple[int, ...]
    image_token_id: int

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> MllamaConfig:
        if "text_config" not in cfg or "vision_config" not in cfg:
            raise ValueError("config.json: Mllama needs text_config and vision_config")
        t = dict(cfg["text_config"])
        t.setdefault("rope_theta", 500000.0)
        t.setdefault("eos_token_id", 128001)
        layers = tuple(t.get("cross_attention_layers") or (3, 8, 13, 18, 23, 28, 33, 38))
        return cls(text=LlamaConfig.from_hf(t), vision=MllamaVisionConfig.from_hf(
            cfg["vision_config"]), cross_attention_layers=layers,
            image_token_id=cfg.get("image_token_index", 128256))

    # What the runtime needs to size its pools.
    is_encoder_decoder = False  # the prompt goes to the decoder; images to the encoder

    @property
    def vocab_size(self) -> int:
        return self.text.vocab_size

    @property
    def input_vocab_size(self) -> int:
        """Prompt token ids may also be the <|image|> token, just past the vocabulary."""
        return max(self.text.vocab_size, self.image_token_id + 1)

    def frontend_info(self) -> dict[str, Any]:
        """What the TokenizerManager needs to preprocess images and place them in the prompt
        (sent with the scheduler's info at start-up)."""
        return {"has_vision": True, "image_token_id": self.image_token_id,
                "tokens_per_tile": self.vision.num_patches}

    def default_max_encoder_len(self, max_images: int) -> int:
        """Cross K/V of `max_images` images of the most tiles."""
        return max_images * self.vision.max_num_tiles * self.vision.num_patches

    @property
    def num_self_attn_layers(self) -> int:
        return self.text.num_hidden_layers - len(self.cross_attention_layers)

    @property
    def num_cross_attn_layers(self) -> int:
        return len(self.cross_attention_layers)

    @property
    def num_kv_heads(self) -> int:
        return self.text.num_key_value_heads

    @property
    def head_dim(self) -> int:
        return self.text.head_dim

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.text.eos_token_ids

    @property
    def max_length(self) -> int:
        return self.text.max_position_embeddings
