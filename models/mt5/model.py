"""T5 v1.1 / mT5 (and original T5) and UMT5: an encoder stack and a decoder stack with
cross-attention.

Reads like the paper's diagram: pre-norm residual blocks, no attention scaling, one bucketed
relative position bias per stack shared by all its layers (UMT5: one per layer). Batching,
paging and caching are the runtime's: every layer gets the ForwardBatch and calls the
attention backend through it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from seq2serve.models import parallel_state
from seq2serve.models.attention import Attention
from seq2serve.models.block import pre_norm
from seq2serve.models.family import ModelFamily
from seq2serve.models.linear import ColumnParallelLinear, Linear, RowParallelLinear
from seq2serve.models.mlp import MLP, GatedMLP
from seq2serve.models.mt5.config import T5Config
from seq2serve.models.mt5.relative_position import RelativePositionBias
from seq2serve.models.mt5.weights import hf_to_param
from seq2serve.models.norm import RMSNorm
from seq2serve.models.vocab_parallel import embedding, lm_head
from seq2serve.runtime.attention.base import AttentionKind

if TYPE_CHECKING:
    from seq2serve.runtime.attention.forward_batch import EncodeForwardBatch, ForwardBatch


def _clamp_fp16(x: torch.Tensor) -> torch.Tensor:
    # T5 activations overflow float16; HF clamps the residual stream the same way
    if x.dtype == torch.float16:
        limit = torch.finfo(torch.float16).max - 1000
        x = x.clamp(-limit, limit)
    return x


def _pre_norm(norm: RMSNorm, x: torch.Tensor, h: torch.Tensor | None,
              proj: Linear | None = None):
    """block.pre_norm, (proj(norm(x + h)), x + h), but in float16 T5 clamps the residual
    stream after every add: the add runs (and is clamped) before the norm, not inside it."""
    if h is not None and x.dtype == torch.float16:
        x, h = _clamp_fp16(x + h), None
    return pre_norm(norm, x, h, proj)


def _heads(cfg: T5Config) -> int:
    """This tensor-parallel rank's attention heads."""
    return parallel_state.tensor_parallel().shard(cfg.num_heads, "attention heads")


class T5SelfAttention(nn.Module):
    def __init__(self, cfg: T5Config, kind: AttentionKind, layer_id: int) -> None:
        super().__init__()
        inner, heads = cfg.num_heads * cfg.d_kv, _heads(cfg)
        self.inner = heads * cfg.d_kv  # this rank's heads' share of q, k and v
        self.qkv = ColumnParallelLinear(cfg.d_model, [inner, inner, inner], what="heads' q/k/v")
        self.o = RowParallelLinear(inner, cfg.d_model, what="heads' outputs")
        self.attn = Attention(kind, layer_id, heads, heads, cfg.d_kv, scaling=1.0)

    def forward(self, x: torch.Tensor, fb: ForwardBatch | EncodeForwardBatch,
                bias: RelativePositionBias) -> torch.Tensor:
        return self.attend(self.qkv(x), fb, bias)

    def attend(self, qkv: torch.Tensor, fb: ForwardBatch,
               bias: RelativePositionBias) -> torch.Tensor:
        """The sublayer's output from its q/k/v projection."""
        q, k, v = qkv.split(self.inner, dim=-1)
        return self.o(self.attn(q, k, v, fb, bias))


class T5CrossAttention(nn.Module):
    def __init__(self, cfg: T5Config, layer_id: int) -> None:
        super().__init__()
        inner, heads = cfg.num_heads * cfg.d_kv, _heads(cfg)
        self.inner = heads * cfg.d_kv
        self.q = ColumnParallelLinear(cfg.d_model, inner, what="heads' q")
        self.kv = ColumnParallelLinear(cfg.d_model, [inner, inner], what="heads' k/v")
        self.o = RowParallelLinear(inner, cfg.d_model, what="heads' outputs")
        self.attn = Attention(AttentionKind.CROSS, layer_id, heads, heads, cfg.d_kv, scaling=1.0)

    def store_kv(self, encoder_hidden: torch.Tensor, fb: EncodeForwardBatch) -> None:
        k, v = self.kv(encoder_hidden).split(self.inner, dim=-1)
        self.attn.store_cross_kv(k, v, fb)

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self.attend(self.q(x), fb)

    def attend(self, q: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self.o(self.attn(q, None, None, fb))


def _feed_forward(cfg: T5Config) -> nn.Module:
    cls = GatedMLP if cfg.is_gated else MLP
    return cls(cfg.d_model, cfg.d_ff, cfg.activation)


class T5EncoderBlock(nn.Module):
    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)
        self.self_attn = T5SelfAttention(cfg, AttentionKind.ENCODER, layer_id=-1)
        self.ff_norm = RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)
        self.ff = _feed_forward(cfg)

    def forward(self, x: torch.Tensor, fb: EncodeForwardBatch,
                bias: RelativePositionBias) -> torch.Tensor:
        qkv, x = _pre_norm(self.attn_norm, x, None, self.self_attn.qkv)
        h = self.self_attn.attend(qkv, fb, bias)
        up, x = _pre_norm(self.ff_norm, x, h, self.ff.in_proj)
        return _clamp_fp16(x + self.ff.after_in_proj(up))


class T5DecoderBlock(nn.Module):
    def __init__(self, cfg: T5Config, layer_id: int) -> None:
        super().__init__()
        self.self_attn_norm = RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)
        self.self_attn = T5SelfAttention(cfg, AttentionKind.SELF, layer_id)
        self.cross_attn_norm = RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)
        self.cross_attn = T5CrossAttention(cfg, layer_id)
        self.ff_norm = RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)
        self.ff = _feed_forward(cfg)

    def forward(self, x: torch.Tensor, h: torch.Tensor | None, fb: ForwardBatch,
                bias: RelativePositionBias) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, h) -> (x', h'): the residual stream and the previous sublayer's output not yet
        added to it (None before the first layer), so that each add joins the next norm and
        the projection after it (models/block.py)."""
        qkv, x = _pre_norm(self.self_attn_norm, x, h, self.self_attn.qkv)
        h = self.self_attn.attend(qkv, fb, bias)
        q, x = _pre_norm(self.cross_attn_norm, x, h, self.cross_attn.q)
        h = self.cross_attn.attend(q, fb)
        up, x = _pre_norm(self.ff_norm, x, h, self.ff.in_proj)
        return x, self.ff.after_in_proj(up)


def _biases(cfg: T5Config, layers: int, bidirectional: bool) -> nn.ModuleList:
    """A stack's relative position biases: one its layers share (T5), or one per layer (UMT5)."""
    count = layers if cfg.bias_per_layer else 1
    return nn.ModuleList(RelativePositionBias(cfg.relative_attention_num_buckets,
                                              cfg.relative_attention_max_distance,
                                              cfg.num_heads, bidirectional)
                         for _ in range(count))


def _layer_bias(biases: nn.ModuleList, layer: int) -> RelativePositionBias:
    """Layer `layer`'s bias: its own (UMT5), or the stack's one (T5: the same object for every
    layer, so that the attention backends compute it once per batch)."""
    return biases[min(layer, len(biases) - 1)]


class T5ForConditionalGeneration(ModelFamily):
    config_class = T5Config
    tensor_parallel = True  # its layers split over ranks (models/parallel_state.py)
    # HF's `wo` (_keep_in_fp32_modules): its input's outliers defeat per-token FP8 scales
    keep_in_model_dtype = ("ff.down",)

    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.shared = embedding(cfg.vocab_size, cfg.d_model)
        self.encoder_bias = _biases(cfg, cfg.num_layers, bidirectional=True)
        self.encoder_layers = nn.ModuleList(T5EncoderBlock(cfg) for _ in range(cfg.num_layers))
        self.encoder_norm = RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)
        self.decoder_bias = _biases(cfg, cfg.num_decoder_layers, bidirectional=False)
        self.decoder_layers = nn.ModuleList(
            T5DecoderBlock(cfg, i) for i in range(cfg.num_decoder_layers)
        )
        self.decoder_norm = RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)
        self.lm_head = lm_head(cfg.d_model, cfg.vocab_size)

    # --- the encoder stage -------------------------------------------------------------------
    def encode(self, fb: EncodeForwardBatch) -> torch.Tensor:
        """Run the encoder over a packed ragged batch; returns hidden states [tokens, d_model]."""
        x = self.shared(fb.token_ids)
        for i, layer in enumerate(self.encoder_layers):
            x = layer(x, fb, _layer_bias(self.encoder_bias, i))
        return self.encoder_norm(x)

    def store_cross_kv(self, encoder_hidden: torch.Tensor, fb: EncodeForwardBatch) -> None:
        """Project the encoder output to each decoder layer's cross K/V, once."""
        for layer in self.decoder_layers:
            layer.cross_attn.store_kv(encoder_hidden, fb)

    # --- the decoder -------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                fb: ForwardBatch) -> torch.Tensor:
        x, h = self.shared(input_ids), None
        for i, layer in enumerate(self.decoder_layers):
            x, h = layer(x, h, fb, _layer_bias(self.decoder_bias, i))
        x = _pre_norm(self.decoder_norm, x, h)[0]
        if self.cfg.scale_decoder_outputs:
            x = x * (self.cfg.d_model**-0.5)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    # --- weights -----------------------------------------------------------------------------
    weight_map = staticmethod(hf_to_param)

    def tie_missing(self, missing: set[str]) -> set[str]:
        """Tie lm_head to the embedding when the checkpoint has none and the config allows."""
        return self.tie_lm_head(missing, self.shared, self.cfg.tie_word_embeddings)
