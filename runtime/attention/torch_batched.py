"""The CPU backend: decode steps batched over requests, everything else as the reference.

A decode step (one new token per request, also a prefill of one token each, as T5's start
tokens are) gathers every request's K/V into one padded tensor per layer and attends in one
batched product, with padding and causality as a mask and the T5 bias looked up by distance.
Prefills of several tokens and the encoder keep the reference's per-request path
(`torch_native.py`), which this backend is tested against. On a CPU the reference's
per-request products cost more in call overhead than in arithmetic at batch sizes of tens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seq2serve.runtime.attention.base import AttentionLayer, PositionBias
from seq2serve.runtime.attention.forward_batch import (
    EncodeForwardBatch,
    ForwardBatch,
    ForwardMode,
)
from seq2serve.runtime.attention.torch_native import TorchNativeBackend


@dataclass
class _Rows:
    """One token per request: padded slot indices and masks, [B, L] / [B, E]."""

    kv_slots: torch.Tensor
    kv_mask: torch.Tensor
    cross_slots: torch.Tensor
    cross_mask: torch.Tensor
    distance: torch.Tensor  # query position - key position, clamped at 0, [B, L]
    bias: dict  # id(position bias) -> [B, H, L]


class TorchBatchedBackend(TorchNativeBackend):
    def init_forward_metadata(self, fb: ForwardBatch | EncodeForwardBatch) -> None:
        super().init_forward_metadata(fb)
        fb.attn_metadata.rows = None
        if fb.forward_mode is ForwardMode.ENCODE or any(n != 1 for n in fb.host.extend_lens):
            return
        h, pool = fb.host, fb.req_to_token_pool
        device = pool.req_to_token.device
        table_rows = torch.tensor(h.req_pool_indices, dtype=torch.int64, device=device)
        seq_lens = torch.tensor(h.seq_lens, dtype=torch.int64, device=device)
        enc_lens = torch.tensor(h.encoder_lens, dtype=torch.int64, device=device)
        keys = torch.arange(max(h.seq_lens), device=device)
        cross = torch.arange(max(max(h.encoder_lens), 1), device=device)
        cross_mask = cross[None, :] < enc_lens[:, None]
        if fb.cross_kv_start is not None:  # Mllama: each token's readable key range
            cross_mask &= ((cross[None, :] >= fb.cross_kv_start[:, None])
                           & (cross[None, :] < fb.cross_kv_end[:, None]))
        fb.attn_metadata.rows = _Rows(
            kv_slots=pool.req_to_token[table_rows, : keys.numel()].long(),
            kv_mask=keys[None, :] < seq_lens[:, None],
            cross_slots=pool.req_to_cross[table_rows, : cross.numel()].long(),
            cross_mask=cross_mask,
            distance=(fb.positions[:, None] - keys[None, :]).clamp(min=0),
            bias={},
        )

    def forward_self(self, q: torch.Tensor, layer: AttentionLayer, fb: ForwardBatch,
                     position_bias: PositionBias | None) -> torch.Tensor:
        rows: _Rows | None = fb.attn_metadata.rows
        if rows is None:
            return super().forward_self(q, layer, fb, position_bias)
        pool = fb.token_to_kv_pool
        k = pool.k_buffers[layer.layer_id][rows.kv_slots]
        v = pool.v_buffers[layer.layer_id][rows.kv_slots]
        bias = None
        if position_bias is not None:  # by distance, computed by the first layer that asks
            if id(position_bias) not in rows.bias:
                d = rows.distance.shape[1]
                by_distance = position_bias(torch.tensor([d - 1], device=q.device),
                                            torch.arange(d - 1, -1, -1, device=q.device))
                rows.bias[id(position_bias)] = by_distance[:, 0, rows.distance].transpose(0, 1)
            bias = rows.bias[id(position_bias)]
        return _attend_rows(q, k, v, layer, rows.kv_mask, bias)

    def forward_cross(self, q: torch.Tensor, layer: AttentionLayer,
                      fb: ForwardBatch) -> torch.Tensor:
        rows: _Rows | None = fb.attn_metadata.rows
        if rows is None:
            return super().forward_cross(q, layer, fb)
        pool = fb.cross_kv_pool
        k = pool.k_buffers[layer.layer_id][rows.cross_slots]
        v = pool.v_buffers[layer.layer_id][rows.cross_slots]
        out = _attend_rows(q, k, v, layer, rows.cross_mask, None)
        # a token with no key to attend to (no encoder input, or none in its range) gets zero
        return torch.where(rows.cross_mask.any(dim=1)[:, None], out, torch.zeros_like(out))


def _attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer,
                 mask: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """q [B, H, D], k/v [B, L, KVH, D], mask [B, L], bias [B, H, L] -> [B, H*D]; softmax in
    float32, as the reference."""
    b, heads, dim = q.shape
    kv_heads = layer.num_kv_heads
    group = heads // kv_heads
    qg = q.float().view(b, kv_heads, group, dim)
    scores = torch.einsum("bkgd,blkd->bkgl", qg, k.float()) * layer.scaling
    scores = scores.reshape(b, heads, -1)
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)
    out = torch.einsum("bkgl,blkd->bkgd", probs.view(b, kv_heads, group, -1), v.float())
    return out.reshape(b, heads * dim).to(q.dtype)
