"""RadixCache.evict frees many copies in one walk of the tree (a heap of candidates; a parent
joins it once nothing below reads through it) in the order the old full rescan per copy gave:
least recently used first, a node only after its children."""

from __future__ import annotations

import random

from seq2serve.runtime.memory.page_allocator import PageAllocator
from seq2serve.runtime.scheduler.radix_cache import RadixCache

PS = 4


def _tree(seed: int) -> tuple[RadixCache, PageAllocator]:
    rng = random.Random(seed)
    alloc = PageAllocator(4096)
    rc = RadixCache(alloc, PS, enabled=True)
    for s in range(40):
        ns = (f"src{s % 7}",)  # shared namespaces: branching paths under one root
        stem = [s % 3] * (PS * rng.randrange(1, 4))  # shared first pages: parents and children
        toks = stem + [rng.randrange(100) for _ in range(PS * rng.randrange(1, 5))]
        pages = alloc.alloc(len(toks) // PS)
        for dup in rc.insert(ns, toks, pages):
            alloc.free([dup])
    stamp = iter(range(10_000))
    for n in list(rc._nodes()):
        n.last_used = rng.random() * 100 + next(stamp) * 1e-6  # distinct, shuffled ages
    return rc, alloc


def _survivors(rc: RadixCache) -> set:
    return {(n.tokens, tuple(n.pages)) for n in rc._nodes() if n.copies}


def test_one_call_evicts_what_one_copy_at_a_time_would():
    for seed in range(5):
        for want in (1, 7, 30, 10_000):
            rc, _ = _tree(seed)
            freed = rc.evict(want)
            ref, _ = _tree(seed)
            ref_freed = 0
            while ref_freed < want:
                got = ref.evict(1)  # one copy per call: the old rescan's choice each time
                if not got:
                    break
                ref_freed += got
            assert freed == ref_freed and _survivors(rc) == _survivors(ref), (seed, want)


def test_locked_paths_stay_and_everything_else_can_go():
    rc, alloc = _tree(0)
    held = next(n for n in rc._nodes() if n.parent.parent is not None)  # a child node
    rc.lock(held)
    rc.evict(10_000)
    left = {n for n in rc._nodes() if n.copies}
    chain, n = set(), held
    while n.parent is not None:
        chain.add(n)
        n = n.parent
    assert left == chain
    rc.unlock(held)
    rc.evict(10_000)
    assert not list(rc._nodes()) and alloc.num_free == alloc.num_pages
