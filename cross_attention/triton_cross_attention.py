"""Ragged cross-attention in Triton: decoder queries over their own request's encoder K/V in the
CrossKVPool, found through the request's row of req_to_cross. Encoder lengths differ per
request and nothing is padded. An optional per-query key range (Mllama's image groups) lets
query t see only keys [kv_start[t], kv_end[t]); a query that sees no key gets zeros.

Decode (one query per request) runs the split-KV `triton_decode.paged_decode_attention` over
each request's range; extend runs the kernel below, one program per tile of a request's
queries and one query head."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from seq2serve.runtime.kernels.triton_flash import (
    BLOCK_M,
    block_d,
    block_n,
    dot_precision,
    num_warps,
    online_softmax_update,
    softmax_finish,
)


@triton.jit
def _cross_extend_kernel(
    q, k_buf, v_buf, out, req_to_cross, req_rows, encoder_lens, q_starts, block_req,
    block_start, kv_start, kv_end, scaling, stride_qt, stride_qh, stride_ks, stride_kh, stride_vs,
    stride_vh, stride_ot, stride_rc,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_RANGE: tl.constexpr,
):
    blk = tl.program_id(0)
    head = tl.program_id(1)
    i = tl.load(block_req + blk)
    m0 = tl.load(block_start + blk)
    q_start = tl.load(q_starts + i)
    q_len = tl.load(q_starts + i + 1) - q_start
    enc_len = tl.load(encoder_lens + i)
    row = tl.load(req_rows + i).to(tl.int64)
    kv_head = head // GROUP

    m = m0 + tl.arange(0, BLOCK_M)
    m_ok = m < q_len
    if HAS_RANGE:
        lo = tl.load(kv_start + q_start + m, mask=m_ok, other=0)
        hi = tl.minimum(tl.load(kv_end + q_start + m, mask=m_ok, other=0), enc_len)
    else:
        lo = tl.zeros([BLOCK_M], tl.int32)
        hi = tl.where(m_ok, enc_len, 0)
    begin = tl.min(tl.where(m_ok, lo, enc_len), 0)  # the keys any query of the tile sees
    end = tl.max(hi, 0)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_tile = tl.load(q + (q_start + m)[:, None] * stride_qt + head * stride_qh + d[None, :],
                     mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(begin, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < end
        slot = tl.load(req_to_cross + row * stride_rc + n, mask=n_ok, other=0).to(tl.int64)
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_buf + slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :],
                    mask=kv_mask, other=0.0)
        scores = tl.dot(q_tile, tl.trans(k), input_precision=DOT_PRECISION) * scaling
        visible = (n[None, :] >= lo[:, None]) & (n[None, :] < hi[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        v = tl.load(v_buf + slot[:, None] * stride_vs + kv_head * stride_vh + d[None, :],
                    mask=kv_mask, other=0.0)
        m_i, l_i, acc = online_softmax_update(scores, v, m_i, l_i, acc, DOT_PRECISION)
    o, _ = softmax_finish(m_i, l_i, acc)
    tl.store(out + (q_start + m)[:, None] * stride_ot + head * HEAD_DIM + d[None, :],
             o.to(out.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def cross_attention_extend(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                           req_to_cross: torch.Tensor, req_rows: torch.Tensor,
                           encoder_lens: torch.Tensor, q_starts: torch.Tensor,
                           block_req: torch.Tensor, block_start: torch.Tensor, scaling: float,
                           kv_start: torch.Tensor | None = None,
                           kv_end: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-attention of packed decoder queries -> [T, H * D] in q's dtype.

    q: [T, H, D]; request i owns rows q_starts[i]:q_starts[i + 1] and attends to its
    encoder_lens[i] keys at slots req_to_cross[req_rows[i], :]; kv_start/kv_end ([T] int32,
    both or neither) narrow query t to keys [kv_start[t], kv_end[t]). block_req/block_start:
    the query tiles (`query_blocks`).
    """
    num_tokens, num_heads, head_dim = q.shape
    out = torch.empty(num_tokens, num_heads * head_dim, dtype=q.dtype, device=q.device)
    if block_req.numel() == 0:
        return out
    _cross_extend_kernel[(block_req.numel(), num_heads)](
        q, k_buf, v_buf, out, req_to_cross, req_rows, encoder_lens, q_starts, block_req,
        block_start, q_starts if kv_start is None else kv_start,
        q_starts if kv_end is None else kv_end, scaling, q.stride(0),
        q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        out.stride(0), req_to_cross.stride(0),
        GROUP=num_heads // k_buf.shape[1], HEAD_DIM=head_dim, BLOCK_M=BLOCK_M,
        BLOCK_N=block_n(head_dim), BLOCK_D=block_d(head_dim),
        DOT_PRECISION=dot_precision(q.dtype), HAS_RANGE=kv_start is not None,
        num_warps=num_warps(head_dim),
    )
    return out

