"""The T5Gemma configuration (`T5GemmaForConditionalGeneration`), normalized from a Hugging
Face config.json: two Gemma 2 stacks, an encoder and a decoder, each with its own sub-config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seq2serve.models.family import FamilyConfig
from seq2serve.runtime.kernels.activations import ACTIVATIONS


@dataclass(frozen=True)
class GemmaStack:
    """One stack's shape and attention: GQA with RoPE, a sliding window on some layers, the
    attention logits soft-capped."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    activation: str  # a name in activations.ACTIVATIONS (the gate's)
    rms_norm_eps: float
    rope_theta: float
    query_pre_attn_scalar: float  # scores are scaled by its inverse square root
    sliding_window: int | None
    sliding_layers: tuple[bool, ...]  # per layer: a sliding-window layer (else full)
    attn_softcap: float | None  # tanh soft-cap of the attention logits
    max_position_embeddings: int

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], what: str) -> GemmaStack:
        for key in ("hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads"):
            if key not in cfg:
                raise ValueError(f"config.json: {what} is missing {key!r}")
        if cfg.get("attention_bias"):
            raise ValueError(f"config.json: {what}.attention_bias is not supported")
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"config.json: {what}'s rope type {rope.get('rope_type')!r} is "
                             "not supported (only the default RoPE)")
        activation = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
        if activation not in ACTIVATIONS:
            raise ValueError(f"config.json: {what}: unsupported activation {activation!r}")
        layers, heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
        types = cfg.get("layer_types") or [
            "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
        if len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
            raise ValueError(f"config.json: {what}.layer_types must name {layers} layers as "
                             f"'sliding_attention' or 'full_attention', got {types!r}")
        window = cfg.get("sliding_window", 4096)
        if window is not None and window < 1:
            raise ValueError(f"config.json: {what}.sliding_window must be >= 1, got {window}")
        sliding = tuple(t == "sliding_attention" and window is not None for t in types)
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        return cls(
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            activation=activation,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar", 256)),
            sliding_window=window,
            sliding_layers=sliding,
            attn_softcap=cfg.get("attn_logit_softcapping", 50.0) or None,
            max_position_embeddings=cfg.get("max_position_embeddings", 8192),
        )

    def window(self, layer: int) -> int | None:
        """Layer `layer`'s sliding window (HF's `sliding_window`), None for a full layer."""
        return self.sliding_window if self.sliding_layers[layer] else None


@dataclass(frozen=True)
class T5GemmaConfig(FamilyConfig):
    encoder: GemmaStack
    decoder: GemmaStack
    vocab_size: int
    final_logit_softcap: float | None  # tanh soft-cap of the logits
    tie_word_embeddings: bool  # lm_head shares the decoder's embedding
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    decoder_start_token_id: int  # the decoder's BOS (HF's generate starts from it)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> T5GemmaConfig:
        for key in ("encoder", "decoder"):
            if not isinstance(cfg.get(key), dict):
                raise ValueError(f"config.json: T5Gemma needs an {key!r} sub-config")
        dec_cfg = cfg["decoder"]
        encoder = GemmaStack.from_hf(cfg["encoder"], "encoder")
        decoder = GemmaStack.from_hf(dec_cfg, "decoder")
        vocab = dec_cfg.get("vocab_size") or cfg.get("vocab_size")
        if vocab is None:
            raise ValueError("config.json: decoder is missing 'vocab_size'")
        eos = cfg.get("eos_token_id", dec_cfg.get("eos_token_id", 1))
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        bos = cfg.get("decoder_start_token_id")
        if bos is None:
            bos = cfg.get("bos_token_id", dec_cfg.get("bos_token_id"))
        if bos is None:
            raise ValueError("config.json: T5Gemma's decoder starts from its bos_token_id, "
                             "and none is set")
        pad = cfg.get("pad_token_id", dec_cfg.get("pad_token_id", 0))
        return cls(
            encoder=encoder,
            decoder=decoder,
            vocab_size=int(vocab),
            final_logit_softcap=dec_cfg.get("final_logit_softcapping", 30.0) or None,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            eos_token_ids=tuple(int(e) for e in eos_ids),
            pad_token_id=0 if pad is None else int(pad),
            decoder_start_token_id=int(bos),
        )

    # What the runtime needs to size its pools: the decoder's self and cross K/V share its
    # heads (the cross K/V are projected from the encoder's width to the decoder's heads).
    is_encoder_decoder = True

    @property
    def num_self_attn_layers(self) -> int:
        return self.decoder.num_layers

    @property
    def num_cross_attn_layers(self) -> int:
        return self.decoder.num_layers

    @property
    def num_kv_heads(self) -> int:
        return self.decoder.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.decoder.head_dim

    @property
    def max_length(self) -> int:
        return self.decoder.max_position_embeddings

    @property
    def max_encoder_length(self) -> int:
        return self.encoder.max_position_embeddings
