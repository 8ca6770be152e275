"""The CPU backend: decode steps and the encoder batched over requests, prefills as the reference.

A decode step (one new token per request, also a prefill of one token each, as T5's start
tokens are) gathers every request's K/V into one padded tensor per layer, head-major, and
attends with two batched products and a softmax (`_attend_one`), with padding as an additive
mask and the T5 bias looked up by distance; it builds none of the reference's per-request
metadata. The encoder pads its inputs into groups of near-equal length
(`padded_segments.py`; inputs of one length need no copy) and attends once per group
(`scaled_dot_product_attention`).
A request's cross K/V never change while it decodes, so consecutive decode steps of the same
requests reuse the padded cross K/V the first one gathered. A slot can hold another input's
K/V only after an encode forward (which drops them) or a host-tier load into the pool
(`outside_writes`, part of their key): a request admitted into the decode batch without a
prefill of its own may read slots an earlier request's K/V had.
Prefills of several tokens keep the reference's per-request path (`torch_native.py`), which
this backend is tested against. On a CPU the reference's per-request products cost more in
call overhead than in arithmetic at batch sizes of tens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from seq2serve.runtime.attention.base import AttentionLayer, PositionBias
from seq2serve.runtime.attention.forward_batch import (
    EncodeForwardBatch,
    ForwardBatch,
    ForwardMode,
)
from seq2serve.runtime.attention.padded_segments import PaddedSegments, SegmentGroup
from seq2serve.runtime.attention.torch_native import TorchNativeBackend, _Metadata, softcap


@dataclass
class _Rows:
    """One token per request: padded slot indices (flat) and masks."""

    batch: int
    kv_slots: torch.Tensor  # pool rows x KV heads + head, ordered [B, KVH, L]
    kv_mask: torch.Tensor  # [B, 1, 1, L] additive: 0 or -inf
    cross_slots: torch.Tensor
    cross_mask: torch.Tensor  # [B, 1, 1, E] additive
    cross_any: torch.Tensor | None  # [B, 1] False: no key to attend to (output zero)
    distance: torch.Tensor  # query position - key position, clamped at 0, [B, L]
    bias: dict  # id(position bias) -> [B, H, 1, L], the padding mask included
    cross_kv: dict  # layer id -> gathered (k, v): the decode steps' `_CrossKV.layers`


@dataclass
class _CrossKV:
    """The padded cross K/V of one set of decoding requests, by layer, kept across steps."""

    slots: torch.Tensor
    layers: dict
    outside_writes: int  # the pool's count when gathered (a host-tier load changes slots)


# the most bytes of gathered cross K/V kept across decode steps (else gathered every step, a
# copy as large as the kept one each step and layer: 256 MiB made 8 clips of whisper-base
# (295 MB of cross K/V) decode five times slower than 4)
_MAX_KEPT_CROSS_BYTES = 1 << 30


class TorchBatchedBackend(TorchNativeBackend):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._cross: _CrossKV | None = None  # set by decode steps, dropped by other forwards

    def init_forward_metadata(self, fb: ForwardBatch | EncodeForwardBatch) -> None:
        if fb.forward_mode is not ForwardMode.DECODE:
            self._cross = None  # the cross pool may change now (an encode, a new request)
        if fb.forward_mode is ForwardMode.ENCODE or any(n != 1 for n in fb.host.extend_lens):
            super().init_forward_metadata(fb)
            fb.attn_metadata.rows = None
            fb.attn_metadata.segments = None
            return
        # one token per request: the reference's per-request index lists (two small copies
        # per request and step) are never read
        fb.attn_metadata = _Metadata(q_starts=[], kv_indices=[], cross_indices=[])
        fb.attn_metadata.segments = None
        h, pool = fb.host, fb.req_to_token_pool
        device = pool.req_to_token.device
        table_rows = torch.tensor(h.req_pool_indices, dtype=torch.int64, device=device)
        seq_lens = torch.tensor(h.seq_lens, dtype=torch.int64, device=device)
        enc_lens = torch.tensor(h.encoder_lens, dtype=torch.int64, device=device)
        keys = torch.arange(max(h.seq_lens), device=device)
        cross = torch.arange(max(max(h.encoder_lens), 1), device=device)
        cross_ok = cross[None, :] < enc_lens[:, None]
        if fb.cross_kv_start is not None:  # Mllama: each token's readable key range
            cross_ok &= ((cross[None, :] >= fb.cross_kv_start[:, None])
                         & (cross[None, :] < fb.cross_kv_end[:, None]))
        any_key = cross_ok.any(dim=1)
        cross_slots = pool.req_to_cross[table_rows, : cross.numel()].reshape(-1).long()
        fb.attn_metadata.rows = _Rows(
            batch=len(h.seq_lens),
            kv_slots=_head_rows(pool.req_to_token[table_rows, : keys.numel()].long(),
                                fb.token_to_kv_pool.k_buffers[0].shape[1]),
            kv_mask=_additive(keys[None, :] < seq_lens[:, None]),
            cross_slots=cross_slots,
            cross_mask=_additive(cross_ok),
            cross_any=None if bool(any_key.all()) else any_key[:, None],
            distance=(fb.positions[:, None] - keys[None, :]).clamp(min=0),
            bias={},
            cross_kv=self._kept_cross(fb, cross_slots),
        )

    def _kept_cross(self, fb: ForwardBatch, slots: torch.Tensor) -> dict:
        """The cross K/V dict this decode step fills or reuses ({} to gather afresh, not kept
        when too large or not a decode step)."""
        pool = fb.cross_kv_pool
        if fb.forward_mode is not ForwardMode.DECODE or pool is None:
            return {}
        if (self._cross is not None and self._cross.outside_writes == pool.outside_writes
                and torch.equal(self._cross.slots, slots)):
            return self._cross.layers
        row_bytes = sum(b[0].numel() * b.element_size() for b in pool.k_buffers) * 2
        if slots.numel() * row_bytes > _MAX_KEPT_CROSS_BYTES:
            self._cross = None
            return {}
        self._cross = _CrossKV(slots, {}, pool.outside_writes)
        return self._cross.layers

    def forward_self(self, q: torch.Tensor, layer: AttentionLayer, fb: ForwardBatch,
                     position_bias: PositionBias | None) -> torch.Tensor:
        rows: _Rows | None = fb.attn_metadata.rows
        if rows is None:
            return super().forward_self(q, layer, fb, position_bias)
        pool = fb.token_to_kv_pool
        k = _gather_heads(pool.k_buffers[layer.layer_id], rows.kv_slots, rows.batch)
        v = _gather_heads(pool.v_buffers[layer.layer_id], rows.kv_slots, rows.batch)
        mask = rows.kv_mask
        if position_bias is not None:  # by distance, computed by the first layer that asks
            if id(position_bias) not in rows.bias:
                d = rows.distance.shape[1]
                by_distance = position_bias(torch.tensor([d - 1], device=q.device),
                                            torch.arange(d - 1, -1, -1, device=q.device))
                bias = by_distance[:, 0, rows.distance].transpose(0, 1)  # [B, H, L]
                rows.bias[id(position_bias)] = bias[:, :, None, :].float() + mask
            mask = rows.bias[id(position_bias)]
        if layer.sliding_window is not None:  # the last `sliding_window` positions
            key = (id(position_bias), layer.sliding_window)
            if key not in rows.bias:
                rows.bias[key] = mask + _additive(rows.distance < layer.sliding_window)
            mask = rows.bias[key]
        return _attend_one(q, k, v, layer, mask)

    def forward_cross(self, q: torch.Tensor, layer: AttentionLayer,
                      fb: ForwardBatch) -> torch.Tensor:
        rows: _Rows | None = fb.attn_metadata.rows
        if rows is None:
            return super().forward_cross(q, layer, fb)
        kv = rows.cross_kv.get(layer.layer_id)
        if kv is None:
            pool = fb.cross_kv_pool
            # contiguous: read at every step of the batch, gathered once
            kv = rows.cross_kv[layer.layer_id] = (
                _gather(pool.k_buffers[layer.layer_id], rows.cross_slots,
                        rows.batch).contiguous(),
                _gather(pool.v_buffers[layer.layer_id], rows.cross_slots,
                        rows.batch).contiguous())
        k, v = kv
        out = _attend_one(q, k, v, layer, rows.cross_mask)
        if rows.cross_any is None:
            return out
        # a token with no key to attend to (no encoder input, or none in its range) gets zero
        return torch.where(rows.cross_any, out, torch.zeros_like(out))

    def forward_encoder(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        layer: AttentionLayer, fb: EncodeForwardBatch,
                        position_bias: PositionBias | None) -> torch.Tensor:
        md = fb.attn_metadata
        if md.segments is None:  # made by the first layer (the groups' size needs the heads)
            md.segments = PaddedSegments(fb.segment_lens, layer.num_heads, q.device)
        seg: PaddedSegments = md.segments
        outs = [_attend(g.pad(q), g.pad(k), g.pad(v), layer,
                        _group_mask(g, position_bias, layer.sliding_window, q.device))
                for g in seg.groups]
        return seg.unpad(outs)


def _group_mask(g: SegmentGroup, position_bias: PositionBias | None, window: int | None,
                device: torch.device) -> torch.Tensor | None:
    """A group's additive mask [count | 1, heads | 1, length, length]: the bias and the
    sliding window (the same for every input: they depend only on the distance) and the padded
    keys; made once per batch."""
    key = (id(position_bias), window)
    if key not in g.masks:
        mask = None
        pos = torch.arange(g.length, device=device)
        if position_bias is not None:
            mask = position_bias(pos, pos)[None].float()  # [1, H, L, L]
        if window is not None:  # keys at most `window` away on either side
            near = _additive((pos[None, :] - pos[:, None]).abs() <= window)  # [L, 1, 1, L]
            near = near.view(1, 1, g.length, g.length)
            mask = near if mask is None else mask + near
        if g.valid is not None:
            pad = _additive(g.valid)  # [count, 1, 1, L]
            mask = pad if mask is None else mask + pad
        g.masks[key] = mask
    return g.masks[key]


def _additive(valid: torch.Tensor) -> torch.Tensor:
    """[B, L] bool -> [B, 1, 1, L] float32: 0 where valid, -inf where not."""
    out = torch.zeros(valid.shape, dtype=torch.float32, device=valid.device)
    return out.masked_fill_(~valid, float("-inf"))[:, None, None, :]


def _gather(buf: torch.Tensor, slots: torch.Tensor, batch: int) -> torch.Tensor:
    """The pool rows `slots` (flat, [B * L]) as [B, KVH, L, D]. (index_select: a quarter of
    advanced indexing's time on the CPU.)"""
    k = buf.index_select(0, slots)
    return k.view(batch, -1, *buf.shape[1:]).transpose(1, 2)


def _head_rows(slots: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Pool slots [B, L] -> rows of the pool viewed as [slots * KVH, D], ordered [B, KVH, L]:
    a gather then yields K or V in the layout the products read, with no copy after it."""
    heads = torch.arange(kv_heads, device=slots.device)
    return (slots[:, None, :] * kv_heads + heads[None, :, None]).reshape(-1)


def _gather_heads(buf: torch.Tensor, rows: torch.Tensor, batch: int) -> torch.Tensor:
    """The pool's rows (`_head_rows`) as [B, KVH, L, D], contiguous."""
    out = buf.view(-1, buf.shape[-1]).index_select(0, rows)
    return out.view(batch, buf.shape[1], -1, buf.shape[-1])


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer,
            mask: torch.Tensor | None) -> torch.Tensor:
    """q [B, H, n, D], k/v [B, KVH, L, D], mask additive (broadcast to [B, H, n, L]) ->
    [B, n, H * D]. In float32 whatever the model's dtype, as the reference's softmax."""
    if layer.softcap is not None:  # scores capped before the mask: not SDPA's fused kernel
        group = layer.num_heads // layer.num_kv_heads
        scores = softcap(torch.matmul(q.float(), k.float().repeat_interleave(group, dim=1)
                                      .transpose(-1, -2)) * layer.scaling, layer.softcap)
        if mask is not None:
            scores = scores + mask
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v.float().repeat_interleave(group, dim=1))
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1).to(q.dtype)
    out = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask, scale=layer.scaling,
        enable_gqa=layer.num_kv_heads != layer.num_heads)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1).to(q.dtype)


def _attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer,
                mask: torch.Tensor) -> torch.Tensor:
    """One query per row: q [B, H, D], k/v [B, KVH, L, D], mask additive [B, 1 | H, 1, L]
    -> [B, H * D], in float32. Two batched products and a softmax, as the reference computes
    it: for a single query, `scaled_dot_product_attention`'s CPU kernel (blocked for long
    queries) took 1.6x as long. A query group of a KV head is one [G, D] x [D, L] product."""
    b, heads, d = q.shape
    kvh, length = k.shape[1], k.shape[2]
    scores = torch.matmul(q.float().view(b, kvh, heads // kvh, d),
                          k.float().transpose(-1, -2))  # [B, KVH, G, L]
    if layer.scaling != 1.0:
        scores.mul_(layer.scaling)
    if layer.softcap is not None:
        scores = softcap(scores, layer.softcap)
    scores = scores.view(b, heads, 1, length).add_(mask)
    probs = torch.softmax(scores, dim=-1).view(b, kvh, heads // kvh, length)
    return torch.matmul(probs, v.float()).view(b, heads * d).to(q.dtype)
