"""Whisper (`WhisperForConditionalGeneration`): a convolutional front end and a transformer
encoder over 30 s of log-mel frames, and a text decoder with cross-attention.

The blocks are the BART family's pre-LayerNorm blocks (`models/bart/model.py`): Whisper's
attention has no key bias, which its checkpoint simply lacks (the fused q/k/v bias keeps a
zero k part). The encoder stage runs `encode` over a batch of windows (`AudioBatch`: log-mel
features, each window 1,500 positions after the stride-2 convolution) and writes each
decoder layer's cross K/V once; the decoder reads them through the runtime's cross-attention
pool as every encoder-decoder family does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from seq2serve.models.bart.model import BartDecoderLayer, BartEncoderLayer, _embedding
from seq2serve.models.device_copy import to_device
from seq2serve.models.family import ModelFamily
from seq2serve.models.linear import Linear
from seq2serve.models.norm import LayerNorm
from seq2serve.models.whisper.config import N_SAMPLES, WhisperConfig
from seq2serve.models.whisper.log_mel import LogMel
from seq2serve.models.whisper.weights import hf_to_param

if TYPE_CHECKING:
    from seq2serve.runtime.attention.forward_batch import EncodeForwardBatch, ForwardBatch


@dataclass
class WindowBatch:
    """The windows of one ENCODE batch, as the encoder reads them (the encoder stage builds it
    from the requests' `encoders/audio_features.AudioFeatures`)."""

    samples: torch.Tensor  # [windows, 480,000] float32: 30 s at 16 kHz, zero-padded
    # each window's first log-mel frame (HF's `seek`: a re-decode from a segment's end); the
    # frames before it are dropped and 0.0 frames appended (HF's `_get_input_segment`); ()
    # when every window reads from frame 0
    seeks: tuple[int, ...] = ()

    def to(self, device: str) -> WindowBatch:
        return WindowBatch(to_device(self.samples, device), self.seeks)


class WhisperForConditionalGeneration(ModelFamily):
    config_class = WhisperConfig
    # the blocks' heads and feed-forward channels split over ranks (models/parallel_state.py);
    # the convolutions, embeddings and LM head are whole on every rank
    tensor_parallel = True

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.log_mel = LogMel(cfg.num_mel_bins)
        self.conv1 = nn.Conv1d(cfg.num_mel_bins, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        for p in (*self.conv1.parameters(), *self.conv2.parameters()):
            p.requires_grad_(False)
        self.encoder_positions = nn.Parameter(torch.empty(cfg.max_source_positions, d),
                                              requires_grad=False)
        self.encoder_layers = nn.ModuleList(BartEncoderLayer(cfg)
                                            for _ in range(cfg.encoder_layers))
        self.encoder_norm = LayerNorm(d)
        self.embed_tokens = _embedding(cfg.vocab_size, d)
        self.decoder_positions = nn.Parameter(torch.empty(cfg.max_target_positions, d),
                                              requires_grad=False)
        self.decoder_layers = nn.ModuleList(BartDecoderLayer(cfg, i)
                                            for i in range(cfg.decoder_layers))
        self.decoder_norm = LayerNorm(d)
        self.lm_head = Linear(d, cfg.vocab_size)  # HF's proj_out

    # --- the encoder stage -------------------------------------------------------------------
    def encode(self, fb: EncodeForwardBatch) -> torch.Tensor:
        """The encoder over a batch of windows (`fb.model_input`: a `WindowBatch` of samples);
        the log-mel features computed here, on the model's device, in float32 (HF's
        extractor's); returns hidden states [windows * 1500, d_model]."""
        feats = _seeked(self.log_mel(fb.model_input.samples.float()), fb.model_input.seeks)
        feats = feats.to(self.conv1.weight.dtype)
        x = F.gelu(self.conv1(feats))
        x = F.gelu(self.conv2(x)).transpose(1, 2)  # [windows, 1500, d_model]
        x = (x + self.encoder_positions).reshape(-1, self.cfg.d_model)
        for layer in self.encoder_layers:
            x = layer(x, fb)
        return self.encoder_norm(x)

    def warm_encoder_input(self) -> tuple[WindowBatch, list[int]]:
        """One silent window (the model runner encodes it at start-up on CUDA, so the
        encoder's kernels compile before the first request)."""
        return WindowBatch(torch.zeros(1, N_SAMPLES)), [self.cfg.max_source_positions]

    def store_cross_kv(self, encoder_hidden: torch.Tensor, fb: EncodeForwardBatch) -> None:
        """Project the encoder output to each decoder layer's cross K/V, once."""
        for layer in self.decoder_layers:
            layer.cross_attn.store_kv(encoder_hidden, fb)

    # --- the decoder -------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                fb: ForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(input_ids) + self.decoder_positions[positions.long()]
        for layer in self.decoder_layers:
            x = layer(x, fb)
        return self.decoder_norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    # --- weights -----------------------------------------------------------------------------
    def weight_map(self, name: str) -> list[tuple[str, int | None]] | None:
        return hf_to_param(name, self.cfg)

    def tie_missing(self, missing: set[str]) -> set[str]:
        """proj_out tied to the decoder's embedding (when the config allows)."""
        return self.tie_lm_head(missing, self.embed_tokens, self.cfg.tie_word_embeddings)

    def absent_shards(self) -> list[tuple[str, int]]:
        """The key part of every fused attention bias: Whisper's k_proj has no bias, so no
        checkpoint fills it (`init_buffers` zeroes it)."""
        out = [(f"encoder_layers.{i}.self_attn.qkv.bias", 1)
               for i in range(self.cfg.encoder_layers)]
        for i in range(self.cfg.decoder_layers):
            out += [(f"decoder_layers.{i}.self_attn.qkv.bias", 1),
                    (f"decoder_layers.{i}.cross_attn.kv.bias", 0)]
        return out

    @torch.no_grad()
    def init_buffers(self) -> None:
        self.log_mel.init_buffers(self.conv1.weight.device)
        for name, shard in self.absent_shards():
            sizes = self.get_submodule(name.removesuffix(".bias")).shard_sizes  # this rank's
            self.get_parameter(name).narrow(0, sum(sizes[:shard]), sizes[shard]).zero_()


def _seeked(feats: torch.Tensor, seeks: tuple[int, ...]) -> torch.Tensor:
    """Each window's features from its seek on, zero-padded back to their frames."""
    if not any(seeks):
        return feats
    return torch.stack([F.pad(f[:, s:], (0, s)) if s else f
                        for f, s in zip(feats, seeks, strict=True)])
