"""The collector's pauses are counted per generation, a frozen heap leaves full passes only
what was allocated since, and the scheduler's full passes run when due rather than by the
allocation count, which finished requests do not need (runtime/memory/collector.py)."""

import gc
import weakref

import pytest

from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.memory.collector import IDLE_GAP_S, CollectorPauses, FullPasses, freeze_heap
from seq2serve.tests.helpers import SOURCES, make_scheduler, request, run_to_completion


def test_pauses_counted_per_generation():
    pauses = CollectorPauses()
    try:
        before = pauses.stats()["gc_passes"][2]
        gc.collect(2)
        gc.collect(0)
        st = pauses.stats()
        assert st["gc_passes"][2] == before + 1
        assert st["gc_passes"][0] >= 1
        assert st["gc_pause_max_ms"][2] > 0
        assert st["gc_pause_total_ms"][2] >= st["gc_pause_max_ms"][2]
    finally:
        pauses.close()
    assert pauses._on_gc not in gc.callbacks


def test_freeze_moves_survivors_out_of_full_passes():
    kept = [[i] for i in range(10_000)]  # tracked containers that outlive the freeze
    try:
        freeze_heap()
        frozen = gc.get_freeze_count()
        assert frozen >= len(kept)
        assert not any(gc.is_tracked(x) and x in gc.get_objects(2) for x in kept[:1])
    finally:
        gc.unfreeze()


def test_full_passes_off_the_allocation_count_until_due():
    """`FullPasses`: no full pass by Python's trigger; one when idle (with promotions since
    the last), or when the interval passed under load; thresholds restored on close."""
    now = [0.0]
    saved = gc.get_threshold()
    passes = FullPasses(60.0, clock=lambda: now[0])
    try:
        assert gc.get_threshold()[:2] == saved[:2] and gc.get_threshold()[2] > 10**9
        now[0] = 1.0
        gc.collect(1)  # (a young pass: the oldest generation's count > 0)
        assert not passes.maybe(idle=True)  # within IDLE_GAP_S of the last
        now[0] = IDLE_GAP_S + 1
        assert not passes.maybe(idle=False)  # busy, the interval not passed
        assert passes.maybe(idle=True) and passes.runs == 1
        assert gc.get_count()[2] == 0
        now[0] += 2 * IDLE_GAP_S
        assert not passes.maybe(idle=True)  # idle, but nothing promoted since
        now[0] += 60.0
        assert passes.maybe(idle=False) and passes.stats() == {"gc_scheduled_full_passes": 2}
    finally:
        passes.close()
    assert gc.get_threshold() == saved


def test_interval_zero_leaves_python_trigger():
    saved = gc.get_threshold()
    passes = FullPasses(0.0, clock=lambda: 1e9)
    assert gc.get_threshold() == saved
    gc.collect(1)
    assert not passes.maybe(idle=True) and not passes.maybe(idle=False)
    passes.close()
    assert gc.get_threshold() == saved


@pytest.mark.parametrize("overlap", [True, False])
def test_finished_requests_freed_without_the_collector(t5_dir, overlap):
    """What `FullPasses` relies on: greedy and beam requests leave no reference cycles, so
    reference counts free them when they finish, with no full pass."""
    tok = load_tokenizer(t5_dir)
    sources = [tok(s).input_ids for s in SOURCES]
    sched = make_scheduler(t5_dir, disable_overlap_schedule=not overlap)
    gc.collect()
    gc.disable()
    try:
        for i, kw in enumerate(({"ignore_eos": True}, {"num_beams": 3, "ignore_eos": True},
                                {"num_beams": 2, "min_new_tokens": 2},
                                {"num_beams": 2, "ignore_eos": True})):
            sched.add_request(request(f"r{i}", sources[i], max_new_tokens=6, **kw))
        sched.step()
        held = [weakref.ref(r) for r in list(sched.running) + list(sched.waiting)]
        held += [weakref.ref(r.beam) for r in sched.running if r.beam is not None]
        assert len(held) == 7
        sched.step()
        sched.step()
        assert sched.abort_request("r3") is not None  # (a beam request aborted mid-way)
        run_to_completion(sched)
        sched.step()  # (idle: the memos let go)
        alive = [w() for w in held if w() is not None]
        assert not alive, [getattr(r, "rid", r) for r in alive]
    finally:
        gc.enable()


KINDS = {  # request kinds whose paths hold more per request: each must leave no cycle
    "stop strings and logprobs": {"stop": ["the"]},
    "penalties and n-gram bans": {"repetition_penalty": 1.3, "presence_penalty": 0.5,
                                  "no_repeat_ngram_size": 2},
    "regex grammar": {"regex": "[a-z ]{1,12}"},
    "beams with penalties and bans": {"num_beams": 2, "repetition_penalty": 1.2,
                                      "no_repeat_ngram_size": 2, "length_penalty": 0.5},
    "sampled": {"temperature": 0.8, "seed": 3},
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_other_request_kinds_freed_without_the_collector(t5_dir, kind):
    tok = load_tokenizer(t5_dir)
    sched = make_scheduler(t5_dir)
    gc.collect()
    gc.disable()
    try:
        for i in range(2):
            tr = request(f"r{i}", tok(SOURCES[i]).input_ids, max_new_tokens=5, **KINDS[kind])
            if "stop" in KINDS[kind]:
                tr.return_logprob, tr.top_logprobs_num = True, 2
            sched.add_request(tr)
        held = []
        for _ in range(200):  # (a grammar compiles off the step: wait for it to be queued)
            sched.step()
            held += [weakref.ref(r) for r in list(sched.running) + list(sched.waiting)
                     if all(w() is not r for w in held)]
            if not sched.has_work:
                break
        assert held, "the requests ran"
        for _ in range(3):
            sched.step()  # (idle)
        alive = [w() for w in held if w() is not None]
        assert not alive, [getattr(r, "rid", r) for r in alive]
    finally:
        gc.enable()


def test_rounds_of_mixed_requests_leave_no_garbage_behind(t5_dir):
    """Round after round of mixed requests (greedy, beams, a grammar, penalties, an abort)
    with the collector off: the tracked objects do not grow from one round to the next, so a
    scheduler whose full passes are rare (`FullPasses`) keeps a flat heap."""
    tok = load_tokenizer(t5_dir)
    sources = [tok(s).input_ids for s in SOURCES]
    sched = make_scheduler(t5_dir)
    mixed = [{}, {"num_beams": 3}, {"num_beams": 2, "length_penalty": 0.5},
             {"regex": "[a-z ]{1,12}"}, {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2},
             {"num_beams": 2}]

    def round_(r: int) -> None:
        for i, kw in enumerate(mixed):
            sched.add_request(request(f"{r}-{i}", sources[i % len(sources)], max_new_tokens=5,
                                      **kw))
        for step in range(400):
            if step == 2:
                sched.abort_request(f"{r}-5")  # (a beam request aborted while it runs)
            sched.step()
            if not sched.has_work:
                break
        for _ in range(3):
            sched.step()

    round_(0)  # (first-use caches: compiled grammars, memos)
    gc.collect()
    gc.disable()
    try:
        round_(1)
        before = len(gc.get_objects())
        for r in range(2, 5):
            round_(r)
        after = len(gc.get_objects())
    finally:
        gc.enable()
    assert after - before < 100, (before, after)  # (~120 a round when beam groups leaked)
