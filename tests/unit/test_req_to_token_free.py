"""The request-slot pool's free list (runtime/memory/req_to_token_pool.py): slots handed out
once, a double free refused, `check` passing after random operations, and a free that does
not walk the free list (a wave of 512 beam groups frees 2,048 rows at its end)."""

from __future__ import annotations

import random

import pytest

from seq2serve.runtime.memory.req_to_token_pool import ReqToTokenPool


def test_slots_are_handed_out_once_and_a_double_free_is_refused():
    pool = ReqToTokenPool(64, 4, 4, "cpu")
    rng, owned = random.Random(0), []
    for _ in range(2000):
        if owned and (rng.random() < 0.5 or pool.num_free == 0):
            pool.free(owned.pop(rng.randrange(len(owned))))
        else:
            idx = pool.alloc()
            assert idx is not None and idx not in owned
            owned.append(idx)
        assert pool.num_free + len(owned) == 64
    pool.check(owned)
    assert all(pool.alloc() is not None for _ in range(pool.num_free))
    assert pool.alloc() is None
    pool.free(owned[0])
    with pytest.raises(AssertionError, match="freed twice"):
        pool.free(owned[0])


class _NoWalk(list):
    """A free list that fails if anything walks it (membership tests, iteration)."""

    def __contains__(self, item):
        raise AssertionError("the free list was walked")

    def __iter__(self):
        raise AssertionError("the free list was walked")


def test_freeing_a_wave_of_rows_does_not_walk_the_free_list():
    pool = ReqToTokenPool(512, 2, 2, "cpu")
    rows = [pool.alloc() for _ in range(512)]
    pool._free = _NoWalk(pool._free)  # (a walk per free: ~n^2 / 2 comparisons a wave)
    for r in rows:
        pool.free(r)
    taken = pool.alloc()
    assert taken is not None and pool.num_free == 511
    pool._free = list.copy(pool._free)  # (a plain list again, for the check's walk)
    pool.check([taken])
