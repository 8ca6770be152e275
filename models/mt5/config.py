"""The T5 v1.1 / mT5 / UMT5 configuration, normalized from a Hugging Face config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seq2serve.models.family import FamilyConfig
from seq2serve.runtime.kernels.activations import ACTIVATIONS


@dataclass(frozen=True)
class T5Config(FamilyConfig):
    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_decoder_layers: int
    num_heads: int
    relative_attention_num_buckets: int
    relative_attention_max_distance: int
    layer_norm_epsilon: float
    activation: str  # a name in activations.ACTIVATIONS
    is_gated: bool  # gated feed-forward (wi_0, wi_1) vs plain (wi)
    tie_word_embeddings: bool  # lm_head shares the embedding unless the checkpoint carries one
    scale_decoder_outputs: bool  # multiply the decoder output by d_model**-0.5 before lm_head
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    decoder_start_token_id: int
    max_length: int | None = None  # n_positions when the config has one (informational for T5)
    bias_per_layer: bool = False  # UMT5: every self-attention layer has its own position bias

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> T5Config:
        ff = cfg.get("feed_forward_proj", "relu")
        parts = ff.split("-")
        if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
            raise ValueError(f"config.json: feed_forward_proj {ff!r} is not 'gated-ACT' or 'ACT'")
        activation = "gelu_new" if ff == "gated-gelu" else parts[-1]
        if activation not in ACTIVATIONS:
            raise ValueError(f"config.json: unsupported activation {activation!r} in {ff!r}")
        tie = cfg.get("tie_word_embeddings", True)
        # T5: transformers 5 writes scale_decoder_outputs explicitly; older configs imply it by
        # tying. mT5 (MT5ForConditionalGeneration) never scales: its released checkpoints are
        # untied, and transformers 5 writes every mT5 config tied (and forces the tie on load)
        # without scaling, so a tied mT5 config is no sign of T5 v1.0's scaled head. UMT5
        # scales as its config.json says it is tied (transformers 4, T5X); transformers 5
        # forces every UMT5 config tied, and so scales an untied one's logits too
        scale = cfg.get("scale_decoder_outputs", tie and cfg.get("model_type") != "mt5")
        eos = cfg.get("eos_token_id", 1)
        eos_ids = tuple(eos) if isinstance(eos, list) else (eos,)
        pad = cfg.get("pad_token_id", 0)
        start = cfg.get("decoder_start_token_id")
        num_layers = _req(cfg, "num_layers")
        return cls(
            vocab_size=_req(cfg, "vocab_size"),
            d_model=_req(cfg, "d_model"),
            d_kv=_req(cfg, "d_kv"),
            d_ff=_req(cfg, "d_ff"),
            num_layers=num_layers,
            num_decoder_layers=cfg.get("num_decoder_layers") or num_layers,
            num_heads=_req(cfg, "num_heads"),
            relative_attention_num_buckets=cfg.get("relative_attention_num_buckets", 32),
            relative_attention_max_distance=cfg.get("relative_attention_max_distance", 128),
            layer_norm_epsilon=cfg.get("layer_norm_epsilon", 1e-6),
            activation=activation,
            is_gated=parts[0] == "gated",
            tie_word_embeddings=bool(tie),
            scale_decoder_outputs=bool(scale),
            eos_token_ids=tuple(int(e) for e in eos_ids if e is not None),
            pad_token_id=0 if pad is None else int(pad),
            decoder_start_token_id=int(start if start is not None else (pad or 0)),
            max_length=cfg.get("n_positions"),
            bias_per_layer=cfg.get("model_type") == "umt5",
        )

    # What the runtime needs to size its pools.
    is_encoder_decoder = True

    @property
    def num_self_attn_layers(self) -> int:
        return self.num_decoder_layers

    @property
    def num_cross_attn_layers(self) -> int:
        return self.num_decoder_layers

    @property
    def num_kv_heads(self) -> int:
        return self.num_heads

    @property
    def head_dim(self) -> int:
        return self.d_kv


def _req(cfg: dict[str, Any], key: str) -> Any:
    if key not in cfg:
        raise ValueError(f"config.json is missing {key!r}")
    return cfg[key]
