"""Beam groups in a continuous batch, through the fake executor (real sampler, real HF rules on
the CPU, real pools; logits fixed by each row's previous token and position): every group,
whatever it is batched with, joins, overlaps or is retracted beside, returns the hypotheses and
scores it returns alone, and the pools come back whole."""

from __future__ import annotations

import gc
import os
import tracemalloc

import numpy as np
import pytest

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.scheduler.scheduler import Scheduler
from seq2serve.runtime.tools.demo_checkpoint import default_demo_path
from seq2serve.tests.fake_executor import FakeExecutor
from seq2serve.tests.helpers import request

CONFIG = ModelConfig.from_path(str(default_demo_path()))  # config.json only: no weights load


def _scheduler(overlap: bool = True, kv_tokens: int = 4096, rows: int = 64) -> Scheduler:
    a = ServerArgs(model_path=CONFIG.model_path, device="cpu", max_running_requests=rows,
                   disable_overlap_schedule=not overlap)
    return Scheduler(a, CONFIG, None, FakeExecutor(a, CONFIG, kv_tokens=kv_tokens))


def _drive(sched: Scheduler, arrivals: dict[int, list]) -> dict[str, tuple]:
    """Step until idle, adding `arrivals[step]` before that step: rid -> (tokens, score)."""
    out: dict[str, tuple] = {}
    step = 0
    while sched.has_work or any(s >= step for s in arrivals):
        for tr in arrivals.get(step, []):
            sched.add_request(tr)
        for o in sched.step():
            assert o.error is None, o.error
            if o.finished_reason is not None:
                out[o.rid] = (list(o.new_token_ids), o.extra.get("beam_score"))
        sched.check_integrity()
        step += 1
    return out


def _beam(i: int, longer: int = 0):
    """A beam request of its own shape: beams, length, EOS ends hypotheses or not, and how
    many results."""
    k = 2 + i % 3
    n = 1 + (i % 2) * (k - 1)
    rid = f"b{i}"
    tr = request(rid, [100 + i, 200 + i % 7, 300 + i % 5, 1], [0] * (1 + i % 3),
                 num_beams=k, num_return_sequences=n, max_new_tokens=5 + i % 13 + longer,
                 ignore_eos=i % 4 == 0, length_penalty=(1.0, 0.6, 1.4)[i % 3],
                 early_stopping=(True, False, "never")[i % 3] if i % 4 else False)
    tr.beam_rids = [rid] + [f"{rid}.{j}" for j in range(1, n)]
    return tr


def _alone(tr) -> dict[str, tuple]:
    return _drive(_scheduler(), {0: [tr]})


def _requests(n: int, longer: int = 0) -> dict[int, list]:
    """`n` beam requests arriving over the first steps, three at a time, with greedy ones
    among them."""
    arrivals: dict[int, list] = {}
    for i in range(n):
        arrivals.setdefault((i // 3) * 2, []).append(_beam(i, longer))
    arrivals[1] = [request(f"g{j}", [50 + j, 1], max_new_tokens=6, ignore_eos=True)
                   for j in range(3)]
    return arrivals


@pytest.mark.parametrize("overlap", [True, False])
def test_beam_groups_batched_together_end_as_they_end_alone(overlap):
    arrivals = _requests(18)
    out = _drive(_scheduler(overlap), arrivals)
    for reqs in arrivals.values():
        for tr in reqs:
            if tr.sampling_params.num_beams == 1:
                continue
            want = _alone(_beam(int(tr.rid[1:])))
            got = {rid: out[rid] for rid in want}
            assert got == want, tr.rid


def test_beam_groups_retracted_for_room_end_as_they_end_alone():
    # a pool of 24 pages of 16: the groups' rows outgrow it and some are retracted
    sched = _scheduler(kv_tokens=384)
    arrivals = _requests(24, longer=40)
    out = _drive(sched, arrivals)
    assert sched.num_retractions > 0, "the pool was meant to run short"
    for reqs in arrivals.values():
        for tr in reqs:
            if tr.sampling_params.num_beams > 1:
                want = _alone(_beam(int(tr.rid[1:]), 40))
                assert {rid: out[rid] for rid in want} == want, tr.rid


def test_beam_steps_keep_the_scheduler_flat():
    """A long-running beam server's memory stays flat: with groups of mixed shapes arriving
    and finishing every few steps for 300 decode steps (20,000 with SEQ2SERVE_SOAK=1), no
    structure of the scheduler, its memory, the beam book, the launcher's memos or the
    device rules' arenas is larger than after the first 300 steps (each measured with the
    batch drained), and the Python heap has not grown (a leak of 1 KB a group is over the
    bound)."""
    soak = bool(os.environ.get("SEQ2SERVE_SOAK"))
    steps, warm = (20_000, 2_000) if soak else (300, 300)
    sched = _scheduler(rows=48)
    book, launcher = sched.memory.beam_book, sched.launcher
    sampler = sched.worker.sampler

    def sizes() -> dict[str, int]:
        found = {}
        for owner in (sched, sched.memory, sched.radix, sched.memory.encoder_cache, book,
                      launcher, sched.memory.beam_slots):
            for name, v in vars(owner).items():
                if isinstance(v, np.ndarray):
                    found[f"{type(owner).__name__}.{name}"] = v.size
                elif hasattr(v, "__len__") and not isinstance(v, (str, bytes)):
                    found[f"{type(owner).__name__}.{name}"] = len(v)
        found.update({f"arena {k}": a.capacity for k, a in sampler.arenas.items()})
        found["slots handed out"] = sum(sched.memory.beam_slots._next.values())
        return found

    made = 0

    def run(until: int) -> None:
        nonlocal made
        while sched.forwards.get("decode", 0) < until:
            if sched.running_rows + len(sched.waiting) * 4 < 40:  # (about 10 groups running)
                # (twelve requests over and over: the encoder cache keeps its size)
                tr = _beam(made % 12, longer=made % 5 * 7)
                tr.rid = f"{tr.rid}-{made}"
                tr.beam_rids = [tr.rid] + [f"{tr.rid}.{j}" for j in range(1, len(tr.beam_rids))]
                sched.add_request(tr)
                made += 1
            for o in sched.step():
                assert o.error is None, o.error

    def drain() -> None:  # (measured with nothing running: the sizes of what stays)
        while sched.has_work:
            sched.step()

    run(warm)
    drain()
    gc.collect()
    before, made_before = sizes(), made
    tracemalloc.start()  # (after the warm-up: traced steps run several times slower)
    heap_before = tracemalloc.get_traced_memory()[0]
    run(sched.forwards["decode"] + steps)
    drain()
    gc.collect()
    heap_growth = tracemalloc.get_traced_memory()[0] - heap_before
    tracemalloc.stop()
    assert made - made_before > steps // 20, "groups were meant to come and go"
    grown = {k: (before.get(k, 0), n) for k, n in sizes().items() if n > before.get(k, 0)}
    assert not grown, grown
    assert heap_growth < (made - made_before) * 1024, \
        f"the Python heap grew by {heap_growth} bytes over {made - made_before} groups"
    sched.check_integrity()
