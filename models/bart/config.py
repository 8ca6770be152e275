"""The BART family's configuration (BART, Marian / OPUS-MT, M2M100 / NLLB-200, mBART-50,
Pegasus), normalized from a Hugging Face config.json.

The five families share one transformer (post- or pre-LayerNorm blocks with biased linears,
no relative bias) and differ in a few switches, which `FAMILIES` names per `model_type`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seq2serve.models.family import DecoderStacks
from seq2serve.runtime.kernels.activations import ACTIVATIONS


@dataclass(frozen=True)
class Family:
    pre_norm: bool  # LayerNorm before each sublayer (mBART, M2M100, Pegasus) or after the add
    embed_norm: bool  # a LayerNorm right after the embeddings (mBART's layernorm_embedding)
    final_norm: bool  # a LayerNorm at the end of each stack
    positions: str  # "marian" / "fairseq" sinusoids (offset 0 / 2), or "learned" (offset 2)
    logits_bias: bool  # final_logits_bias is added to the logits
    never_pad: bool  # the pad token is never generated (Marian: it is the decoder start)


FAMILIES = {
    "bart": Family(pre_norm=False, embed_norm=True, final_norm=False, positions="learned",
                   logits_bias=True, never_pad=False),
    "marian": Family(pre_norm=False, embed_norm=False, final_norm=False, positions="marian",
                     logits_bias=True, never_pad=True),
    "m2m_100": Family(pre_norm=True, embed_norm=False, final_norm=True, positions="fairseq",
                      logits_bias=False, never_pad=False),
    "mbart": Family(pre_norm=True, embed_norm=True, final_norm=True, positions="learned",
                    logits_bias=True, never_pad=False),
    # mBART's blocks without layernorm_embedding, on Marian's sinusoids; pad starts the decoder
    "pegasus": Family(pre_norm=True, embed_norm=False, final_norm=True, positions="marian",
                      logits_bias=True, never_pad=False),
}


@dataclass(frozen=True)
class BartConfig(DecoderStacks):
    model_type: str  # a key of FAMILIES
    family: Family
    vocab_size: int  # the encoder's and the decoder's
    share_embeddings: bool  # one embedding for encoder and decoder (Marian's flag)
    d_model: int
    encoder_layers: int
    decoder_layers: int
    encoder_attention_heads: int
    decoder_attention_heads: int
    encoder_ffn_dim: int
    decoder_ffn_dim: int
    activation: str  # a name in activations.ACTIVATIONS
    max_position_embeddings: int
    scale_embedding: bool  # embeddings times sqrt(d_model)
    tie_word_embeddings: bool  # lm_head shares the decoder's embedding unless the checkpoint has one
    pad_token_id: int
    eos_token_ids: tuple[int, ...]
    decoder_start_token_id: int
    forced_bos_token_id: int | None  # the first generated token HF forces, if any
    forced_eos_token_ids: tuple[int, ...] = ()  # HF forces one as the last token (max length)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> BartConfig:
        model_type = cfg.get("model_type")
        if model_type not in FAMILIES:
            raise ValueError(f"config.json: model_type {model_type!r} is not one of "
                             f"{', '.join(sorted(FAMILIES))}")
        share = bool(cfg.get("share_encoder_decoder_embeddings", True))
        vocab = _req(cfg, "vocab_size")
        if cfg.get("decoder_vocab_size") not in (None, vocab):
            raise ValueError(f"config.json: decoder_vocab_size {cfg['decoder_vocab_size']} "
                             f"differs from vocab_size {vocab}; separate source and target "
                             f"vocabularies are not supported")
        pad = cfg.get("pad_token_id")
        if pad is None:
            raise ValueError("config.json is missing 'pad_token_id'")
        eos = cfg.get("eos_token_id", 2)
        eos_ids = tuple(eos) if isinstance(eos, list) else (eos,)
        start = cfg.get("decoder_start_token_id")
        return cls(
            model_type=model_type,
            family=FAMILIES[model_type],
            vocab_size=vocab,
            share_embeddings=share,
            **stack_fields(cfg),
            max_position_embeddings=cfg.get("max_position_embeddings", 1024),
            scale_embedding=bool(cfg.get("scale_embedding", False)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            pad_token_id=int(pad),
            eos_token_ids=tuple(int(e) for e in eos_ids if e is not None),
            decoder_start_token_id=int(start if start is not None else eos_ids[0]),
            forced_bos_token_id=cfg.get("forced_bos_token_id"),
            forced_eos_token_ids=_ids(cfg.get("forced_eos_token_id")),
        )

    @property
    def decoder_shares_embedding(self) -> bool:
        """One embedding for both stacks: Marian's share_encoder_decoder_embeddings, and tied
        (transformers 5 unties the stacks' embed_tokens from `shared` with the head)."""
        return self.share_embeddings and self.tie_word_embeddings

    @property
    def max_length(self) -> int:
        return self.max_position_embeddings

    @property
    def suppressed_token_ids(self) -> tuple[int, ...]:
        """Tokens never generated: Marian's pad, which starts its decoder."""
        return (self.pad_token_id,) if self.family.never_pad else ()


def stack_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """The encoder and decoder stacks' sizes and activation, as BART-named config.json keys
    give them (BART, Marian, M2M100, mBART, Whisper), checked."""
    activation = cfg.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise ValueError(f"config.json: unsupported activation_function {activation!r}")
    d_model = _req(cfg, "d_model")
    for key in ("encoder_attention_heads", "decoder_attention_heads"):
        if d_model % _req(cfg, key):
            raise ValueError(f"config.json: d_model {d_model} is not a multiple of "
                             f"{key} {cfg[key]}")
    keys = ("encoder_layers", "decoder_layers", "encoder_attention_heads",
            "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim")
    return {"d_model": d_model, "activation": activation, **{k: _req(cfg, k) for k in keys}}


def _ids(value: Any) -> tuple[int, ...]:
    """A token id field that may be one id, a list of them, or null."""
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list) else [value]))


def _req(cfg: dict[str, Any], key: str) -> Any:
    if key not in cfg:
        raise ValueError(f"config.json is missing {key!r}")
    return cfg[key]
