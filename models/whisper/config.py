"""Whisper's configuration (`WhisperForConditionalGeneration`), normalized from a Hugging Face
config.json, and the fixed shape of its input: 30 s of 16 kHz audio as log-mel frames."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seq2serve.models.bart.config import Family, _ids, _req, stack_fields
from seq2serve.models.family import DecoderStacks

# Whisper's blocks are the BART family's pre-LayerNorm blocks (models/bart/model.py), with
# learned positions, a final norm on each stack and no logits bias.
WHISPER_FAMILY = Family(pre_norm=True, embed_norm=False, final_norm=True, positions="learned",
                        logits_bias=False, never_pad=False)

SAMPLING_RATE = 16_000
CHUNK_SECONDS = 30
HOP_LENGTH = 160
N_FFT = 400
N_SAMPLES = SAMPLING_RATE * CHUNK_SECONDS  # one window: 480,000 samples
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3,000 log-mel frames; the conv front end halves them


@dataclass(frozen=True)
class WhisperConfig(DecoderStacks):
    vocab_size: int
    num_mel_bins: int  # 80, or 128 (large-v3)
    d_model: int
    encoder_layers: int
    decoder_layers: int
    encoder_attention_heads: int
    decoder_attention_heads: int
    encoder_ffn_dim: int
    decoder_ffn_dim: int
    activation: str  # a name in activations.ACTIVATIONS
    max_source_positions: int  # encoder frames after the conv front end (1,500 for 30 s)
    max_target_positions: int  # the decoder's learned positions (448)
    tie_word_embeddings: bool  # proj_out shares the decoder's embedding
    pad_token_id: int
    eos_token_ids: tuple[int, ...]
    decoder_start_token_id: int  # <|startoftranscript|>
    suppress_tokens: tuple[int, ...] = ()  # config.json's (generation_config.json's win)
    begin_suppress_tokens: tuple[int, ...] = ()

    family = WHISPER_FAMILY
    model_type = "whisper"

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> WhisperConfig:
        frames = cfg.get("max_source_positions", 1500)
        if frames * 2 != N_FRAMES:
            raise ValueError(f"config.json: max_source_positions {frames}; Whisper's encoder "
                             f"reads 30 s windows ({N_FRAMES // 2} positions)")
        eos = cfg.get("eos_token_id", 50257)
        eos_ids = eos if isinstance(eos, list) else [eos]
        return cls(
            vocab_size=_req(cfg, "vocab_size"),
            num_mel_bins=cfg.get("num_mel_bins", 80),
            **stack_fields(cfg),
            max_source_positions=frames,
            max_target_positions=cfg.get("max_target_positions", 448),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            pad_token_id=int(cfg.get("pad_token_id", eos_ids[0])),
            eos_token_ids=tuple(int(e) for e in eos_ids if e is not None),
            decoder_start_token_id=int(cfg.get("decoder_start_token_id", 50258)),
            suppress_tokens=_ids(cfg.get("suppress_tokens")),
            begin_suppress_tokens=_ids(cfg.get("begin_suppress_tokens")),
        )

    @property
    def max_length(self) -> int:
        return self.max_target_positions

    @property
    def max_encoder_length(self) -> int:
        """One 30 s window's cross K/V per request."""
        return self.max_source_positions

    def frontend_info(self) -> dict[str, Any]:
        """What the TokenizerManager needs to turn audio into the encoder's input."""
        return {"has_audio": True, "num_mel_bins": self.num_mel_bins,
                "audio_tokens": self.max_source_positions}
