"""`ReqToTokenPool.write_rows` writes what `write` would, row by row, in one indexed write;
with tensor parallelism it is one record that replays the same."""

import torch

from seq2serve.runtime.memory.device_log import DeviceLog, replay
from seq2serve.runtime.memory.req_to_token_pool import ReqToTokenPool


def _values(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 10_000, (n,), generator=torch.Generator().manual_seed(seed),
                         dtype=torch.int32)


def test_write_rows_equals_writes_one_by_one():
    a, b = ReqToTokenPool(8, 32, 24, "cpu"), ReqToTokenPool(8, 32, 24, "cpu")
    for t in (a.req_to_token, b.req_to_token, a.req_to_cross, b.req_to_cross):
        t.fill_(-1)
    rows, values = [5, 0, 7, 2], [_values(n, i) for i, n in enumerate((24, 1, 17, 3))]
    for row, v in zip(rows, values):
        a.write("req_to_cross", row, v)
    b.write_rows("req_to_cross", rows, values)
    assert torch.equal(a.req_to_cross, b.req_to_cross)
    assert torch.equal(b.req_to_token, torch.full_like(b.req_to_token, -1))  # (other table)
    b.write_rows("req_to_token", [], [])  # nothing to write: no error, nothing written
    assert torch.equal(b.req_to_token, torch.full_like(b.req_to_token, -1))


def test_write_rows_is_one_record_replayed_alike():
    rank0, rank1 = ReqToTokenPool(4, 16, 16, "cpu"), ReqToTokenPool(4, 16, 16, "cpu")
    rank0.log = DeviceLog()
    rank0.write_rows("req_to_token", [3, 1], [_values(16, 1), _values(5, 2)])
    records = rank0.log.take()
    assert [r[1] for r in records] == ["write_rows"]
    replay(records, {"req_to_token": rank1})
    assert torch.equal(rank0.req_to_token, rank1.req_to_token)


def test_copy_rows_and_scatter_as_indexed_writes_of_host_lists():
    """`copy_rows` (the gather before the scatter: rows may swap) and `scatter` write what
    the plain indexing they replaced wrote (their indices now go up in one upload)."""
    pool = ReqToTokenPool(6, 8, 4, "cpu")
    pool.req_to_token.copy_(torch.arange(7 * 8, dtype=torch.int32).view(7, 8))
    want = pool.req_to_token.clone()
    want[[1, 0, 4]] = want[[0, 1, 2]].clone()
    pool.copy_rows("req_to_token", [0, 1, 2], [1, 0, 4])
    assert torch.equal(pool.req_to_token, want)
    want[[3, 3, 5], [0, 7, 2]] = torch.tensor([9, 8, 7], dtype=torch.int32)
    pool.scatter([3, 3, 5], [0, 7, 2], [9, 8, 7])
    assert torch.equal(pool.req_to_token, want)
    pool.scatter([], [], [])  # (no fixes: nothing written)
    assert torch.equal(pool.req_to_token, want)
