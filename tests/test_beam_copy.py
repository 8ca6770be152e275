"""The beam step's partial-page copy kernel (`kernels/triton_beam_copy.py`) against the torch
path of `move_pages` (`buf[:, dst] = buf[:, src]`, gather then scatter, and the table rows'
rewrite): on a real pool with shuffled pages, groups of 1, 2, 4 and 5 beams, parents that swap,
cycle, keep themselves or share one row, last pages empty, partly and all but one slot filled.
Without a GPU in Triton's interpreter (see conftest.py), so sizes stay small."""

from __future__ import annotations

import itertools
import os

import pytest
import torch

from seq2serve.runtime.executor.beam_step import BeamMoves, move_pages
from seq2serve.runtime.kernels.triton_beam_copy import beam_copy
from seq2serve.runtime.memory.token_to_kv_pool import PagedKVBuffers

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
# on a GPU, part of the GPU gate (scripts/gpu_check.py runs `-m gpu`); on the CPU, of CI
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []
PS = 4  # page size
CTX = 32  # positions of a table row
_seeds = itertools.count(7000)

# per group: its rows' length (positions written after the step) and parents (group-local)
GROUPS = [
    (9, [0]),  # one row: its own parent
    (7, [1, 1]),  # both continue row 1 (ps - 1 positions in the last page)
    (13, [1, 0, 0, 3]),  # rows 0 and 1 swap; row 2 takes row 0, which itself moves
    (10, [1, 2, 0, 3, 3]),  # a cycle 0 <- 1 <- 2 <- 0; row 3 keeps itself, row 4 takes it
    (12, [3, 3, 0, 1]),  # parents change, but the last page is empty (copy_len 0)
]


def _setup(groups, dtype, heads=2, dim=8, layers=3, seed=0):
    """A pool of random K/V and a table whose rows hold distinct shuffled pages; the moves and
    parents (batch rows) of `groups`."""
    gen = torch.Generator().manual_seed(seed)
    rows_total = sum(len(p) for _, p in groups)
    pages_per_row = CTX // PS
    pool = PagedKVBuffers(rows_total * pages_per_row + 4, PS, layers, heads, dim, dtype, "cpu")
    for buf in (pool._k, pool._v):
        buf.copy_(torch.randn(buf.shape, generator=gen).to(dtype))
    table = torch.zeros(rows_total + 3, CTX, dtype=torch.int32)
    table_rows = torch.randperm(rows_total + 3, generator=gen)[:rows_total]
    pages = 1 + torch.randperm(rows_total * pages_per_row, generator=gen)
    pos = torch.arange(CTX)
    for i, row in enumerate(table_rows.tolist()):
        own = pages[i * pages_per_row:(i + 1) * pages_per_row]
        table[row] = (own[pos // PS] * PS + pos % PS).int()
    parents, shared_end, copy_len, starts = [], [], [], [0]
    for length, local in groups:
        parents += [starts[-1] + p for p in local]
        shared_end += [length - length % PS] * len(local)
        copy_len += [length % PS] * len(local)
        starts.append(starts[-1] + len(local))
    long = dict(dtype=torch.int64)
    moves = BeamMoves(table_rows, torch.tensor(shared_end, **long), torch.tensor(copy_len, **long),
                      max(1, max(copy_len)), torch.tensor(starts, **long),
                      max(len(p) for _, p in groups))
    return pool, table, moves, torch.tensor(parents, **long)


def _to(pool, table, moves, parents, device):
    if device == "cpu":
        return pool, table, moves, parents
    pool._k, pool._v = pool._k.to(device), pool._v.to(device)
    fields = {k: (v.to(device) if isinstance(v, torch.Tensor) else v)
              for k, v in vars(moves).items()}
    return pool, table.to(device), BeamMoves(**fields), parents.to(device)


def _check(groups, dtype, seed, **shape):
    pool, table, moves, parents = _setup(groups, dtype, seed=seed, **shape)
    k0, v0 = pool._k.clone(), pool._v.clone()
    want_table = table.clone()
    move_pages(want_table, pool, moves, parents, kernel=False)  # the torch path: the oracle
    want_k, want_v = pool._k.clone(), pool._v.clone()
    pool._k.copy_(k0)
    pool._v.copy_(v0)
    pool, table, moves, parents = _to(pool, table, moves, parents, DEVICE)
    move_pages(table, pool, moves, parents, kernel=True)
    assert torch.equal(table.cpu(), want_table)
    assert torch.equal(pool._k.cpu(), want_k) and torch.equal(pool._v.cpu(), want_v)
    return not torch.equal(want_k, k0)  # whether the step moved any K/V at all


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_kernel_matches_torch_path(dtype):
    assert _check(GROUPS, dtype, seed=next(_seeds))


def test_hazards_one_at_a_time():
    """Each group alone (one program): a swap and a cycle read their sources before writing."""
    moved = [_check([g], torch.float32, seed=next(_seeds)) for g in GROUPS]
    assert moved == [False, True, True, True, False]


@pytest.mark.parametrize("seed", range(3))
def test_random_parents(seed):
    """Random parents (any row of the group) and lengths, at an odd width (3 heads x 10)."""
    gen = torch.Generator().manual_seed(100 + seed)
    groups = []
    for beams in (1, 2, 4, 5, 3, 8):
        length = int(torch.randint(1, CTX, (1,), generator=gen))
        groups.append((length, torch.randint(0, beams, (beams,), generator=gen).tolist()))
    _check(groups, torch.bfloat16, seed=next(_seeds), heads=3, dim=10)


def test_chunks_of_the_row():
    """KVH*D in several chunks, the last one partly masked (30 elements, chunks of 8)."""
    pool, table, moves, parents = _setup(GROUPS, torch.float32, heads=3, dim=10,
                                         seed=next(_seeds))
    want_k, want_v = pool._k.clone(), pool._v.clone()
    move_pages(table.clone(), _Buffers(want_k, want_v), moves, parents, kernel=False)
    pool, table, moves, parents = _to(pool, table, moves, parents, DEVICE)
    beam_copy(pool._k, pool._v, table, moves.table_rows, parents, moves.shared_end,
              moves.copy_len, moves.starts, moves.max_beams, block_e=8)
    assert torch.equal(pool._k.cpu(), want_k) and torch.equal(pool._v.cpu(), want_v)


class _Buffers:
    """The torch path's view of a pool: stacked K and V only."""

    def __init__(self, k, v):
        self._k, self._v = k, v

    copy_slots_local = PagedKVBuffers.copy_slots_local
