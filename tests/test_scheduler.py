"""Continuous batching, memory pressure and pool integrity, driven step by step."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.tests.helpers import SOURCES, hf_greedy, make_scheduler, request, run_to_completion

MAX_NEW = 12


@pytest.fixture(scope="module")
def sources(t5_dir):
    tok = load_tokenizer(t5_dir)
    return [tok(s).input_ids for s in SOURCES]


@pytest.mark.parametrize("overlap", [True, False])
def test_requests_join_a_running_batch(t5_dir, sources, overlap):
    sched = make_scheduler(t5_dir, disable_overlap_schedule=not overlap)
    arrivals = {0: [0, 1], 3: [2], 7: [3], 8: [4]}  # step -> sources arriving before it

    def arrive(step: int) -> bool:
        for i in arrivals.get(step, []):
            sched.add_request(request(str(i), sources[i], max_new_tokens=MAX_NEW,
                                      ignore_eos=True))
        return step < max(arrivals)

    modes = []  # each forward's mode, in order
    launch = sched.worker.launch
    sched.worker.launch = lambda wb: modes.append(wb.forward_mode.value) or launch(wb)
    out = run_to_completion(sched, on_step=arrive)
    # later arrivals (a start token each) joined the decode steps of earlier requests as new
    # rows, without a prefill forward of their own (tests/test_decode_join.py counts them)
    assert "extend" not in modes
    assert sched.max_batch["decode"] >= 3
    for rid, ids in out.items():
        alone = make_scheduler(t5_dir)
        alone.add_request(request(rid, sources[int(rid)], max_new_tokens=MAX_NEW,
                                  ignore_eos=True))
        assert run_to_completion(alone)[rid] == ids
        assert ids == hf_greedy(t5_dir, sources[int(rid)], MAX_NEW)


def test_finished_requests_leave_and_free_memory(t5_dir, sources):
    sched = make_scheduler(t5_dir, disable_encoder_cache=True, disable_radix_cache=True)
    sched.add_request(request("short", sources[0], max_new_tokens=2, ignore_eos=True))
    sched.add_request(request("long", sources[1], max_new_tokens=10, ignore_eos=True))
    used = []
    while sched.has_work:
        sched.step()
        sched.check_integrity()
        used.append((len(sched.running), sched.memory.usage()["cross_used_tokens"]))
    # once "short" finished, only "long" was running and its cross K/V alone stayed allocated
    assert (1, sched.memory.cross_kv.pages_for(len(sources[1])) * 16) in used
    assert sched.memory.usage()["kv_used_tokens"] == 0
    assert sched.memory.usage()["cross_used_tokens"] == 0


def test_finished_requests_stay_cached_until_flushed(t5_dir, sources):
    sched = make_scheduler(t5_dir, page_size=4)
    sched.add_request(request("a", sources[0], max_new_tokens=9, ignore_eos=True))
    run_to_completion(sched)
    usage = sched.memory.usage()
    assert usage["cross_used_tokens"] > 0  # its encoder output, for the next request
    assert usage["kv_used_tokens"] == 8  # its two whole pages of decoder K/V
    sched.check_integrity()
    sched.flush_cache()
    assert sched.memory.usage()["cross_used_tokens"] == 0
    assert sched.memory.usage()["kv_used_tokens"] == 0
    sched.check_integrity()


@pytest.mark.parametrize("overlap", [True, False])
def test_kv_pool_overflow_retracts_and_resumes(t5_dir, sources, overlap):
    # 8 requests of up to 21 decoder tokens each need far more than 48 pool tokens
    sched = make_scheduler(t5_dir, max_total_tokens=48, page_size=4,
                           disable_overlap_schedule=not overlap)
    for i, ids in enumerate(sources):
        sched.add_request(request(str(i), ids, max_new_tokens=20, ignore_eos=True))
    out = run_to_completion(sched)
    assert sched.num_retractions > 0
    assert sorted(out) == [str(i) for i in range(len(sources))]
    for i, ids in enumerate(sources):
        assert out[str(i)] == hf_greedy(t5_dir, ids, 20), f"request {i}"
    sched.check_integrity()
    sched.flush_cache()
    assert sched.memory.usage()["kv_used_tokens"] == 0


def test_small_cross_pool_makes_requests_wait(t5_dir, sources):
    longest = max(map(len, sources))
    sched = make_scheduler(t5_dir, max_cross_tokens=longest + 16, page_size=16)
    for i, ids in enumerate(sources):
        sched.add_request(request(str(i), ids, max_new_tokens=6, ignore_eos=True))
    out = run_to_completion(sched)
    assert len(out) == len(sources)
    # never more requests at once than the cross pool could hold
    assert sched.max_batch["decode"] < len(sources)
    for i, ids in enumerate(sources):
        assert out[str(i)] == hf_greedy(t5_dir, ids, 6)


def test_too_long_requests_are_refused_without_side_effects(t5_dir, sources):
    sched = make_scheduler(t5_dir, max_total_tokens=64, max_encoder_len=32)
    sched.add_request(request("ok", sources[0], max_new_tokens=4))
    with pytest.raises(ValueError, match="max_encoder_len"):
        sched.add_request(request("long-src", list(range(5, 45)), max_new_tokens=4))
    with pytest.raises(ValueError, match="KV pool"):
        sched.add_request(request("long-out", sources[0], max_new_tokens=100))
    with pytest.raises(ValueError, match="outside"):
        sched.add_request(request("bad-id", [5, 10**6], max_new_tokens=4))
    with pytest.raises(ValueError, match="empty"):
        sched.add_request(request("empty", [], max_new_tokens=4))
    out = run_to_completion(sched)
    assert list(out) == ["ok"] and out["ok"] == hf_greedy(t5_dir, sources[0], 4)
    sched.check_integrity()


@pytest.mark.parametrize("overlap", [True, False])
def test_abort_frees_memory(t5_dir, sources, overlap):
    sched = make_scheduler(t5_dir, disable_overlap_schedule=not overlap)
    for i in range(3):
        sched.add_request(request(str(i), sources[i], max_new_tokens=30, ignore_eos=True))
    sched.step()
    sched.step()
    aborted = sched.abort_request("1")
    assert aborted.finished_reason["type"] == "abort"
    sched.check_integrity()
    out = run_to_completion(sched)
    assert set(out) == {"0", "2"}
    assert sched.abort_request("1") is None


def test_no_per_step_structure_grows(t5_dir):
    """A long-running server's scheduler keeps counters, not a log per forward: after many
    decode steps its bookkeeping is the size it was after a few."""
    sched = make_scheduler(t5_dir)

    def sizes() -> dict[str, int]:
        return {name: len(v) for name, v in vars(sched).items()
                if hasattr(v, "__len__") and not isinstance(v, (str, bytes, torch.Tensor))}

    def wave(n: int) -> None:
        for i in range(n):
            sched.add_request(request(f"w{i}", [5, 6, 7], max_new_tokens=30, ignore_eos=True))
        run_to_completion(sched)

    wave(2)
    before = sizes()
    for _ in range(5):
        wave(2)
    grown = {k: (before[k], n) for k, n in sizes().items() if n > before.get(k, 0)}
    assert not grown, grown
    assert sched.stats()["forwards"] > 150


def test_admission_is_fair_across_callers(t5_dir):
    """A call of 40 prompts queued first does not hold back a one-prompt call made after it:
    the latter is admitted with the former's second prompt, not its forty-first."""
    sched = make_scheduler(t5_dir, max_running_requests=2)
    for i in range(40):
        tr = request(f"big{i}", [5, 6, 7, 8], max_new_tokens=4, ignore_eos=True)
        tr.group = "big"
        sched.add_request(tr)
    sched.add_request(request("small", [9, 10], max_new_tokens=4, ignore_eos=True))
    finished = []
    while sched.has_work:
        for o in sched.step():
            if o.finished_reason is not None:
                finished.append(o.rid)
    assert finished.index("small") < 4, finished[:8]
    # the big call's own prompts keep their order
    big = [r for r in finished if r.startswith("big")]
    assert big == sorted(big, key=lambda r: int(r[3:]))
    assert not sched.waiting.group_tags  # nothing waits: no history kept


def test_radix_keeps_no_root_per_source_it_ever_saw(t5_dir):
    """Each distinct source is a radix namespace: once its prefixes are evicted or flushed and
    no request holds it, its root goes too (a soak of distinct sources grew otherwise)."""
    sched = make_scheduler(t5_dir)
    for i in range(30):
        sched.add_request(request(str(i), [5, 6, 7, 100 + i], max_new_tokens=3,
                                  ignore_eos=True))
    run_to_completion(sched)
    radix = sched.memory.radix
    assert len(radix.roots) <= 30
    sched.flush_cache()
    assert not radix.roots
    sched.add_request(request("again", [5, 6, 7, 100], max_new_tokens=3, ignore_eos=True))
    run_to_completion(sched)
    sched.check_integrity()


def test_cpu_kv_pools_are_resident_from_the_start():
    """The pools are written at creation, so a CPU server holds their memory from the start
    instead of seeming to grow for hours as its caches fill untouched pages (the 20,000-request
    soak: 620 -> 1,938 MB before, flat after). Measured in a fresh process: in a long one, the
    allocator may hand out memory that is already resident."""
    import subprocess
    import sys

    code = """
import psutil, torch
from seq2serve.runtime.memory.token_to_kv_pool import PagedKVBuffers
before = psutil.Process().memory_info().rss
pool = PagedKVBuffers(num_pages=4096, page_size=16, num_layers=2, num_kv_heads=4,
                      head_dim=64, dtype=torch.float32, device="cpu")
size = sum(t.numel() * t.element_size() for t in pool.k_buffers + pool.v_buffers)
print(size, psutil.Process().memory_info().rss - before)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    size, grown = map(int, out.split())
    assert size > 100 << 20
    assert grown > 0.9 * size, (size, grown)


def test_request_ids_are_found_while_held_and_free_again_after(t5_dir, sources):
    """`find` (the duplicate check, aborts) from the rid index: a queued, a running and a
    beam request's other result rid are found; a finished or aborted one is not, and its rid
    may be used again; the index does not grow with the rids a server has seen."""
    sched = make_scheduler(t5_dir)
    sched.add_request(request("a", sources[0], max_new_tokens=6, ignore_eos=True))
    beam = request("b", sources[1], max_new_tokens=6, ignore_eos=True, num_beams=2,
                   num_return_sequences=2)
    beam.beam_rids = ["b", "b#1"]
    sched.add_request(beam)
    for rid in ("a", "b", "b#1"):  # queued
        with pytest.raises(ValueError, match="already in use"):
            sched.add_request(request(rid, sources[2], max_new_tokens=2))
    sched.step()
    assert sched.find("a").rid == "a" and sched.find("b#1") is sched.find("b")  # running
    assert sched.abort_request("b#1").finished_reason["type"] == "abort"
    assert sched.find("b") is None and sched.find("b#1") is None
    run_to_completion(sched)
    assert sched.find("a") is None
    sched.add_request(request("a", sources[0], max_new_tokens=2))  # its rid is free again
    run_to_completion(sched)
    for i in range(2600):  # rids seen and gone: the index is pruned to the live ones
        sched.add_request(request(f"gone{i}", sources[0], max_new_tokens=1))
        if i % 100 == 99:
            run_to_completion(sched)
    assert len(sched.by_rid) < 1600 and sched.find("gone2599") is None
    sched.check_integrity()


class _NoRemove(list):
    """A running batch that fails if a request is taken out of it one at a time (a walk of
    the batch per finished request: quadratic when a whole wave ends in one step)."""

    def remove(self, item):
        raise AssertionError("running.remove: a walk of the batch per finished request")


@pytest.mark.parametrize("overlap", [True, False])
def test_a_wave_that_ends_together_leaves_the_running_batch_in_one_pass(t5_dir, sources,
                                                                         overlap):
    """Greedy requests and beam groups that all finish in one step leave `running` together,
    with the results they would have one by one."""
    sched = make_scheduler(t5_dir, disable_overlap_schedule=not overlap)
    alone = {}
    for i in range(12):
        kw = {"num_beams": 2} if i % 3 == 0 else {}
        sched.add_request(request(f"r{i}", sources[i % len(sources)], max_new_tokens=5,
                                  ignore_eos=True, **kw))
        one = make_scheduler(t5_dir)
        one.add_request(request(f"r{i}", sources[i % len(sources)], max_new_tokens=5,
                                ignore_eos=True, **kw))
        alone.update(run_to_completion(one))
    got, guarded = {}, 0
    while sched.has_work:
        if sched.running and not isinstance(sched.running, _NoRemove):
            sched.running, guarded = _NoRemove(sched.running), guarded + 1
        for o in sched.step():
            got[o.rid] = o.new_token_ids
        sched.check_integrity()
    assert guarded and not sched.running
    assert got == alone


@pytest.mark.parametrize("overlap", [True, False])
def test_an_idle_scheduler_holds_no_finished_request(t5_dir, sources, overlap):
    """What the per-step memos keep (a batch's rows, its beam groups, their columns) is let
    go when nothing runs: finished greedy and beam requests are not held by the scheduler."""
    sched = make_scheduler(t5_dir, disable_overlap_schedule=not overlap)
    held = []
    for i, kw in enumerate(({}, {"num_beams": 3}, {"num_beams": 2})):
        sched.add_request(request(f"r{i}", sources[i], max_new_tokens=6, ignore_eos=True, **kw))
    sched.step()  # (admitted: the requests are the scheduler's now)
    held = [weakref.ref(r) for r in list(sched.running) + list(sched.waiting)]
    assert len(held) == 3
    run_to_completion(sched)
    sched.step()  # (idle)
    gc.collect()
    alive = [w() for w in held if w() is not None]
    assert not alive, [r.rid for r in alive]
