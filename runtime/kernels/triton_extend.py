"""The extend (prefill) attention kernel that self- and cross-attention share: packed decoder
queries over their own request's paged K/V, found through the request's row of a slot table
(req_to_token for self-attention, req_to_cross for cross-attention). One program per tile of a
request's queries (`triton_flash.query_blocks`) and one query head.

What differs between the two is compile-time (CAUSAL): self-attention's queries are the last
q_len of kv_len positions and see keys up to their own (plus the in-kernel T5 bias); the tile
loops only up to its last query's key. Cross-attention's queries see all kv_len keys, or with
HAS_RANGE only [kv_start[t], kv_end[t]); the tile loops over the union of its queries' ranges,
and a query that sees no key gets zeros."""

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
    num_warps,
    online_softmax_update,
    softcap_constexpr,
    softmax_finish,
)


@triton.jit
def _extend_kernel(
    q, k_buf, v_buf, out, req_to_kv, req_rows, kv_lens, q_starts, block_req, block_start,
    kv_start, kv_end, bias_table, scaling, window, stride_qt, stride_qh, stride_ks, stride_kh,
    stride_vs, stride_vh, stride_ot, stride_rt, stride_bb, stride_bh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_RANGE: tl.constexpr, HAS_BIAS: tl.constexpr, BIDIRECTIONAL: tl.constexpr,
    NUM_BUCKETS: tl.constexpr, LOG_RATIO: tl.constexpr, SOFTCAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
):
    blk = tl.program_id(0)
    head = tl.program_id(1)
    i = tl.load(block_req + blk)
    m0 = tl.load(block_start + blk)
    q_start = tl.load(q_starts + i)
    q_len = tl.load(q_starts + i + 1) - q_start
    kv_len = tl.load(kv_lens + i)
    row = tl.load(req_rows + i).to(tl.int64)
    kv_head = head // GROUP

    m = m0 + tl.arange(0, BLOCK_M)
    m_ok = m < q_len
    # the keys each query sees, and [begin, end): those any query of the tile sees, the loop's
    # range. (The statements keep the order of the two kernels this one replaced: same SASS.)
    if CAUSAL:
        q_pos = kv_len - q_len + m  # the new tokens are the request's last q_len positions
    else:
        if HAS_RANGE:
            lo = tl.load(kv_start + q_start + m, mask=m_ok, other=0)
            hi = tl.minimum(tl.load(kv_end + q_start + m, mask=m_ok, other=0), kv_len)
        else:
            lo = tl.zeros([BLOCK_M], tl.int32)
            hi = tl.where(m_ok, kv_len, 0)
        begin = tl.min(tl.where(m_ok, lo, kv_len), 0)
        end = tl.max(hi, 0)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_tile = tl.load(q + (q_start + m)[:, None] * stride_qt + head * stride_qh + d[None, :],
                     mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if CAUSAL:
        begin = 0
        if HAS_WINDOW:  # from the tile's first query's oldest visible key
            begin = tl.maximum(kv_len - q_len + m0 - window + 1, 0)
        end = tl.minimum(kv_len, kv_len - q_len + m0 + BLOCK_M)  # up to the tile's last query
    for n0 in range(begin, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < end
        slot = tl.load(req_to_kv + row * stride_rt + n, mask=n_ok, other=0).to(tl.int64)
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_buf + slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :],
                    mask=kv_mask, other=0.0)
        scores = cap_scores(tl.dot(q_tile, tl.trans(k), input_precision=DOT_PRECISION)
                            * scaling, SOFTCAP)
        if CAUSAL:
            rel = n[None, :] - q_pos[:, None]
            visible = (rel <= 0) & n_ok[None, :]
            if HAS_WINDOW:  # the last `window` positions, the query's own included
                visible = visible & (rel > -window)
            if HAS_BIAS:
                scores += t5_bias(bias_table, stride_bb, stride_bh, head, rel, visible,
                                  BIDIRECTIONAL, NUM_BUCKETS, LOG_RATIO)
        else:
            visible = (n[None, :] >= lo[:, None]) & (n[None, :] < hi[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        v = tl.load(v_buf + slot[:, None] * stride_vs + kv_head * stride_vh + d[None, :],
                    mask=kv_mask, other=0.0)
        m_i, l_i, acc = online_softmax_update(scores, v, m_i, l_i, acc, DOT_PRECISION)
    o, _ = softmax_finish(m_i, l_i, acc)
    tl.store(out + (q_start + m)[:, None] * stride_ot + head * HEAD_DIM + d[None, :],
             o.to(out.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def extend_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                     req_to_kv: torch.Tensor, req_rows: torch.Tensor, kv_lens: torch.Tensor,
                     q_starts: torch.Tensor, block_req: torch.Tensor, block_start: torch.Tensor,
                     scaling: float, *, causal: bool, bias: PositionBias | None = None,
                     kv_start: torch.Tensor | None = None, kv_end: torch.Tensor | None = None,
                     softcap: float | None = None,
                     window: int | None = None) -> torch.Tensor:
    """Packed queries q [T, H, D] over paged K/V -> [T, H * D] in q's dtype. Request i owns
    rows q_starts[i]:q_starts[i + 1] and keys 0:kv_lens[i] at slots req_to_kv[req_rows[i], :].
    causal: self-attention (a T5 `bias` and a sliding `window` allowed: the last `window`
    positions); else cross (kv_start/kv_end allowed). `softcap`: Gemma's cap on the scores."""
    if causal and kv_start is not None or not causal and (bias is not None or window):
        raise ValueError("a T5 bias and a window need causal=True, per-query key ranges "
                         "causal=False")
    num_tokens, num_heads, head_dim = q.shape
    out = torch.empty(num_tokens, num_heads * head_dim, dtype=q.dtype, device=q.device)
    if block_req.numel() == 0:
        return out
    table = bias.weight if bias is not None else q  # placeholders where unused
    _extend_kernel[(block_req.numel(), num_heads)](
        q, k_buf, v_buf, out, req_to_kv, req_rows, kv_lens, q_starts, block_req, block_start,
        q_starts if kv_start is None else kv_start, q_starts if kv_end is None else kv_end,
        table, scaling, window or 0, q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1),
        v_buf.stride(0), v_buf.stride(1), out.stride(0), req_to_kv.stride(0),
        table.stride(0), table.stride(1),
        GROUP=num_heads // k_buf.shape[1], HEAD_DIM=head_dim, BLOCK_M=BLOCK_M,
        BLOCK_N=block_n(head_dim), BLOCK_D=block_d(head_dim),
        DOT_PRECISION=dot_precision(q.dtype), CAUSAL=causal, HAS_RANGE=kv_start is not None,
        **bias_constexprs(bias), SOFTCAP=softcap_constexpr(softcap),
        HAS_WINDOW=bool(window), num_warps=num_warps(head_dim),
    )
    return out
