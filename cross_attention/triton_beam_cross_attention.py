"""Decode cross-attention for beam groups: the beams of one request share its cross K/V (their
req_to_cross rows point at the same slots), so one program reads a key block once and uses it
for every beam's queries of every query head on that KV head, instead of one program per beam
row reading the same block again (`triton_decode.paged_decode_attention`).

Rows are described per row, as the scheduler lays a batch out (a group's rows contiguous):
`group_lens[t]` is the number of rows of the group whose first row is t, 0 for the other rows
of a group (a request without beams is a group of one), and `req_rows[t]` its table row. One
program per (first row, KV head, M tile, split); programs of rows that start no group return
at once. That shape is what a CUDA graph can hold: the grid depends on the batch size only,
and groups of any size run through the M-tile loop.

Tile: the beams x GROUP (GROUP = H // KVH) query rows of a (group, KV head) as [BLOCK_M, D]
operands of `tl.dot` (BLOCK_M a power of two >= 16 and >= GROUP; a larger group takes several
tiles, one program each), against [BLOCK_N, D] key and value blocks.
Cross-attention bytes per step are then those of the requests: groups x keys x KVH x D x 2
(K and V) x itemsize, 1 / beams of what one program per row reads.
(A loop over M tiles inside a program, so that any group fits any grid, measured 35 % slower
on an H200, and a tile path for groups of one 10-25 % slower than `paged_decode_attention`:
hence the fixed tiles and the one-row branch.)

Split-KV as in `triton_decode`: a tile with more keys than MIN_SPLIT_KEYS uses several
programs over the keys, each writes a partial (output and log-sum-exp) and the last one to
finish, elected by an atomic counter it resets, merges them in the same kernel. The counter of
tile j of the group starting at row t is that of row t + j (a group has at least as many rows
as tiles, since BLOCK_M >= GROUP).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from seq2serve.runtime.kernels.pdl import gdc_launch_dependents, gdc_wait, pdl_enabled, pdl_launch
from seq2serve.runtime.kernels.triton_decode import BLOCK_N, MIN_SPLIT_KEYS, _split_counters
from seq2serve.runtime.kernels.triton_flash import (
    block_d,
    cap_scores,
    dot_precision,
    online_softmax_update,
    softcap_constexpr,
    softmax_finish,
)

# query rows of one tile at most: 8 beams x GROUP 8 (Llama-style GQA) in one; its float32
# accumulator at head_dim 128 is 64 registers a thread with 4 warps
MAX_BLOCK_M = 64


@triton.jit
def _tile(q, k_buf, v_buf, out, part_out, part_lse, counters, page_table, kv_starts, kv_ends,
          scaling, first, table_row, kv_head, m_tile, split, num_rows, stride_qt, stride_qh,
          stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_pt,
          NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
          HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, MIN_KEYS: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
          DOT_PRECISION: tl.constexpr, HAS_KV_START: tl.constexpr, ONE_ROW: tl.constexpr,
          SOFTCAP: tl.constexpr):
    """One M tile of a group against its keys of one split (and the merge, by the last
    split). ONE_ROW: a group of one row (a request without beams): its window is a scalar, as
    in `paged_decode_attention`, and no per-row visibility mask is needed."""
    # tile row i: beam i // GROUP of the group, query head kv_head * GROUP + i % GROUP
    i = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    i_ok = i < num_rows
    rows = (first + i // GROUP).to(tl.int64)
    heads = kv_head * GROUP + i % GROUP
    if ONE_ROW:
        hi = tl.load(kv_ends + first)
        lo = tl.load(kv_starts + first) if HAS_KV_START else 0
        hi = tl.maximum(hi, lo)
        starts = tl.zeros([BLOCK_M], tl.int32)  # (unused)
        ends = starts
    else:
        ends = tl.load(kv_ends + rows, mask=i_ok, other=0)
        if HAS_KV_START:
            starts = tl.load(kv_starts + rows, mask=i_ok, other=0)
        else:
            starts = tl.zeros([BLOCK_M], tl.int32)
        # keys the tile reads: the union of its rows' windows (the beams of a group share
        # theirs, but a row keeps its own window as in paged_decode_attention); rows with
        # none add nothing
        seen = i_ok & (ends > starts)
        lo = tl.min(tl.where(seen, starts, 2147483647), 0)
        hi = tl.max(tl.where(seen, ends, 0), 0)
        lo = tl.minimum(lo, hi)
    kv_len = hi - lo
    splits = tl.minimum(tl.maximum(tl.cdiv(kv_len, MIN_KEYS), 1), NUM_SPLITS)
    if split < splits:
        chunk = tl.cdiv(tl.cdiv(kv_len, splits), BLOCK_N) * BLOCK_N
        start = lo + split * chunk
        end = tl.minimum(start + chunk, hi)
        d = tl.arange(0, BLOCK_D)
        d_ok = d < HEAD_DIM
        q_mask = i_ok[:, None] & d_ok[None, :]
        q_tile = tl.load(q + rows[:, None] * stride_qt + heads[:, None] * stride_qh
                         + d[None, :], mask=q_mask, other=0.0)
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
            scores = cap_scores(tl.dot(q_tile, tl.trans(k), input_precision=DOT_PRECISION)
                                * scaling, SOFTCAP)
            if ONE_ROW:
                scores = tl.where(n_ok[None, :], scores, float("-inf"))
            else:
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
            counter = counters + (first + m_tile) * NUM_KV_HEADS + kv_head
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


@triton.jit
def _beam_cross_kernel(
    q, k_buf, v_buf, out, part_out, part_lse, counters, page_table, req_rows, group_lens,
    kv_starts, kv_ends, scaling, stride_qt, stride_qh, stride_ks, stride_kh, stride_vs,
    stride_vh, stride_ot, stride_pt,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, M_TILES: tl.constexpr,
    MIN_KEYS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_KV_START: tl.constexpr,
    PDL: tl.constexpr, SOFTCAP: tl.constexpr,
):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    first = tl.program_id(0)  # the group's first row (a program of any other row: no tiles)
    kv_head = tl.program_id(1) // M_TILES
    m_tile = tl.program_id(1) % M_TILES
    split = tl.program_id(2)
    beams = tl.load(group_lens + first)
    if beams == 1:  # a row without beams: paged_decode_attention's work, no more
        if m_tile == 0:
            _tile(q, k_buf, v_buf, out, part_out, part_lse, counters, page_table, kv_starts,
                  kv_ends, scaling, first, tl.load(req_rows + first).to(tl.int64), kv_head, 0,
                  split, GROUP, stride_qt, stride_qh, stride_ks, stride_kh, stride_vs,
                  stride_vh, stride_ot, stride_pt, NUM_HEADS, NUM_KV_HEADS, GROUP, HEAD_DIM,
                  NUM_SPLITS, MIN_KEYS, BLOCK_M, BLOCK_N, BLOCK_D, DOT_PRECISION,
                  HAS_KV_START, True, SOFTCAP)
    elif m_tile * BLOCK_M < beams * GROUP:
        _tile(q, k_buf, v_buf, out, part_out, part_lse, counters, page_table, kv_starts,
              kv_ends, scaling, first, tl.load(req_rows + first).to(tl.int64), kv_head, m_tile,
              split, beams * GROUP, stride_qt, stride_qh, stride_ks, stride_kh, stride_vs,
              stride_vh, stride_ot, stride_pt, NUM_HEADS, NUM_KV_HEADS, GROUP, HEAD_DIM,
              NUM_SPLITS, MIN_KEYS, BLOCK_M, BLOCK_N, BLOCK_D, DOT_PRECISION, HAS_KV_START,
              False, SOFTCAP)


def beam_tile(max_beams: int, group: int) -> tuple[int, int]:
    """(BLOCK_M, tiles per (group, KV head)) for groups of up to max_beams beams: the
    smallest tile that holds one beam's GROUP query heads (and at least 16 rows, the tensor
    cores' least), so that a group of one wastes no more than `paged_decode_attention`'s."""
    block_m = max(16, min(MAX_BLOCK_M, triton.next_power_of_2(group)))
    return block_m, triton.cdiv(max(1, max_beams) * group, block_m)


def beam_cross_attention_rows(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                              req_to_cross: torch.Tensor, req_rows: torch.Tensor,
                              group_lens: torch.Tensor, kv_ends: torch.Tensor, scaling: float,
                              kv_starts: torch.Tensor | None = None, num_splits: int = 1,
                              m_tiles: int = 1, *, block_n: int = BLOCK_N,
                              num_warps: int = 4, softcap: float | None = None) -> torch.Tensor:
    """Cross-attention of one query per row, each beam group's K/V read once -> [rows, H * D]
    in q's dtype; the batch described per row (as a decode batch's inputs are, and as a CUDA
    graph can hold them).

    q: [rows, H, D]. group_lens: [rows] int, the rows of the group starting at row t (its
    rows t .. t + group_lens[t] - 1), 0 for rows inside a group. req_rows: [rows], the
    req_to_cross row of each (a group's first row's is read). Row t reads keys j in
    [kv_starts[t] (default 0), kv_ends[t]) at slots req_to_cross[req_rows[first], j] of
    k_buf/v_buf ([slots, KVH, D]); a row that sees no key gets zeros. num_splits: the most
    programs a tile's keys are split over (`triton_decode.num_kv_splits`). m_tiles: programs
    per (group, KV head) along the query rows: `beam_tile`'s for the largest group, at least
    (a group with more tiles than that is computed only in part). block_n, num_warps: for
    tuning. softcap: Gemma's cap on the scores.
    """
    rows, num_heads, head_dim = q.shape
    num_kv_heads = k_buf.shape[1]
    out = torch.empty(rows, num_heads * head_dim, dtype=q.dtype, device=q.device)
    if rows == 0:
        return out
    group = num_heads // num_kv_heads
    block_m, _ = beam_tile(1, group)
    if num_splits > 1:
        part_out = torch.empty(rows, num_heads, num_splits, head_dim, dtype=torch.float32,
                               device=q.device)
        part_lse = torch.empty(rows, num_heads, num_splits, dtype=torch.float32,
                               device=q.device)
    else:
        part_out = part_lse = out  # unused: one split writes the output itself
    # int32 even when unused: the merge branch is compiled regardless (atomics take no bf16)
    counters = _split_counters(q.device, rows * num_kv_heads)
    _beam_cross_kernel[(rows, num_kv_heads * m_tiles, num_splits)](
        q, k_buf, v_buf, out, part_out, part_lse, counters, req_to_cross, req_rows,
        group_lens, kv_starts if kv_starts is not None else kv_ends, kv_ends, scaling,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0),
        v_buf.stride(1), out.stride(0), req_to_cross.stride(0),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, GROUP=group, HEAD_DIM=head_dim,
        NUM_SPLITS=num_splits, M_TILES=m_tiles, MIN_KEYS=MIN_SPLIT_KEYS, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_D=block_d(head_dim), DOT_PRECISION=dot_precision(q.dtype),
        HAS_KV_START=kv_starts is not None, PDL=pdl_enabled(),
        SOFTCAP=softcap_constexpr(softcap), num_warps=num_warps, **pdl_launch(),
    )
    return out


def per_row(group_rows: torch.Tensor, group_starts: torch.Tensor,
            rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(req_rows, group_lens) of `beam_cross_attention_rows` from a group-wise description:
    group g's rows are group_starts[g]:group_starts[g + 1], its table row group_rows[g]."""
    firsts = group_starts[:-1].long()
    req_rows = torch.zeros(rows, dtype=torch.int32, device=group_rows.device)
    group_lens = torch.zeros(rows, dtype=torch.int32, device=group_rows.device)
    req_rows[firsts] = group_rows.to(torch.int32)
    group_lens[firsts] = (group_starts[1:] - group_starts[:-1]).to(torch.int32)
    return req_rows, group_lens


def beam_cross_attention_decode(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                                req_to_cross: torch.Tensor, group_rows: torch.Tensor,
                                group_starts: torch.Tensor, kv_ends: torch.Tensor,
                                scaling: float, kv_starts: torch.Tensor | None = None,
                                num_splits: int = 1, max_beams: int | None = None, *,
                                block_n: int = BLOCK_N, num_warps: int = 4,
                                softcap: float | None = None) -> torch.Tensor:
    """`beam_cross_attention_rows` for groups described group-wise: q's rows of group g are
    q[group_starts[g]:group_starts[g + 1]] (group_starts: [G + 1], group_starts[G] == rows),
    its keys at slots req_to_cross[group_rows[g], :]. max_beams: the largest group, read from
    group_starts when not given (a device sync: pass it from the host lengths)."""
    assert group_starts.shape[0] == group_rows.shape[0] + 1, \
        "group_starts needs one entry past the last"
    rows, num_heads, _ = q.shape
    if group_rows.shape[0] == 0 or rows == 0:
        return torch.empty(rows, num_heads * q.shape[2], dtype=q.dtype, device=q.device)
    if max_beams is None:
        max_beams = int((group_starts[1:] - group_starts[:-1]).max())
    req_rows, group_lens = per_row(group_rows, group_starts, rows)
    _, m_tiles = beam_tile(max_beams, num_heads // k_buf.shape[1])
    return beam_cross_attention_rows(q, k_buf, v_buf, req_to_cross, req_rows, group_lens,
                                     kv_ends, scaling, kv_starts, num_splits, m_tiles,
                                     block_n=block_n, num_warps=num_warps, softcap=softcap)
