"""Paged decode attention, one query per request, split over the keys (flash-decoding): each
program computes a partial softmax per (request, KV head, split), and the last split of a
(request, KV head) to finish merges them all, in the same kernel. Serves the decoder's
self-attention (with the in-kernel T5 bias) and cross-attention.

One kernel instead of split + merge matters at small batches, where a decode step is a chain
of tiny kernels whose launch gaps cost as much as their work. The last split is found with an
atomic counter per (request, KV head) that it resets to zero for the next call; partials
travel through L2 (`.cg` loads) after a CTA barrier and an acquire-release atomic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from seq2serve.runtime.kernels.pdl import gdc_launch_dependents, gdc_wait, pdl_enabled, pdl_launch
from seq2serve.runtime.kernels.position_bias import PositionBias
from seq2serve.runtime.kernels.triton_bias import bias_constexprs, t5_bias
from seq2serve.runtime.kernels.triton_flash import (
    block_d,
    cap_scores,
    dot_precision,
    online_softmax_update,
    softcap_constexpr,
    softmax_finish,
)

BLOCK_N = 64  # keys per step
MIN_SPLIT_KEYS = 128  # a split shorter than this costs more to merge than it saves
MAX_SPLITS = 32
PROGRAMS_PER_SM = 4  # stage-1 programs wanted per SM before splitting stops paying


def num_kv_splits(batch: int, num_kv_heads: int, max_kv_len: int, num_sms: int) -> int:
    """Splits per request so that batch * heads * splits programs fill the device, each split
    keeping at least MIN_SPLIT_KEYS keys of the longest request. Host-side lengths only."""
    wanted = triton.cdiv(PROGRAMS_PER_SM * num_sms, max(1, batch * num_kv_heads))
    cap = min(MAX_SPLITS, triton.cdiv(max(max_kv_len, 1), MIN_SPLIT_KEYS))
    return max(1, min(wanted, cap))


@triton.jit
def _decode_split_kernel(
    q, k_buf, v_buf, out, part_out, part_lse, counters, page_table, req_rows, kv_starts,
    kv_ends, bias_table, scaling, stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh,
    stride_ot, stride_pt, stride_bb, stride_bh,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, MIN_KEYS: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, HAS_KV_START: tl.constexpr, HAS_BIAS: tl.constexpr,
    BIDIRECTIONAL: tl.constexpr, NUM_BUCKETS: tl.constexpr, LOG_RATIO: tl.constexpr,
    PDL: tl.constexpr, SOFTCAP: tl.constexpr,
):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    kv_end = tl.load(kv_ends + b)
    kv_start = tl.load(kv_starts + b) if HAS_KV_START else 0
    kv_len = tl.maximum(kv_end - kv_start, 0)
    # a request uses as many of the NUM_SPLITS programs as it has MIN_KEYS-key chunks (a
    # CUDA graph fixes NUM_SPLITS for the longest request it may see; a short one still
    # gets one program and no merge); the others have nothing to do
    splits = tl.minimum(tl.maximum(tl.cdiv(kv_len, MIN_KEYS), 1), NUM_SPLITS)
    if split < splits:
        row = tl.load(req_rows + b).to(tl.int64)
        chunk = tl.cdiv(tl.cdiv(kv_len, splits), BLOCK_N) * BLOCK_N
        start = kv_start + split * chunk
        end = tl.minimum(start + chunk, kv_end)

        r = tl.arange(0, BLOCK_H)
        heads = kv_head * GROUP + r  # the query heads sharing this KV head, padded to BLOCK_H
        h_ok = r < GROUP
        d = tl.arange(0, BLOCK_D)
        d_ok = d < HEAD_DIM
        q_tile = tl.load(q + b * stride_qt + heads[:, None] * stride_qh + d[None, :],
                         mask=h_ok[:, None] & d_ok[None, :], other=0.0)
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            n_ok = n < end
            slot = tl.load(page_table + row * stride_pt + n, mask=n_ok, other=0).to(tl.int64)
            kv_mask = n_ok[:, None] & d_ok[None, :]
            k = tl.load(k_buf + slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :],
                        mask=kv_mask, other=0.0)
            scores = cap_scores(tl.dot(q_tile, tl.trans(k), input_precision=DOT_PRECISION)
                                * scaling, SOFTCAP)
            if HAS_BIAS:  # the query is the request's last position, kv_end - 1
                scores += t5_bias(bias_table, stride_bb, stride_bh, heads[:, None],
                                  (n - kv_end + 1)[None, :], h_ok[:, None], BIDIRECTIONAL,
                                  NUM_BUCKETS, LOG_RATIO)
            scores = tl.where(n_ok[None, :], scores, float("-inf"))
            v = tl.load(v_buf + slot[:, None] * stride_vs + kv_head * stride_vh + d[None, :],
                        mask=kv_mask, other=0.0)
            m_i, l_i, acc = online_softmax_update(scores, v, m_i, l_i, acc, DOT_PRECISION)
        o, lse = softmax_finish(m_i, l_i, acc)
        o_mask = h_ok[:, None] & d_ok[None, :]
        if splits == 1:
            tl.store(out + b * stride_ot + heads[:, None] * HEAD_DIM + d[None, :],
                     o.to(out.dtype.element_ty), mask=o_mask)
        else:
            base = (b * NUM_HEADS + heads) * NUM_SPLITS  # this head group's partials
            tl.store(part_out + (base + split)[:, None] * HEAD_DIM + d[None, :], o,
                     mask=o_mask)
            tl.store(part_lse + base + split, lse, mask=h_ok)
            tl.debug_barrier()  # every thread's partial is written before the count goes up
            counter = counters + b * NUM_KV_HEADS + kv_head
            if tl.atomic_add(counter, 1, sem="acq_rel") == splits - 1:  # the last split
                tl.atomic_xchg(counter, 0)  # ready for the next call
                m = tl.full([BLOCK_H], float("-inf"), tl.float32)
                for s in range(0, splits):
                    m = tl.maximum(m, tl.load(part_lse + base + s, mask=h_ok,
                                              other=float("-inf"), cache_modifier=".cg"))
                m = tl.where(m == float("-inf"), 0.0, m)  # no keys anywhere: weights all 0
                total = tl.zeros([BLOCK_H], tl.float32)
                merged = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
                for s in range(0, splits):
                    weight = tl.exp(tl.load(part_lse + base + s, mask=h_ok,
                                            other=float("-inf"), cache_modifier=".cg") - m)
                    o_s = tl.load(part_out + (base + s)[:, None] * HEAD_DIM + d[None, :],
                                  mask=o_mask, other=0.0, cache_modifier=".cg")
                    total += weight
                    merged += weight[:, None] * o_s
                merged = merged / tl.where(total == 0.0, 1.0, total)[:, None]
                tl.store(out + b * stride_ot + heads[:, None] * HEAD_DIM + d[None, :],
                         merged.to(out.dtype.element_ty), mask=o_mask)


_counters: dict[torch.device, list[torch.Tensor]] = {}


def _split_counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 counters, at least n, for the last-split election. Kernels leave them at
    zero; they are never freed, since captured CUDA graphs hold their address."""
    held = _counters.setdefault(device, [])
    if not held or held[-1].numel() < n:
        held.append(torch.zeros(max(n, 2 * held[-1].numel() if held else 1024),
                                dtype=torch.int32, device=device))
    return held[-1]


def paged_decode_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                           page_table: torch.Tensor, req_rows: torch.Tensor,
                           kv_ends: torch.Tensor, num_splits: int, scaling: float,
                           bias: PositionBias | None = None,
                           kv_starts: torch.Tensor | None = None,
                           softcap: float | None = None) -> torch.Tensor:
    """Attention of one query per request over its paged keys -> [B, H * D] in q's dtype.

    q: [B, H, D]. Request b reads keys j in [kv_starts[b] (default 0), kv_ends[b]) at slots
    page_table[req_rows[b], j] of k_buf/v_buf ([slots, KVH, D]). With a bias, the query sits
    at position kv_ends[b] - 1 (the newest decoder token). A request with no keys gets zeros.
    softcap: Gemma's cap on the scores (a sliding window is a `kv_starts`).
    """
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_buf.shape[1]
    out = torch.empty(batch, num_heads * head_dim, dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    if num_splits > 1:
        part_out = torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32,
                               device=q.device)
        part_lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32,
                               device=q.device)
    else:
        part_out = part_lse = out  # unused: one split writes the output itself
    # int32 even when unused: Triton compiles the merge branch regardless, and its atomics
    # take no bf16/fp16 pointer (tests/test_kernel_compile.py compiles every dtype for sm_90)
    counters = _split_counters(q.device, batch * num_kv_heads)
    group = num_heads // num_kv_heads
    table = bias.weight if bias is not None else q
    bd = block_d(head_dim)
    # one program per (request, KV head, split): a variant taking several MHA heads per
    # program with row-wise products measured slower on an H100 (2026-11-22)
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q, k_buf, v_buf, out, part_out, part_lse, counters, page_table, req_rows,
        kv_starts if kv_starts is not None else kv_ends, kv_ends, table, scaling,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0),
        v_buf.stride(1), out.stride(0), page_table.stride(0), table.stride(0),
        table.stride(1), NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, GROUP=group,
        HEAD_DIM=head_dim, MIN_KEYS=MIN_SPLIT_KEYS, PDL=pdl_enabled(),
        NUM_SPLITS=num_splits, BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_N=BLOCK_N, BLOCK_D=bd, DOT_PRECISION=dot_precision(q.dtype),
        HAS_KV_START=kv_starts is not None, **bias_constexprs(bias),
        SOFTCAP=softcap_constexpr(softcap), num_warps=4, **pdl_launch(),
    )
    return out
