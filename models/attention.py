"""One attention call site of a model. The math lives in the runtime's attention backend, which
gets this layer's description and the batch's metadata as arguments (its sliding window and
soft-cap too: `runtime/attention/base.py`'s `AttentionLayer`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from seq2serve.runtime.attention.base import AttentionKind, PositionBias

if TYPE_CHECKING:
    from seq2serve.runtime.attention.forward_batch import EncodeForwardBatch, ForwardBatch


class Attention(nn.Module):
    def __init__(self, kind: AttentionKind, layer_id: int, num_heads: int, num_kv_heads: int,
                 head_dim: int, scaling: float, sliding_window: int | None = None,
                 softcap: float | None = None) -> None:
        super().__init__()
        self.kind = kind
        self.layer_id = layer_id
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scaling = scaling
        self.sliding_window = sliding_window
        self.softcap = softcap

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                fb: ForwardBatch | EncodeForwardBatch,
                position_bias: PositionBias | None = None) -> torch.Tensor:
        q = q.view(-1, self.num_heads, self.head_dim)
        if k is not None:
            k = k.view(-1, self.num_kv_heads, self.head_dim)
            v = v.view(-1, self.num_kv_heads, self.head_dim)
        return fb.attn_backend.forward(q, k, v, self, fb, position_bias)

    def store_cross_kv(self, k: torch.Tensor, v: torch.Tensor, fb: EncodeForwardBatch) -> None:
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        fb.attn_backend.store_cross_kv(self, k, v, fb)
