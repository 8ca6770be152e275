"""The scheduler alone: admission, continuous batching, retraction, overlap and aborts, driven
through a fake executor (no model, no tokenizer): each test runs in milliseconds, and every
request's output must equal what it generates alone under the fake model's rule."""

from __future__ import annotations

import gc
import os
import tracemalloc

import pytest

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.scheduler.scheduler import Scheduler
from seq2serve.runtime.tools.demo_checkpoint import default_demo_path
from seq2serve.tests.fake_executor import FakeExecutor, alone
from seq2serve.tests.helpers import request

CONFIG = ModelConfig.from_path(str(default_demo_path()))  # config.json only: no weights load
VOCAB = CONFIG.vocab_size


def scheduler(*, kv_tokens: int = 4096, cross_tokens: int = 4096, tokenizer=None,
              **args) -> Scheduler:
    a = ServerArgs(model_path=CONFIG.model_path, device="cpu", **args)
    return Scheduler(a, CONFIG, tokenizer, FakeExecutor(a, CONFIG, kv_tokens=kv_tokens,
                                                        cross_tokens=cross_tokens))


def drive(sched: Scheduler, arrivals: dict[int, list] | None = None,
          check: bool = True) -> dict[str, list[int]]:
    """Step until idle, adding `arrivals[step]` before that step; rid -> generated ids."""
    arrivals = arrivals or {}
    out: dict[str, list[int]] = {}
    step = 0
    while sched.has_work or any(s >= step for s in arrivals):
        for tr in arrivals.get(step, []):
            sched.add_request(tr)
        for o in sched.step():
            out.setdefault(o.rid, []).extend(o.new_token_ids)
        if check:
            sched.check_integrity()
        step += 1
    return out


def source(i: int) -> list[int]:
    return [100 + i, 200 + i % 7, 300 + i % 3, 1]


@pytest.mark.parametrize("overlap", [True, False])
def test_requests_joining_a_running_batch_generate_what_they_would_alone(overlap):
    sched = scheduler(disable_overlap_schedule=not overlap)
    arrivals = {step: [request(f"r{step}-{k}", source(step * 3 + k),
                               max_new_tokens=5 + (step * 3 + k) % 11, ignore_eos=True)
                       for k in range(3)] for step in (0, 2, 3, 9, 10)}
    out = drive(sched, arrivals)
    for reqs in arrivals.values():
        for tr in reqs:
            assert out[tr.rid] == alone([0], tr.sampling_params.max_new_tokens, VOCAB), tr.rid
    assert sched.max_batch["decode"] >= 6  # later arrivals decoded with earlier ones
    assert sched.memory.usage()["kv_used_tokens"] == 0


@pytest.mark.parametrize("overlap", [True, False])
def test_a_tiny_pool_retracts_and_resumes_without_changing_any_output(overlap):
    # 8 pages of 16 tokens for 6 requests of 40 tokens each: decode must retract
    sched = scheduler(kv_tokens=128, page_size=16, disable_radix_cache=True,
                      disable_overlap_schedule=not overlap)
    reqs = [request(f"r{i}", source(i), max_new_tokens=40, ignore_eos=True) for i in range(6)]
    out = drive(sched, {0: reqs})
    assert sched.num_retractions > 0
    for tr in reqs:
        assert out[tr.rid] == alone([0], 40, VOCAB)
    assert sched.memory.usage()["kv_used_tokens"] == 0


def test_aborts_free_every_slot_of_waiting_and_running_requests():
    sched = scheduler(max_running_requests=2, disable_radix_cache=True,
                      disable_encoder_cache=True)
    for i in range(5):
        sched.add_request(request(f"r{i}", source(i), max_new_tokens=50, ignore_eos=True))
    for _ in range(4):
        sched.step()
    assert len(sched.running) == 2 and len(sched.waiting) == 3
    aborted = [sched.abort_request(rid) for rid in ("r0", "r4", "nobody")]
    assert [a.finished_reason["type"] if a else None for a in aborted] == ["abort", "abort", None]
    out = drive(sched)
    assert set(out) == {"r1", "r2", "r3"}
    assert out["r2"] == alone([0], 50, VOCAB)
    usage = sched.memory.usage()
    assert usage["kv_used_tokens"] == usage["cross_used_tokens"] == 0
    sched.check_integrity()


def test_admission_is_fair_across_callers():
    sched = scheduler(max_running_requests=2)
    for i in range(30):
        tr = request(f"big{i}", source(i), max_new_tokens=3, ignore_eos=True)
        tr.group = "big"
        sched.add_request(tr)
    sched.add_request(request("small", source(99), max_new_tokens=3, ignore_eos=True))
    order = []
    while sched.has_work:
        for o in sched.step():
            if o.finished_reason is not None:
                order.append(o.rid)
    assert order.index("small") <= 3, order


def test_a_shared_source_is_encoded_once_and_a_prefix_is_reused():
    sched = scheduler()
    reqs = [request(f"r{i}", source(7), max_new_tokens=6, ignore_eos=True) for i in range(4)]
    drive(sched, {0: reqs[:1], 3: reqs[1:]})
    assert sched.worker.forwards["encode"] == 1
    assert sched.memory.encoder_cache.hits >= 3


def test_decode_steps_keep_the_scheduler_flat():
    """A long-running server's memory stays flat: after 10,000 decode steps (50,000 with
    SEQ2SERVE_SOAK=1; waves of requests, overlap on) no structure of the scheduler, its
    memory or its caches is larger than after the first waves, and the Python heap has not
    grown (a leak of 1 KB per request, or of 8 bytes per step, is over the bound)."""
    steps = 50_000 if os.environ.get("SEQ2SERVE_SOAK") else 10_000
    sched = scheduler(max_running_requests=8)

    def sizes() -> dict[str, int]:
        found = {}
        for owner in (sched, sched.memory, sched.radix, sched.memory.encoder_cache):
            for name, v in vars(owner).items():
                if hasattr(v, "__len__") and not isinstance(v, (str, bytes)):
                    found[f"{type(owner).__name__}.{name}"] = len(v)
        return found

    wave_no = 0

    def wave() -> None:
        nonlocal wave_no
        for k in range(8):  # same sources every wave: the caches stay the same size
            sched.add_request(request(f"w{wave_no}-{k}", source(k), max_new_tokens=480,
                                      ignore_eos=True))
        drive(sched, check=False)
        wave_no += 1

    tracemalloc.start()  # before the first waves: what they allocate once is not growth
    for _ in range(3):
        wave()
    gc.collect()
    before = sizes()
    heap_before = tracemalloc.get_traced_memory()[0]
    steps_before = sched.forwards["decode"]
    while sched.forwards["decode"] - steps_before < steps:
        wave()
    gc.collect()
    heap_growth = tracemalloc.get_traced_memory()[0] - heap_before
    tracemalloc.stop()
    grown = {k: (before.get(k, 0), n) for k, n in sizes().items() if n > before.get(k, 0)}
    assert not grown, grown
    assert heap_growth < (64 << 10) * steps // 10_000, \
        f"the Python heap grew by {heap_growth} bytes in {steps} steps"
    sched.check_integrity()


def test_detokenizer_settings_go_out_once_per_request():
    """A request's stop strings and skip_special_tokens ride on its first output only (the
    detokenizer keeps them), not on every token."""
    from seq2serve.runtime.config.tokenizer import load_tokenizer

    sched = scheduler(tokenizer=load_tokenizer(CONFIG.model_path))
    tr = request("s", source(1), max_new_tokens=6, ignore_eos=True, stop=["\x00never"],
                 skip_special_tokens=False)
    tr.stream = True
    sched.add_request(tr)
    outs = []
    while sched.has_work:
        outs += sched.step()
    assert len(outs) == 6
    first = outs[0].detokenize
    assert first.stop == ("\x00never",) and first.skip_special_tokens is False
    assert all(o.detokenize is None for o in outs[1:])
