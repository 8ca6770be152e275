"""T5Gemma (`T5GemmaForConditionalGeneration`): an encoder-decoder of Gemma 2 blocks.

Each stack is pre- and post-normed blocks (`x + post_norm(sublayer(pre_norm(x)))`) of GQA
attention with RoPE and a gated feed-forward; the embeddings are scaled by the square root of
the width. Attention logits are soft-capped (`cap * tanh(s / cap)`), in every self- and
cross-attention layer, and some layers see only a sliding window of keys (the encoder's on
both sides of the query, the decoder's behind it): the runtime's attention backends do both
(`models/attention.py`). The decoder's cross-attention has no RoPE; its K/V are projected from
the encoder's width to the decoder's heads, once per encoder output. The logits are soft-capped
too. Gemma's norms multiply by `1 + weight`: the loaded weights become those factors once
(`init_buffers`), so the blocks use the runtime's plain RMS norm.

Tensor parallelism splits it as Llama: each rank holds its share of every stack's query and
key/value heads (the cross-attention's too) and feed-forward channels, and its rows of both
embeddings and the head (models/vocab_parallel.py); the soft-cap applies to the gathered logits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from seq2serve.models.attention import Attention
from seq2serve.models.bart.positions import segment_positions
from seq2serve.models.block import pre_norm
from seq2serve.models.family import ModelFamily
from seq2serve.models.linear import ColumnParallelLinear, RowParallelLinear
from seq2serve.models.llama.model import local_heads
from seq2serve.models.mlp import GatedMLP
from seq2serve.models.norm import RMSNorm
from seq2serve.models.rotary import RotaryEmbedding, apply_rotary, rope_inv_freq
from seq2serve.models.t5gemma.config import GemmaStack, T5GemmaConfig
from seq2serve.models.t5gemma.weights import hf_to_param
from seq2serve.models.vocab_parallel import embedding, lm_head
from seq2serve.runtime.attention.base import AttentionKind

if TYPE_CHECKING:
    from seq2serve.runtime.attention.forward_batch import EncodeForwardBatch, ForwardBatch

Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin of every token's position


def _attention(s: GemmaStack, kind: AttentionKind, layer_id: int, window: int | None) -> Attention:
    """This tensor-parallel rank's share of the heads. Built before the projections: a
    tp_size that does not divide the heads is refused naming them, not their features."""
    heads, kv_heads = local_heads(s.num_heads, s.num_kv_heads)
    return Attention(kind, layer_id, heads, kv_heads, s.head_dim,
                     scaling=s.query_pre_attn_scalar**-0.5, sliding_window=window,
                     softcap=s.attn_softcap)


class GemmaSelfAttention(nn.Module):
    def __init__(self, s: GemmaStack, kind: AttentionKind, layer: int) -> None:
        super().__init__()
        self.attn = a = _attention(s, kind, layer if kind is AttentionKind.SELF else -1,
                                   s.window(layer))
        self.q_size, self.kv_size = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        self.qkv_proj = ColumnParallelLinear(s.hidden_size, [q, kv, kv], what="heads' q/k/v")
        self.o_proj = RowParallelLinear(q, s.hidden_size, what="heads' outputs")

    def attend(self, qkv: torch.Tensor, rope: Rope,
               fb: ForwardBatch | EncodeForwardBatch) -> torch.Tensor:
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        a = self.attn
        q, k = apply_rotary(q.view(-1, a.num_heads, a.head_dim),
                            k.view(-1, a.num_kv_heads, a.head_dim), *rope)
        return self.o_proj(a(q, k, v, fb))


class GemmaCrossAttention(nn.Module):
    def __init__(self, s: GemmaStack, encoder_width: int, layer: int) -> None:
        super().__init__()
        self.attn = a = _attention(s, AttentionKind.CROSS, layer, None)
        self.kv_size = a.num_kv_heads * a.head_dim  # this rank's
        q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        self.q_proj = ColumnParallelLinear(s.hidden_size, q, what="heads' q")
        self.kv_proj = ColumnParallelLinear(encoder_width, [kv, kv], what="heads' k/v")
        self.o_proj = RowParallelLinear(q, s.hidden_size, what="heads' outputs")

    def store_kv(self, encoder_hidden: torch.Tensor, fb: EncodeForwardBatch) -> None:
        k, v = self.kv_proj(encoder_hidden).split(self.kv_size, dim=-1)
        self.attn.store_cross_kv(k, v, fb)


class GemmaLayer(nn.Module):
    """An encoder layer, or with `cross` a decoder layer. Takes and returns (x, h): the residual
    stream and the last sublayer's post-normed output, which the next norm adds
    (models/block.py)."""

    def __init__(self, s: GemmaStack, kind: AttentionKind, layer: int,
                 encoder_width: int | None = None) -> None:
        super().__init__()
        eps = s.rms_norm_eps
        self.pre_self_attn_layernorm = RMSNorm(s.hidden_size, eps)
        self.self_attn = GemmaSelfAttention(s, kind, layer)
        self.post_self_attn_layernorm = RMSNorm(s.hidden_size, eps)
        self.cross_attn = None
        if encoder_width is not None:
            self.pre_cross_attn_layernorm = RMSNorm(s.hidden_size, eps)
            self.cross_attn = GemmaCrossAttention(s, encoder_width, layer)
            self.post_cross_attn_layernorm = RMSNorm(s.hidden_size, eps)
        self.pre_feedforward_layernorm = RMSNorm(s.hidden_size, eps)
        self.mlp = GatedMLP(s.hidden_size, s.intermediate_size, s.activation)
        self.post_feedforward_layernorm = RMSNorm(s.hidden_size, eps)

    def forward(self, x: torch.Tensor, h: torch.Tensor | None, rope: Rope,
                fb: ForwardBatch | EncodeForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        qkv, x = pre_norm(self.pre_self_attn_layernorm, x, h, self.self_attn.qkv_proj)
        h = self.post_self_attn_layernorm(self.self_attn.attend(qkv, rope, fb))
        if self.cross_attn is not None:
            c = self.cross_attn
            q, x = pre_norm(self.pre_cross_attn_layernorm, x, h, c.q_proj)
            h = self.post_cross_attn_layernorm(c.o_proj(c.attn(q, None, None, fb)))
        gate_up, x = pre_norm(self.pre_feedforward_layernorm, x, h, self.mlp.in_proj)
        return x, self.post_feedforward_layernorm(self.mlp.after_in_proj(gate_up))


class GemmaStackModule(nn.Module):
    def __init__(self, s: GemmaStack, vocab: int, kind: AttentionKind,
                 encoder_width: int | None = None) -> None:
        super().__init__()
        self.stack = s
        self.embed_tokens = embedding(vocab, s.hidden_size)
        self.embed_scale = s.hidden_size**0.5  # rounded to the model's dtype by init_buffers
        self.rotary = RotaryEmbedding(s.head_dim, s.rope_theta, None)
        self.layers = nn.ModuleList(GemmaLayer(s, kind, i, encoder_width)
                                    for i in range(s.num_layers))
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor,
                fb: ForwardBatch | EncodeForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(ids) * self.embed_scale
        rope, h = self.rotary(positions, x.dtype), None
        for layer in self.layers:
            x, h = layer(x, h, rope, fb)
        return pre_norm(self.norm, x, h)[0]


class T5GemmaForConditionalGeneration(ModelFamily):
    config_class = T5GemmaConfig
    tensor_parallel = True  # its layers split over ranks (models/parallel_state.py)

    def __init__(self, cfg: T5GemmaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = GemmaStackModule(cfg.encoder, cfg.vocab_size, AttentionKind.ENCODER)
        self.decoder = GemmaStackModule(cfg.decoder, cfg.vocab_size, AttentionKind.SELF,
                                        encoder_width=cfg.encoder.hidden_size)
        self.lm_head = lm_head(cfg.decoder.hidden_size, cfg.vocab_size)

    # --- the encoder stage -------------------------------------------------------------------
    def encode(self, fb: EncodeForwardBatch) -> torch.Tensor:
        ids = fb.token_ids
        return self.encoder(ids, segment_positions(fb.segment_lens, ids.device), fb)

    def store_cross_kv(self, encoder_hidden: torch.Tensor, fb: EncodeForwardBatch) -> None:
        for layer in self.decoder.layers:
            layer.cross_attn.store_kv(encoder_hidden, fb)

    # --- the decoder -------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                fb: ForwardBatch) -> torch.Tensor:
        return self.decoder(input_ids, positions, fb)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        cap = self.cfg.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    # --- weights -----------------------------------------------------------------------------
    weight_map = staticmethod(hf_to_param)

    def tie_missing(self, missing: set[str]) -> set[str]:
        return self.tie_lm_head(missing, self.decoder.embed_tokens, self.cfg.tie_word_embeddings)

    @torch.no_grad()
    def init_buffers(self) -> None:
        """RoPE's frequencies (not in the checkpoint); the embedding scale, the square root of
        the width rounded to the model's dtype as HF's is (a Python float: no tensor built per
        forward); Gemma's norms multiply by 1 + their stored weight: the weights become those
        factors, once, after load."""
        for stack in (self.encoder, self.decoder):
            s, weight = stack.stack, stack.embed_tokens.weight
            stack.rotary.inv_freq = rope_inv_freq(s.head_dim, s.rope_theta, None).to(
                weight.device)
            stack.embed_scale = torch.tensor(s.hidden_size**0.5, dtype=weight.dtype).item()
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.weight.add_(1.0)
