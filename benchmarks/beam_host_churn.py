"""A beam decode step's host time in steady state against the same batch with churn (groups
finishing and new ones joining every step, as a served load has them), in-process on a tiny
random BART on the CPU, with cProfile's top functions for each. Steady state is what the
offline engine mostly runs; churn is what a server runs: every batch differs from the one
before, so whatever is kept while a batch's rows stay is made again.

    python benchmarks/beam_host_churn.py --groups 128 --beams 4 --steps 40
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import sys
import time
from pathlib import Path

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.scheduler.scheduler import Scheduler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from beam_overlap_share import tiny_bart  # noqa: E402  (the same tiny BART)


def measure(path: str, groups: int, beams: int, steps: int, churn: bool,
            profile: bool) -> tuple[float, pstats.Stats | None, dict]:
    """Mean ms a scheduler step over `steps` steps after a warm-up; with `churn`, requests of
    40-63 tokens, each finished one replaced at once (about groups / 52 a step)."""
    sched = Scheduler(ServerArgs(model_path=path, device="cpu", dtype="float32",
                                 load_format="dummy", max_running_requests=groups * beams,
                                 context_length=512), ModelConfig.from_path(path), None)
    rng, sent = random.Random(0), [0]

    def add(new_tokens: int) -> None:
        sched.add_request(TokenizedRequest(
            rid=str(sent[0]), encoder_input_ids=[rng.randrange(3, 500) for _ in range(16)],
            decoder_input_ids=[2], sampling_params=SamplingParams.from_dict(
                {"max_new_tokens": new_tokens, "ignore_eos": True, "num_beams": beams})))
        sent[0] += 1

    def refill() -> None:
        while churn and sched.running_rows + len(sched.waiting) * beams < groups * beams:
            add(rng.randrange(40, 64))

    for _ in range(groups):
        add(rng.randrange(40, 64) if churn else steps + 120)
    for _ in range(70):  # (churn: past the first requests' ends)
        sched.step()
        refill()
    before = dict(sched.forwards)
    prof = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if prof:
        prof.enable()
    for _ in range(steps):
        sched.step()
        refill()
    if prof:
        prof.disable()
    ms = (time.perf_counter() - start) / steps * 1e3
    forwards = {k: v - before.get(k, 0) for k, v in sched.forwards.items()}
    return ms, pstats.Stats(prof) if prof else None, forwards


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=128)
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--top", type=int, default=0, help="cProfile's top N by cumulative time")
    args = ap.parse_args()
    path = tiny_bart()
    for r in range(args.rounds):
        for churn in (False, True):
            ms, _, forwards = measure(path, args.groups, args.beams, args.steps, churn, False)
            print(f"round {r} {'churn ' if churn else 'steady'}: {ms:7.2f} ms a step  "
                  f"forwards {forwards}")
    if args.top:
        for churn in (False, True):
            _, stats, _ = measure(path, args.groups, args.beams, args.steps, churn, True)
            print(f"== {'churn' if churn else 'steady'}, cProfile")
            stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
