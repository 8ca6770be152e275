"""The Llama (3.x) configuration, normalized from a Hugging Face config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seq2serve.models.family import FamilyConfig


@dataclass(frozen=True)
class LlamaConfig(FamilyConfig):
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    hidden_act: str
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> LlamaConfig:
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads"):
            if key not in cfg:
                raise ValueError(f"config.json is missing {key!r}")
        if cfg.get("attention_bias") or cfg.get("mlp_bias"):
            raise ValueError("config.json: attention_bias / mlp_bias are not supported")
        heads = cfg["num_attention_heads"]
        # transformers 5 keeps theta and scaling together in rope_parameters
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", None) or cfg.get("rope_theta", 10000.0)
        if rope.get("rope_type", rope.get("type", "default")) == "default":
            rope = None
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=rope,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            hidden_act=cfg.get("hidden_act", "silu"),
            eos_token_ids=tuple(int(e) for e in eos_ids),
            bos_token_id=cfg.get("bos_token_id"),
        )

    # What the runtime needs to size its pools.
    is_encoder_decoder = False
    num_cross_attn_layers = 0

    @property
    def num_self_attn_layers(self) -> int:
        return self.num_hidden_layers

    @property
    def num_kv_heads(self) -> int:
        return self.num_key_value_heads

    @property
    def max_length(self) -> int:
        return self.max_position_embeddings
