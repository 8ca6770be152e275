"""Decoder-only Llama (3.x): pre-norm blocks of GQA self-attention with RoPE and a SwiGLU MLP.

`LlamaDecoderLayer` is shared with Mllama's text model, which interleaves it with gated
cross-attention layers. Layers pass on (x, h), the residual stream and their last sublayer's
output not yet added to it: the next layer's first norm does the add (models/block.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from seq2serve.models import parallel_state
from seq2serve.models.attention import Attention
from seq2serve.models.block import pre_norm
from seq2serve.models.family import ModelFamily
from seq2serve.models.linear import ColumnParallelLinear, RowParallelLinear
from seq2serve.models.llama.config import LlamaConfig
from seq2serve.models.llama.weights import hf_to_param
from seq2serve.models.mlp import GatedMLP
from seq2serve.models.norm import RMSNorm
from seq2serve.models.rotary import RotaryEmbedding, apply_rotary, rope_inv_freq
from seq2serve.models.vocab_parallel import embedding, lm_head
from seq2serve.runtime.attention.base import AttentionKind

if TYPE_CHECKING:
    from seq2serve.runtime.attention.forward_batch import ForwardBatch


Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin of every token's position


def local_heads(heads: int, kv_heads: int) -> tuple[int, int]:
    """This tensor-parallel rank's query and key/value heads (GQA: each rank keeps whole
    groups, so tp_size must divide the key/value heads)."""
    tp = parallel_state.tensor_parallel()
    return tp.shard(heads, "attention heads"), tp.shard(kv_heads, "key/value heads")


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer_id: int) -> None:
        super().__init__()
        h, kvh, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        local_h, local_kvh = local_heads(h, kvh)
        self.q_size, self.kv_size = local_h * d, local_kvh * d  # this rank's heads
        self.qkv_proj = ColumnParallelLinear(cfg.hidden_size, [h * d, kvh * d, kvh * d],
                                             what="heads' q/k/v")
        self.o_proj = RowParallelLinear(h * d, cfg.hidden_size, what="heads' outputs")
        self.attn = Attention(AttentionKind.SELF, layer_id, local_h, local_kvh, d,
                              scaling=d**-0.5)

    def forward(self, x: torch.Tensor, rope: Rope, fb: ForwardBatch) -> torch.Tensor:
        return self.attend(self.qkv_proj(x), rope, fb)

    def attend(self, qkv: torch.Tensor, rope: Rope, fb: ForwardBatch) -> torch.Tensor:
        """The sublayer's output from its q/k/v projection."""
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        d = self.attn.head_dim
        q, k = apply_rotary(q.view(-1, self.attn.num_heads, d),
                            k.view(-1, self.attn.num_kv_heads, d), *rope)
        return self.o_proj(self.attn(q, k, v, fb))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer_id: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, layer_id)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)

    def forward(self, x: torch.Tensor, h: torch.Tensor | None, rope: Rope,
                fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, h) -> (x', h'): h is the layer before's output, None before the first layer."""
        qkv, x = pre_norm(self.input_layernorm, x, h, self.self_attn.qkv_proj)
        h = self.self_attn.attend(qkv, rope, fb)
        gate_up, x = pre_norm(self.post_attention_layernorm, x, h, self.mlp.in_proj)
        return x, self.mlp.after_in_proj(gate_up)


class LlamaForCausalLM(ModelFamily):
    config_class = LlamaConfig
    tensor_parallel = True  # its layers split over ranks (models/parallel_state.py)

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = lm_head(cfg.hidden_size, cfg.vocab_size)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                fb: ForwardBatch) -> torch.Tensor:
        x, h = self.embed_tokens(input_ids), None
        rope = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x, h = layer(x, h, rope, fb)
        return pre_norm(self.norm, x, h)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    weight_map = staticmethod(hf_to_param)

    def tie_missing(self, missing: set[str]) -> set[str]:
        return self.tie_lm_head(missing, self.embed_tokens, self.cfg.tie_word_embeddings)

    def init_buffers(self) -> None:
        """Recompute the non-persistent buffers (they are not in the checkpoint)."""
        inv_freq = rope_inv_freq(self.cfg.head_dim, self.cfg.rope_theta, self.cfg.rope_scaling)
        self.rotary.inv_freq = inv_freq.to(self.embed_tokens.weight.device)
