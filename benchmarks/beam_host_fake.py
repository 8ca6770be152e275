"""The scheduler's host time a beam step with no model at all: the fake executor
(`tests/fake_executor.py`: real pools, the real sampler and HF's rules on the CPU over a fixed
table of logits) stands in for the device, and its own time is taken out, so what is left is
what the scheduler process's Python costs a step (the launch's layout and columns, the books,
the rules' bookkeeping) at the batch sizes the GPU runs. No GPU needed: a change to the host
step can be timed on any machine before it goes to the device.

Two loads: `steady` (all groups admitted at once, the same batch step after step, as the
offline engine runs a wave) and `churn` (`--arrive` groups arriving a step, of mixed lengths,
as a server runs). `--top N`: cProfile's top functions of the steady steps.

    python benchmarks/beam_host_fake.py --groups 512 --beams 4 --new-tokens 64
    python benchmarks/beam_host_fake.py --groups 512 --top 25
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.scheduler.scheduler import Scheduler
from seq2serve.tests.fake_executor import FakeExecutor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from beam_overlap_share import tiny_bart  # noqa: E402  (a config of vocabulary 512)


def _scheduler(rows: int) -> tuple[Scheduler, FakeExecutor]:
    path = tiny_bart()
    args = ServerArgs(model_path=path, device="cpu", dtype="float32", load_format="dummy",
                      max_running_requests=rows, context_length=256)
    config = ModelConfig.from_path(path)
    fake = FakeExecutor(args, config, kv_tokens=rows * 256, cross_tokens=rows * 128,
                        context_len=256, max_encoder_len=128)
    return Scheduler(args, config, None, fake), fake


def _request(i: int, beams: int, new_tokens: int, rng: random.Random) -> TokenizedRequest:
    sp = SamplingParams.from_dict({"max_new_tokens": new_tokens, "ignore_eos": True,
                                   "num_beams": beams})
    return TokenizedRequest(rid=str(i), encoder_input_ids=[rng.randrange(3, 500)
                                                           for _ in range(64)],
                            decoder_input_ids=[2], sampling_params=sp)


def steady(groups: int, beams: int, new_tokens: int, top: int,
           sort: str = "cumulative") -> dict:
    """One wave: the steps after every group's first step and before any finishes."""
    sched, fake = _scheduler(groups * beams)
    rng = random.Random(0)
    for i in range(groups):
        sched.add_request(_request(i, beams, new_tokens, rng))
    walls, fakes = [], []
    prof = cProfile.Profile() if top else None
    gc.collect()
    gc.freeze()
    step = 0
    while sched.has_work:
        before = fake.seconds
        steady_step = 3 <= step < new_tokens - 2  # (past admission and first steps)
        if prof is not None and steady_step:
            prof.enable()
        start = time.perf_counter()
        sched.step()
        took = time.perf_counter() - start
        if prof is not None and steady_step:
            prof.disable()
        if steady_step:
            walls.append(took)
            fakes.append(fake.seconds - before)
        step += 1
    gc.unfreeze()
    if prof is not None:
        pstats.Stats(prof).sort_stats(sort).print_stats(top)
    walls, fakes = np.array(walls), np.array(fakes)
    return {"steps": len(walls), "wall": float(np.median(walls)),
            "fake": float(np.median(fakes)), "host": float(np.median(walls - fakes))}


def churn(groups: int, beams: int, new_tokens: int, arrive: int, steps: int, top: int = 0,
          sort: str = "cumulative") -> dict:
    """`groups` running at once, `arrive` new ones a step once the batch is full (lengths
    from 1/2 to 3/2 of `new_tokens`, so about as many finish a step)."""
    sched, fake = _scheduler(groups * beams)
    rng = random.Random(0)
    n = 0
    for _ in range(groups):
        length = rng.randrange(new_tokens // 2, 3 * new_tokens // 2)
        sched.add_request(_request(n, beams, length, rng))
        n += 1
    walls, fakes = [], []
    prof = cProfile.Profile() if top else None
    gc.collect()
    gc.freeze()
    for step in range(new_tokens + steps):
        if step >= new_tokens // 2:
            for _ in range(arrive):
                length = rng.randrange(new_tokens // 2, 3 * new_tokens // 2)
                sched.add_request(_request(n, beams, length, rng))
                n += 1
        before = fake.seconds
        timed = step >= new_tokens  # (once arrivals and finishes are steady)
        if prof is not None and timed:
            prof.enable()
        start = time.perf_counter()
        sched.step()
        took = time.perf_counter() - start
        if prof is not None and timed:
            prof.disable()
        if timed:
            walls.append(took)
            fakes.append(fake.seconds - before)
    gc.unfreeze()
    if prof is not None:
        pstats.Stats(prof).sort_stats(sort).print_stats(top)
    walls, fakes = np.array(walls), np.array(fakes)
    return {"steps": len(walls), "wall": float(np.median(walls)),
            "fake": float(np.median(fakes)), "host": float(np.median(walls - fakes)),
            "running": len(sched.running)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=512)
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--arrive", type=int, default=0, help="churn: groups a step (0: groups/"
                    "new-tokens)")
    ap.add_argument("--steps", type=int, default=40, help="churn: steps timed")
    ap.add_argument("--top", type=int, default=0)
    ap.add_argument("--churn-only", action="store_true", help="--top: of the churn's steps")
    ap.add_argument("--sort", default="cumulative", help="--top's order (tottime: own time)")
    a = ap.parse_args()
    # (one thread, as the scheduler process's host work is: torch's pool of two on a busy
    # 2-core machine turns a small index into milliseconds of waiting)
    torch.set_num_threads(1)
    s = steady(a.groups, a.beams, a.new_tokens, 0 if a.churn_only else a.top, a.sort)
    print(f"{a.groups} groups x {a.beams} beams, medians a step, ms (the fake's logits and "
          f"sampler taken out of the host's)")
    print(f"steady: wall {s['wall'] * 1e3:7.2f}  fake {s['fake'] * 1e3:6.2f}  "
          f"scheduler host {s['host'] * 1e3:7.2f}  ({s['steps']} steps)")
    arrive = a.arrive or max(1, a.groups // a.new_tokens)
    c = churn(a.groups, a.beams, a.new_tokens, arrive, a.steps, a.top if a.churn_only else 0,
              a.sort)
    print(f"churn : wall {c['wall'] * 1e3:7.2f}  fake {c['fake'] * 1e3:6.2f}  "
          f"scheduler host {c['host'] * 1e3:7.2f}  ({c['steps']} steps, {arrive} groups "
          f"arriving a step, {c['running']} running at the end)")


if __name__ == "__main__":
    main()
