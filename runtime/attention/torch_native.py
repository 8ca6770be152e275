"""The reference backend: plain PyTorch, one request at a time, runs everywhere.

Each request gathers only its own K/V (no batch padding). Slow on a GPU, exact on the CPU; the
Triton kernels are tested against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from seq2serve.runtime.attention.base import AttentionBackend, AttentionLayer, PositionBias
from seq2serve.runtime.attention.forward_batch import (
    EncodeForwardBatch,
    ForwardBatch,
    ForwardMode,
)


@dataclass
class _Metadata:
    q_starts: list[int]  # query offset of each request in the packed batch
    kv_indices: list[torch.Tensor]  # SELF: TokenToKVPool slots of each request's positions
    cross_indices: list[torch.Tensor]  # CROSS: CrossKVPool slots of each request
    bias_cache: dict = field(default_factory=dict)  # (bias id, request) -> [H, q, k]


class TorchNativeBackend(AttentionBackend):
    def __init__(self, **_: object) -> None:
        pass

    def init_forward_metadata(self, fb: ForwardBatch | EncodeForwardBatch) -> None:
        encode = fb.forward_mode is ForwardMode.ENCODE
        q_lens = fb.segment_lens if encode else fb.host.extend_lens
        starts = [0]
        for n in q_lens:
            starts.append(starts[-1] + n)
        kv, cross = [], []
        if not encode:
            pool, h = fb.req_to_token_pool, fb.host
            for idx, seq_len, enc_len in zip(h.req_pool_indices, h.seq_lens, h.encoder_lens):
                kv.append(pool.req_to_token[idx, :seq_len].long())
                cross.append(pool.req_to_cross[idx, :enc_len].long())
        fb.attn_metadata = _Metadata(q_starts=starts, kv_indices=kv, cross_indices=cross)

    def forward_self(self, q: torch.Tensor, layer: AttentionLayer, fb: ForwardBatch,
                     position_bias: PositionBias | None) -> torch.Tensor:
        md: _Metadata = fb.attn_metadata
        k_buf = fb.token_to_kv_pool.k_buffers[layer.layer_id]
        v_buf = fb.token_to_kv_pool.v_buffers[layer.layer_id]
        out = torch.empty(q.shape[0], layer.num_heads * layer.head_dim, dtype=q.dtype,
                          device=q.device)
        for i, kv_idx in enumerate(md.kv_indices):
            s, e = md.q_starts[i], md.q_starts[i + 1]
            q_pos = fb.positions[s:e]
            k_pos = torch.arange(kv_idx.numel(), device=q.device)
            mask = k_pos[None, :] <= q_pos[:, None]  # causal
            if layer.sliding_window is not None:  # the last `sliding_window` positions
                mask &= k_pos[None, :] > q_pos[:, None] - layer.sliding_window
            bias = self._bias(md, position_bias, i, q_pos, k_pos)
            out[s:e] = _attend(q[s:e], k_buf[kv_idx], v_buf[kv_idx], layer, mask, bias)
        return out

    def forward_cross(self, q: torch.Tensor, layer: AttentionLayer,
                      fb: ForwardBatch) -> torch.Tensor:
        md: _Metadata = fb.attn_metadata
        k_buf = fb.cross_kv_pool.k_buffers[layer.layer_id]
        v_buf = fb.cross_kv_pool.v_buffers[layer.layer_id]
        out = torch.zeros(q.shape[0], layer.num_heads * layer.head_dim, dtype=q.dtype,
                          device=q.device)
        for i, idx in enumerate(md.cross_indices):
            s, e = md.q_starts[i], md.q_starts[i + 1]
            if idx.numel() == 0 or s == e:
                continue  # nothing to attend to: the output stays zero
            mask = None
            if fb.cross_kv_start is not None:
                keys = torch.arange(idx.numel(), device=q.device)[None, :]
                mask = ((keys >= fb.cross_kv_start[s:e, None])
                        & (keys < fb.cross_kv_end[s:e, None]))
            o = _attend(q[s:e], k_buf[idx], v_buf[idx], layer, mask, None)
            if mask is not None:  # a query with no key to attend to gets zero, not NaN
                o = torch.where(mask.any(dim=1)[:, None], o, torch.zeros_like(o))
            out[s:e] = o
        return out

    def forward_encoder(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        layer: AttentionLayer, fb: EncodeForwardBatch,
                        position_bias: PositionBias | None) -> torch.Tensor:
        md: _Metadata = fb.attn_metadata
        out = torch.empty(q.shape[0], layer.num_heads * layer.head_dim, dtype=q.dtype,
                          device=q.device)
        for i in range(len(md.q_starts) - 1):
            s, e = md.q_starts[i], md.q_starts[i + 1]
            pos = torch.arange(e - s, device=q.device)
            bias = self._bias(md, position_bias, i, pos, pos)
            mask = None
            if layer.sliding_window is not None:  # keys at most that far on either side
                mask = (pos[None, :] - pos[:, None]).abs() <= layer.sliding_window
            out[s:e] = _attend(q[s:e], k[s:e], v[s:e], layer, mask, bias)
        return out

    @staticmethod
    def _bias(md: _Metadata, position_bias: PositionBias | None, i: int,
              q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        # computed by the first layer that asks, shared by the rest (as in T5)
        if position_bias is None:
            return None
        key = (id(position_bias), i)
        if key not in md.bias_cache:
            md.bias_cache[key] = position_bias(q_pos, k_pos)
        return md.bias_cache[key]


def softcap(scores: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Gemma's soft-cap of attention scores (None: unchanged), as HF computes it."""
    return scores if cap is None else torch.tanh(scores / cap) * cap


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer,
            mask: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """q [n, H, D], k/v [m, KVH, D] -> [n, H*D]; softmax in float32."""
    group = layer.num_heads // layer.num_kv_heads
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scores = softcap(torch.einsum("qhd,khd->hqk", q.float(), k.float()) * layer.scaling,
                     layer.softcap)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("hqk,khd->qhd", probs, v.float())
    return out.reshape(q.shape[0], -1).to(q.dtype)
