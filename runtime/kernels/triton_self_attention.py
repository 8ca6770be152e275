"""Paged causal self-attention for decoder prompts (extend), with a cached prefix and the T5
relative position bias computed in the kernel. Batches of one query per request go to
`triton_decode.paged_decode_attention` instead."""

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
    dot_precision,
    num_warps,
    online_softmax_update,
    softmax_finish,
)


@triton.jit
def _self_extend_kernel(
    q, k_buf, v_buf, out, req_to_token, req_rows, seq_lens, q_starts, block_req, block_start,
    bias_table, scaling, stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh,
    stride_ot, stride_rt, stride_bb, stride_bh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_BIAS: tl.constexpr,
    BIDIRECTIONAL: tl.constexpr, NUM_BUCKETS: tl.constexpr, LOG_RATIO: tl.constexpr,
):
    blk = tl.program_id(0)
    head = tl.program_id(1)
    i = tl.load(block_req + blk)
    m0 = tl.load(block_start + blk)
    q_start = tl.load(q_starts + i)
    q_len = tl.load(q_starts + i + 1) - q_start
    seq_len = tl.load(seq_lens + i)
    row = tl.load(req_rows + i).to(tl.int64)
    kv_head = head // GROUP

    m = m0 + tl.arange(0, BLOCK_M)
    m_ok = m < q_len
    q_pos = seq_len - q_len + m  # the new tokens are the request's last q_len positions
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_tile = tl.load(q + (q_start + m)[:, None] * stride_qt + head * stride_qh + d[None, :],
                     mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end = tl.minimum(seq_len, seq_len - q_len + m0 + BLOCK_M)  # the block's last query's keys
    for n0 in range(0, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < end
        slot = tl.load(req_to_token + row * stride_rt + n, mask=n_ok, other=0).to(tl.int64)
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_buf + slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :],
                    mask=kv_mask, other=0.0)
        scores = tl.dot(q_tile, tl.trans(k), input_precision=DOT_PRECISION) * scaling
        rel = n[None, :] - q_pos[:, None]
        visible = (rel <= 0) & n_ok[None, :]
        if HAS_BIAS:
            scores += t5_bias(bias_table, stride_bb, stride_bh, head, rel, visible,
                              BIDIRECTIONAL, NUM_BUCKETS, LOG_RATIO)
        scores = tl.where(visible, scores, float("-inf"))
        v = tl.load(v_buf + slot[:, None] * stride_vs + kv_head * stride_vh + d[None, :],
                    mask=kv_mask, other=0.0)
        m_i, l_i, acc = online_softmax_update(scores, v, m_i, l_i, acc, DOT_PRECISION)
    o, _ = softmax_finish(m_i, l_i, acc)
    tl.store(out + (q_start + m)[:, None] * stride_ot + head * HEAD_DIM + d[None, :],
             o.to(out.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def self_attention_extend(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                          req_to_token: torch.Tensor, req_rows: torch.Tensor,
                          seq_lens: torch.Tensor, q_starts: torch.Tensor,
                          block_req: torch.Tensor, block_start: torch.Tensor, scaling: float,
                          bias: PositionBias | None = None) -> torch.Tensor:
    """Causal attention of packed decoder queries over their paged K/V -> [T, H * D].

    q: [T, H, D]; request i owns rows q_starts[i]:q_starts[i + 1], its last positions out of
    seq_lens[i], whose K/V (new tokens included) sit at slots req_to_token[req_rows[i], :].
    block_req/block_start: the query tiles (`triton_flash.query_blocks`), one program each.
    """
    num_tokens, num_heads, head_dim = q.shape
    out = torch.empty(num_tokens, num_heads * head_dim, dtype=q.dtype, device=q.device)
    if block_req.numel() == 0:
        return out
    table = bias.weight if bias is not None else q
    _self_extend_kernel[(block_req.numel(), num_heads)](
        q, k_buf, v_buf, out, req_to_token, req_rows, seq_lens, q_starts, block_req,
        block_start, table, scaling, q.stride(0), q.stride(1), k_buf.stride(0),
        k_buf.stride(1), v_buf.stride(0), v_buf.stride(1), out.stride(0),
        req_to_token.stride(0), table.stride(0), table.stride(1),
        GROUP=num_heads // k_buf.shape[1], HEAD_DIM=head_dim, BLOCK_M=BLOCK_M,
        BLOCK_N=block_n(head_dim), BLOCK_D=block_d(head_dim),
        DOT_PRECISION=dot_precision(q.dtype), **bias_constexprs(bias),
        num_warps=num_warps(head_dim),
    )
    return out
