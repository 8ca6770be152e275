"""The beam-group decode cross-attention kernel against a float32 torch reference (each row's
keys gathered from the pool through its group's req_to_cross row, softmax per row) and against
today's path, `paged_decode_attention` over the beam rows, each with its own copy of the
group's req_to_cross row. On real pools (shuffled pages of a CrossKVPool); without a GPU in
Triton's interpreter (see conftest.py), so sizes stay small."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import pytest
import torch

from seq2serve.cross_attention.cross_kv_pool import CrossKVPool
from seq2serve.cross_attention.triton_beam_cross_attention import (
    beam_cross_attention_decode,
    beam_cross_attention_rows,
    beam_tile,
    per_row,
)
from seq2serve.runtime.kernels.triton_decode import _split_counters, paged_decode_attention
from seq2serve.runtime.memory.req_to_token_pool import ReqToTokenPool

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
# on a GPU, part of the GPU gate (scripts/gpu_check.py runs `-m gpu`); on the CPU, of CI
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []
_F32 = dict(atol=1e-5, rtol=1e-5)
_BF16 = dict(atol=2e-2, rtol=2e-2)  # against float32 math on the same bf16 inputs
_seeds = itertools.count(4000)


@pytest.fixture
def poisoned_empty(monkeypatch):
    """Floating-point torch.empty comes back NaN-filled: an output element (or a split-KV
    partial) the kernel forgets to write shows up."""
    empty = torch.empty

    def nan_empty(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", nan_empty)


@pytest.fixture
def bf16_dots(monkeypatch):
    """Triton's interpreter keeps bf16 as its uint16 bit patterns and its `tl.dot` multiplies
    those (triton-lang/triton#11584, "not supported yet"): under it, bf16 dot operands are
    converted to float32 first -- the GPU's math, bf16 products accumulated in float32. The
    kernel's bf16 loads, casts and stores run as they are."""
    if DEVICE != "cpu":
        return
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder

    dot = InterpreterBuilder.create_dot

    def float32_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a, b = (self.cast_impl(x, tl.float32) if x.dtype.scalar == tl.bfloat16 else x
                for x in (a, b))
        return dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(InterpreterBuilder, "create_dot", float32_dot)


@dataclass
class _Groups:
    """Beam groups as the scheduler lays them out: every beam row has its own req_to_cross row
    holding the same slots as its group's first row."""

    q: torch.Tensor  # [rows, H, D]
    k_buf: torch.Tensor
    v_buf: torch.Tensor
    table: torch.Tensor  # req_to_cross
    group_rows: torch.Tensor  # [G] the table row each group's kernel programs read
    group_starts: torch.Tensor  # [G + 1]
    beam_rows: torch.Tensor  # [rows] each row's own table row (today's path reads these)
    kv_starts: torch.Tensor | None  # [rows]
    kv_ends: torch.Tensor  # [rows]


def _randn(gen, *shape, dtype):
    return torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)


def _groups(beams: list[int], encoder_lens: list[int], heads: tuple[int, int, int],
            dtype=torch.float32, windows: str | None = None, page_size: int = 16) -> _Groups:
    """windows: None (every row reads its group's keys), "group" (one random range per group,
    as Mllama's beams would share one) or "row" (each row its own); some ranges empty."""
    gen = torch.Generator().manual_seed(next(_seeds))
    num_heads, num_kv_heads, head_dim = heads
    num_rows = sum(beams)
    num_pages = sum(-(-n // page_size) for n in encoder_lens) + 3
    pool = CrossKVPool(num_pages, page_size, 1, num_kv_heads, head_dim, dtype, DEVICE)
    for buf in pool.k_buffers + pool.v_buffers:
        buf.copy_(_randn(gen, *buf.shape, dtype=dtype))
    req = ReqToTokenPool(num_rows + 4, 8, max(encoder_lens) + 5, DEVICE)
    table = req.req_to_cross
    num_slots = pool.k_buffers[0].shape[0]
    table.copy_(torch.randint(0, num_slots, table.shape, generator=gen))  # garbage, but real
    free_rows = torch.randperm(req.size, generator=gen)[:num_rows].tolist()
    pages = (torch.randperm(pool.allocator.num_pages, generator=gen) + 1).tolist()
    group_rows, beam_rows, ends, starts = [], [], [], []
    for b, n in zip(beams, encoder_lens):
        mine, pages = pages[:pool.pages_for(n)], pages[pool.pages_for(n):]
        rows, free_rows = free_rows[:b], free_rows[b:]
        for row in rows:  # the beams' rows: copies of the first (RequestMemory's layout)
            table[row, :n] = pool.slots(mine, 0, n).to(DEVICE)
        group_rows.append(rows[0])
        beam_rows += rows
        if windows is None:
            starts += [0] * b
            ends += [n] * b
            continue
        for j in range(b if windows == "row" else 1):
            s = int(torch.randint(0, n + 1, (1,), generator=gen))
            e = int(torch.randint(s, n + 1, (1,), generator=gen))
            if torch.rand(1, generator=gen) < 0.2:
                e = s  # sees nothing
            starts += [s] * (1 if windows == "row" else b)
            ends += [e] * (1 if windows == "row" else b)

    def dev(x):
        return torch.tensor(x, dtype=torch.int32, device=DEVICE)

    return _Groups(
        q=_randn(gen, num_rows, num_heads, head_dim, dtype=dtype), k_buf=pool.k_buffers[0],
        v_buf=pool.v_buffers[0], table=table, group_rows=dev(group_rows),
        group_starts=dev(list(itertools.accumulate(beams, initial=0))),
        beam_rows=dev(beam_rows), kv_starts=None if windows is None else dev(starts),
        kv_ends=dev(ends))


def _reference(c: _Groups, scaling: float, softcap: float | None = None) -> torch.Tensor:
    """float32 softmax attention per row over the keys gathered through its group's row
    (scores soft-capped as Gemma's, with a `softcap`)."""
    rows, num_heads, head_dim = c.q.shape
    group = num_heads // c.k_buf.shape[1]
    out = torch.zeros(rows, num_heads, head_dim, dtype=torch.float32, device=c.q.device)
    starts = c.kv_starts if c.kv_starts is not None else torch.zeros_like(c.kv_ends)
    bounds = c.group_starts.tolist()
    for g, table_row in enumerate(c.group_rows.tolist()):
        for t in range(bounds[g], bounds[g + 1]):
            s, e = int(starts[t]), int(c.kv_ends[t])
            if e <= s:
                continue
            slots = c.table[table_row, s:e].long()
            k = c.k_buf[slots].float().repeat_interleave(group, dim=1)  # [n, H, D]
            v = c.v_buf[slots].float().repeat_interleave(group, dim=1)
            scores = torch.einsum("hd,nhd->hn", c.q[t].float(), k) * scaling
            if softcap is not None:
                scores = torch.tanh(scores / softcap) * softcap
            p = scores.softmax(-1)
            out[t] = torch.einsum("hn,nhd->hd", p, v)
    return out.view(rows, num_heads * head_dim)


def _beam(c: _Groups, scaling: float, splits: int, softcap: float | None = None) -> torch.Tensor:
    return beam_cross_attention_decode(c.q, c.k_buf, c.v_buf, c.table, c.group_rows,
                                       c.group_starts, c.kv_ends, scaling, c.kv_starts, splits,
                                       softcap=softcap)


def _per_row(c: _Groups, scaling: float, splits: int) -> torch.Tensor:
    """Today's path: one program per (row, KV head, split), each row through its own row."""
    return paged_decode_attention(c.q, c.k_buf, c.v_buf, c.table, c.beam_rows, c.kv_ends,
                                  splits, scaling, kv_starts=c.kv_starts)


def _check(out: torch.Tensor, expected: torch.Tensor, **tol) -> None:
    assert not out.isnan().any(), "NaN in the kernel output"
    torch.testing.assert_close(out.float(), expected.float(), **tol)


@pytest.mark.parametrize("beams,encoder_lens,heads,splits,windows", [
    ([1, 2, 4, 5], [1, 63, 130, 200], (4, 4, 64), 1, None),  # MHA, ragged groups
    ([1, 2, 4, 5], [200, 1, 64, 65], (8, 2, 64), 3, "group"),  # GQA 4: 20-row tiles
    ([5, 1, 4, 2], [300, 17, 129, 0], (4, 1, 128), 2, None),  # a group with no keys
    ([2, 3], [90, 250], (2, 2, 80), 4, "row"),  # an odd head size, per-row windows
    ([8, 1, 3], [40, 140, 7], (16, 1, 16), 2, "row"),  # 8 beams x GQA 16: two M tiles
])
def test_float32(poisoned_empty, beams, encoder_lens, heads, splits, windows):
    c = _groups(beams, encoder_lens, heads, windows=windows)
    scaling = heads[2] ** -0.5
    out = _beam(c, scaling, splits)
    _check(out, _reference(c, scaling), **_F32)
    _check(out, _per_row(c, scaling, splits), **_F32)
    if windows is not None:  # rows that see no key read exact zeros
        empty = c.kv_ends <= c.kv_starts
        assert (out[empty] == 0).all()


@pytest.mark.parametrize("splits", [1, 3])
def test_softcap(poisoned_empty, splits):
    """Gemma's soft-capped scores (T5Gemma's cross-attention), a cap low enough to bend them."""
    c = _groups([1, 4, 2], [70, 200, 9], (8, 2, 32), windows="row")
    _check(_beam(c, 0.5, splits, softcap=2.0), _reference(c, 0.5, softcap=2.0), **_F32)


@pytest.mark.parametrize("beams,encoder_lens,heads,splits,windows", [
    ([4, 4, 1], [128, 70, 200], (4, 4, 64), 1, None),  # mT5's head size
    ([2, 5, 3], [150, 1, 260], (8, 2, 128), 3, "group"),  # Llama's head size, GQA
])
def test_bf16(bf16_dots, poisoned_empty, beams, encoder_lens, heads, splits, windows):
    """bf16 pools and queries: float32 math (the reference on the same bf16 values) within
    bf16 rounding; today's kernel to within one bf16 step (both round p to bf16 for P @ V)."""
    c = _groups(beams, encoder_lens, heads, dtype=torch.bfloat16, windows=windows)
    scaling = heads[2] ** -0.5
    out = _beam(c, scaling, splits)
    assert out.dtype == torch.bfloat16 and out.shape == (sum(beams), heads[0] * heads[2])
    _check(out, _reference(c, scaling), **_BF16)
    _check(out, _per_row(c, scaling, splits), atol=8e-3, rtol=8e-3)


@pytest.mark.parametrize("num_splits", [2, 40])  # 40: more splits than key blocks
def test_splits_merge_and_reset_counters(poisoned_empty, num_splits):
    c = _groups([3, 1, 4], [260, 129, 100], (4, 2, 16))
    expected = _reference(c, 1.0)
    for _ in range(2):  # the last split merges and leaves the counters at zero for the next
        _check(_beam(c, 1.0, num_splits), expected, **_F32)
        assert not _split_counters(c.q.device, 1).any()


def test_no_groups():
    c = _groups([2], [10], (2, 2, 16))
    q = c.q[:0]
    out = beam_cross_attention_decode(q, c.k_buf, c.v_buf, c.table, c.group_rows[:0],
                                      c.group_starts[:1], c.kv_ends[:0], 1.0)
    assert out.shape == (0, 32)


def test_tiles():
    """A tile holds one beam's query heads at least, padded to >= 16 rows; a larger group
    takes several tiles."""
    assert beam_tile(1, 1) == (16, 1)  # greedy MHA: one row of a 16-row tile
    assert beam_tile(4, 1) == (16, 1)
    assert beam_tile(5, 4) == (16, 2)
    assert beam_tile(8, 8) == (16, 4)
    assert beam_tile(8, 16) == (16, 8)
    assert beam_tile(2, 128) == (64, 4)


def test_more_tiles_than_the_groups_need(poisoned_empty):
    """A CUDA graph's grid is planned for the largest group it may hold: programs for tiles
    past a group's rows do nothing, and the result is the same."""
    c = _groups([8, 1, 3], [40, 140, 7], (16, 1, 16), windows="row")
    req_rows, group_lens = per_row(c.group_rows, c.group_starts, c.q.shape[0])
    out = beam_cross_attention_rows(c.q, c.k_buf, c.v_buf, c.table, req_rows, group_lens,
                                    c.kv_ends, 0.25, c.kv_starts, 2,
                                    beam_tile(16, 16)[1])
    _check(out, _reference(c, 0.25), **_F32)


def test_rows_inside_a_group_start_nothing(poisoned_empty):
    """Only a group's first row's table row and length are read: the other rows' entries
    (as a decode batch holds them: their own table rows) change nothing."""
    c = _groups([3, 2], [50, 90], (4, 4, 16))
    req_rows, group_lens = per_row(c.group_rows, c.group_starts, c.q.shape[0])
    inside = group_lens == 0
    req_rows[inside] = c.beam_rows[inside]  # their own copies of the group's slots
    out = beam_cross_attention_rows(c.q, c.k_buf, c.v_buf, c.table, req_rows, group_lens,
                                    c.kv_ends, 1.0)
    _check(out, _reference(c, 1.0), **_F32)
