"""Bidirectional attention over a packed, ragged batch of encoder inputs (varlen), with the T5
relative position bias computed in the kernel. Attention stays within each sequence."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from seq2serve.runtime.kernels.position_bias import PositionBias
from seq2serve.runtime.kernels.triton_bias import bias_constexprs, t5_bias
from seq2serve.runtime.kernels.triton_flash import (
    BLOCK_M,
    block_d,
    block_n,
    cap_scores,
    dot_precision,
    num_stages,
    num_warps,
    online_softmax_update,
    softcap_constexpr,
    softmax_finish,
)


@triton.jit
def _encoder_kernel(
    q, k, v, out, cu_seqlens, block_req, block_start, bias_table, scaling, window,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot,
    stride_bb, stride_bh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_BIAS: tl.constexpr,
    BIDIRECTIONAL: tl.constexpr, NUM_BUCKETS: tl.constexpr, LOG_RATIO: tl.constexpr,
    SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr,
):
    blk = tl.program_id(0)
    head = tl.program_id(1)
    i = tl.load(block_req + blk)
    m0 = tl.load(block_start + blk)
    start = tl.load(cu_seqlens + i)
    length = tl.load(cu_seqlens + i + 1) - start
    kv_head = head // GROUP

    m = m0 + tl.arange(0, BLOCK_M)
    m_ok = m < length
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_tile = tl.load(q + (start + m)[:, None] * stride_qt + head * stride_qh + d[None, :],
                     mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    begin = 0
    end = length
    if HAS_WINDOW:  # the keys within `window` of any query of the tile
        begin = tl.maximum(m0 - window, 0)
        end = tl.minimum(m0 + BLOCK_M + window, length)
    for n0 in range(begin, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < end
        token = (start + n).to(tl.int64)
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k_tile = tl.load(k + token[:, None] * stride_kt + kv_head * stride_kh + d[None, :],
                         mask=kv_mask, other=0.0)
        scores = cap_scores(tl.dot(q_tile, tl.trans(k_tile), input_precision=DOT_PRECISION)
                            * scaling, SOFTCAP)
        if HAS_BIAS:
            scores += t5_bias(bias_table, stride_bb, stride_bh, head, n[None, :] - m[:, None],
                              n_ok[None, :], BIDIRECTIONAL, NUM_BUCKETS, LOG_RATIO)
        visible = n_ok[None, :]
        if HAS_WINDOW:
            near = n[None, :] - m[:, None]
            visible = visible & (near <= window) & (near >= -window)
        scores = tl.where(visible, scores, float("-inf"))
        v_tile = tl.load(v + token[:, None] * stride_vt + kv_head * stride_vh + d[None, :],
                         mask=kv_mask, other=0.0)
        m_i, l_i, acc = online_softmax_update(scores, v_tile, m_i, l_i, acc, DOT_PRECISION)
    o, _ = softmax_finish(m_i, l_i, acc)
    tl.store(out + (start + m)[:, None] * stride_ot + head * HEAD_DIM + d[None, :],
             o.to(out.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def encoder_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      cu_seqlens: torch.Tensor, block_req: torch.Tensor,
                      block_start: torch.Tensor, scaling: float,
                      bias: PositionBias | None = None, softcap: float | None = None,
                      window: int | None = None) -> torch.Tensor:
    """Bidirectional attention within each packed sequence -> [T, H * D] in q's dtype.

    q: [T, H, D], k/v: [T, KVH, D]; sequence i is rows cu_seqlens[i]:cu_seqlens[i + 1] and its
    positions count from 0. block_req/block_start: its query tiles (`query_blocks`).
    `window`: a query sees the keys at most `window` positions away on either side;
    `softcap`: Gemma's cap on the scores.
    """
    num_tokens, num_heads, head_dim = q.shape
    out = torch.empty(num_tokens, num_heads * head_dim, dtype=q.dtype, device=q.device)
    if block_req.numel() == 0:
        return out
    table = bias.weight if bias is not None else q
    _encoder_kernel[(block_req.numel(), num_heads)](
        q, k, v, out, cu_seqlens, block_req, block_start, table, scaling, window or 0,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), table.stride(0), table.stride(1),
        GROUP=num_heads // k.shape[1], HEAD_DIM=head_dim, BLOCK_M=BLOCK_M,
        BLOCK_N=block_n(head_dim), BLOCK_D=block_d(head_dim),
        DOT_PRECISION=dot_precision(q.dtype), **bias_constexprs(bias),
        SOFTCAP=softcap_constexpr(softcap), HAS_WINDOW=bool(window),
        num_warps=num_warps(head_dim), num_stages=num_stages(head_dim, q.dtype),
    )
    return out
