"""The encoder cache's idle sets (what eviction may take, kept without walking every entry)
against a reference recomputed from every entry, over random acquire / release / keep_hidden /
flush sequences: with and without a host tier, under shared isolation, with a tight pool and a
tight hidden budget. And eviction takes only unreferenced entries, least recently released
first, never one a request holds."""

from __future__ import annotations

import random

import pytest
import torch

from seq2serve.cross_attention.cross_kv_pool import CrossKVPool
from seq2serve.encoders.encoder_cache import EncoderCache, EncodeWork
from seq2serve.runtime.memory.cache_sharing import SharingRule
from seq2serve.runtime.memory.host_kv_pool import HostKVPool


def _reference(cache: EncoderCache) -> tuple[set, set]:
    idle = [e for e in cache.entries.values() if e.refs == 0 and not e.detached]
    return ({e for e in idle if e.handle is not None}, {e for e in idle if e.hidden is not None})


def _check(cache: EncoderCache, held: list) -> None:
    hot, hidden = _reference(cache)
    assert set(cache.idle_hot) == hot and set(cache.idle_hidden) == hidden
    assert cache.idle_hot_pages == sum(len(e.handle.pages) for e in hot)
    for e in held:  # nothing a request holds lost its K/V
        assert e.refs > 0 and e.handle is not None
    owned = cache.owned_pages()
    assert len(owned) == len(set(owned))
    assert len(owned) + cache.pool.allocator.num_free == cache.pool.allocator.num_pages
    assert cache.hidden_bytes <= cache.hidden_budget_bytes
    assert cache.hidden_bytes == sum(e.hidden.numel() * e.hidden.element_size()
                                     for e in cache.all_entries() if e.hidden is not None)


@pytest.mark.parametrize("host", [False, True])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_idle_sets_follow_every_entry(host, shared, seed):
    rng = random.Random(seed)
    pool = CrossKVPool(12, 4, 1, 1, 2, torch.float32, "cpu")
    sharing = SharingRule(2, 60.0, clock=lambda: 0.0) if shared else None
    cache = EncoderCache(pool, True, hidden_budget_bytes=5 * 4 * 8, sharing=sharing,
                         host=HostKVPool(pool, 6) if host else None)
    held, counts = [], [0, 0, 0]
    for _ in range(400):
        op = rng.random()
        if op < 0.45 and len(held) < 4:
            n = rng.randrange(16)  # an input's length is its own
            got = cache.acquire(("", f"input-{n}"), [3, 4, 8, 9][n % 4],
                                user=f"u{rng.randrange(3)}")
            if got is not None:
                entry, work = got
                entry.handle.ready = True
                if work is EncodeWork.ENCODE:
                    cache.keep_hidden(entry, torch.zeros(entry.length, 8))
                held.append(entry)
        elif op < 0.9 and held:
            cache.release(held.pop(rng.randrange(len(held))))
        elif op < 0.93:
            cache.flush()
        _check(cache, held)
        counts = [max(counts[0], cache.evictions), max(counts[1], cache.host_hits),
                  max(counts[2], cache.hits)]
    assert counts[0] > 10 and counts[2] > 20 and (counts[1] >= 2 or not host)
    for e in held:
        cache.release(e)
    cache.flush()
    _check(cache, [])
    assert not cache.idle_hot and not cache.idle_hidden


def test_eviction_takes_the_least_recently_released_unreferenced_entry():
    pool = CrossKVPool(4, 4, 1, 1, 2, torch.float32, "cpu")  # room for 4 one-page entries
    cache = EncoderCache(pool, True, hidden_budget_bytes=0)
    a, b, c, d = (cache.acquire(("", k), 4)[0] for k in "abcd")
    for e in (a, b, c, d):
        e.handle.ready = True
    cache.release(c)
    cache.release(a)  # idle: c, then a
    e, work = cache.acquire(("", "e"), 4)
    assert work is EncodeWork.ENCODE and c.handle is None and a.handle is not None
    assert ("", "c") not in cache.entries  # nothing left of it: forgotten
    assert b.handle is not None and d.handle is not None  # held: never taken
    assert cache.acquire(("", "f"), 8) is None  # a alone cannot make two pages
    assert a.handle is not None  # nothing evicted for a request that cannot be placed
