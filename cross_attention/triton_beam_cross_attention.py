"""Decode cross-attention for beam groups: the beams of one request share its cross K/V (their
req_to_cross rows point at the same slots), so one program reads a key block once and uses it
for every beam's queries of every query head on that KV head, instead of one program per beam
row reading the same block again (`triton_decode.paged_decode_attention`, today's path).

Tile: the M = beams x GROUP (GROUP = H // KVH) query rows of a (group, KV head) as one
[BLOCK_M, D] operand of `tl.dot` (BLOCK_M a power of two >= 16, the rest masked; groups past
MAX_BLOCK_M rows take several tiles), against [BLOCK_N, D] key and value blocks. Grid: (group,
KV head x M tile, split). Cross-attention bytes per step are then those of the requests:
groups x keys x KVH x D x 2 (K and V) x itemsize, 1 / beams of what the rows ask for today.

Split-KV as in `triton_decode`: a tile with more keys than MIN_SPLIT_KEYS uses several
programs over the keys, each writes a partial (output and log-sum-exp) and the last one to
finish, elected by an atomic counter it resets, merges them in the same kernel.

Not wired into the backend yet: `TritonBackend.forward_cross` still runs one program per row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from seq2serve.runtime.kernels.pdl import gdc_launch_dependents, gdc_wait, pdl_enabled, pdl_launch
from seq2serve.runtime.kernels.triton_decode import BLOCK_N, MIN_SPLIT_KEYS, _split_counters
from seq2serve.runtime.kernels.triton_flash import (
    block_d,
    dot_precision,
    online_softmax_update,
    softmax_finish,
)

# query rows of one tile at most: 8 beams x GROUP 8 (Llama-style GQA) in one; its float32
# accumulator at head_dim 128 is 64 registers a thread with 4 warps
MAX_BLOCK_M = 64


@triton.jit
def _beam_cross_kernel(
    q, k_buf, v_buf, out, part_out, part_lse, counters, page_table, group_rows, group_starts,
    kv_starts, kv_ends, scaling, stride_qt, stride_qh, stride_ks, stride_kh, stride_vs,
    stride_vh, stride_ot, stride_pt,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, M_TILES: tl.constexpr,
    MIN_KEYS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_KV_START: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    g = tl.program_id(0)
    kv_head = tl.program_id(1) // M_TILES
    m_tile = tl.program_id(1) % M_TILES
    split = tl.program_id(2)
    first = tl.load(group_starts + g)
    num_rows = (tl.load(group_starts + g + 1) - first) * GROUP  # the group's query rows here
    # tile row i: beam i // GROUP of the group, query head kv_head * GROUP + i % GROUP
    i = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    i_ok = i < num_rows
    rows = (first + i // GROUP).to(tl.int64)
    heads = kv_head * GROUP + i % GROUP
    ends = tl.load(kv_ends + rows, mask=i_ok, other=0)
    if HAS_KV_START:
        starts = tl.load(kv_starts + rows, mask=i_ok, other=0)
    else:
        starts = tl.zeros([BLOCK_M], tl.int32)
    # keys the tile reads: the union of its rows' windows (the beams of a group share theirs,
    # but a row keeps its own window as in paged_decode_attention); rows with none add nothing
    seen = i_ok & (ends > starts)
    lo = tl.min(tl.where(seen, starts, 2147483647), 0)
    hi = tl.max(tl.where(seen, ends, 0), 0)
    lo = tl.minimum(lo, hi)
    kv_len = hi - lo
    splits = tl.minimum(tl.maximum(tl.cdiv(kv_len, MIN_KEYS), 1), NUM_SPLITS)
    if (m_tile * BLOCK_M < num_rows) & (split < splits):
        table_row = tl.load(group_rows + g).to(tl.int64)
        chunk = tl.cdiv(tl.cdiv(kv_len, splits), BLOCK_N) * BLOCK_N
        start = lo + split * chunk
        end = tl.minimum(start + chunk, hi)

        d = tl.arange(0, BLOCK_D)
        d_ok = d < HEAD_DIM
        q_mask = i_ok[:, None] & d_ok[None, :]
        q_tile = tl.load(q + rows[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
                         mask=q_mask, other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            n_ok = n < end
            slot = tl.load(page_table + table_row * stride_pt + n, mask=n_ok,
                           other=0).to(tl.int64)
            kv_mask = n_ok[:, None] & d_ok[None, :]
            k = tl.load(k_buf + slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :],
                        mask=kv_mask, other=0.0)
            scores = tl.dot(q_tile, tl.trans(k), input_precision=DOT_PRECISION) * scaling
            visible = (n[None, :] >= starts[:, None]) & (n[None, :] < ends[:, None])
            scores = tl.where(visible & n_ok[None, :], scores, float("-inf"))
            v = tl.load(v_buf + slot[:, None] * stride_vs + kv_head * stride_vh + d[None, :],
                        mask=kv_mask, other=0.0)
            m_i, l_i, acc = online_softmax_update(scores, v, m_i, l_i, acc, DOT_PRECISION)
        o, lse = softmax_finish(m_i, l_i, acc)
        out_ptrs = out + rows[:, None] * stride_ot + heads[:, None] * HEAD_DIM + d[None, :]
        if splits == 1:
            tl.store(out_ptrs, o.to(out.dtype.element_ty), mask=q_mask)
        else:
            base = (rows * NUM_HEADS + heads) * NUM_SPLITS  # each row's partials
            tl.store(part_out + (base + split)[:, None] * HEAD_DIM + d[None, :], o,
                     mask=q_mask)
            tl.store(part_lse + base + split, lse, mask=i_ok)
            tl.debug_barrier()  # every thread's partial is written before the count goes up
            counter = counters + (g * NUM_KV_HEADS + kv_head) * M_TILES + m_tile
            if tl.atomic_add(counter, 1, sem="acq_rel") == splits - 1:  # the last split
                tl.atomic_xchg(counter, 0)  # ready for the next call
                m = tl.full([BLOCK_M], float("-inf"), tl.float32)
                for s in range(0, splits):
                    m = tl.maximum(m, tl.load(part_lse + base + s, mask=i_ok,
                                              other=float("-inf"), cache_modifier=".cg"))
                m = tl.where(m == float("-inf"), 0.0, m)  # no keys anywhere: weights all 0
                total = tl.zeros([BLOCK_M], tl.float32)
                merged = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
                for s in range(0, splits):
                    weight = tl.exp(tl.load(part_lse + base + s, mask=i_ok,
                                            other=float("-inf"), cache_modifier=".cg") - m)
                    o_s = tl.load(part_out + (base + s)[:, None] * HEAD_DIM + d[None, :],
                                  mask=q_mask, other=0.0, cache_modifier=".cg")
                    total += weight
                    merged += weight[:, None] * o_s
                merged = merged / tl.where(total == 0.0, 1.0, total)[:, None]
                tl.store(out_ptrs, merged.to(out.dtype.element_ty), mask=q_mask)


def beam_tile(max_beams: int, group: int) -> tuple[int, int]:
    """(BLOCK_M, tiles per (group, KV head)) for groups of up to max_beams beams."""
    rows = max(1, max_beams) * group
    block_m = max(16, min(MAX_BLOCK_M, triton.next_power_of_2(rows)))
    return block_m, triton.cdiv(rows, block_m)


def beam_cross_attention_decode(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                                req_to_cross: torch.Tensor, group_rows: torch.Tensor,
                                group_starts: torch.Tensor, kv_ends: torch.Tensor,
                                scaling: float, kv_starts: torch.Tensor | None = None,
                                num_splits: int = 1, max_beams: int | None = None, *,
                                block_n: int = BLOCK_N, num_warps: int = 4) -> torch.Tensor:
    """Cross-attention of one query per beam row, K/V read once per beam group -> [rows, H * D]
    in q's dtype.

    q: [rows, H, D], the rows of group g contiguous: q[group_starts[g]:group_starts[g + 1]]
    (group_starts: [G + 1] int32, group_starts[G] == rows). Group g's keys are at slots
    req_to_cross[group_rows[g], j] of k_buf/v_buf ([slots, KVH, D]); row t reads keys j in
    [kv_starts[t] (default 0), kv_ends[t]) -- per row, as `paged_decode_attention` takes them
    (Mllama's image ranges); a row that sees no key gets zeros. num_splits: the most programs
    a tile's keys are split over (`triton_decode.num_kv_splits` with the number of groups).
    max_beams: the largest group (rows), read from group_starts when not given (a device
    sync: pass it from the host lengths). block_n, num_warps: for tuning on a GPU.
    """
    rows, num_heads, head_dim = q.shape
    num_groups = group_rows.shape[0]
    num_kv_heads = k_buf.shape[1]
    assert group_starts.shape[0] == num_groups + 1, "group_starts needs one entry past the last"
    out = torch.empty(rows, num_heads * head_dim, dtype=q.dtype, device=q.device)
    if num_groups == 0 or rows == 0:
        return out
    if max_beams is None:
        max_beams = int((group_starts[1:] - group_starts[:-1]).max())
    group = num_heads // num_kv_heads
    block_m, m_tiles = beam_tile(max_beams, group)
    if num_splits > 1:
        part_out = torch.empty(rows, num_heads, num_splits, head_dim, dtype=torch.float32,
                               device=q.device)
        part_lse = torch.empty(rows, num_heads, num_splits, dtype=torch.float32,
                               device=q.device)
    else:
        part_out = part_lse = out  # unused: one split writes the output itself
    # int32 even when unused: the merge branch is compiled regardless (atomics take no bf16)
    counters = _split_counters(q.device, num_groups * num_kv_heads * m_tiles)
    _beam_cross_kernel[(num_groups, num_kv_heads * m_tiles, num_splits)](
        q, k_buf, v_buf, out, part_out, part_lse, counters, req_to_cross, group_rows,
        group_starts, kv_starts if kv_starts is not None else kv_ends, kv_ends, scaling,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0),
        v_buf.stride(1), out.stride(0), req_to_cross.stride(0),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, GROUP=group, HEAD_DIM=head_dim,
        NUM_SPLITS=num_splits, M_TILES=m_tiles, MIN_KEYS=MIN_SPLIT_KEYS, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_D=block_d(head_dim), DOT_PRECISION=dot_precision(q.dtype),
        HAS_KV_START=kv_starts is not None, PDL=pdl_enabled(), num_warps=num_warps,
        **pdl_launch(),
    )
    return out

