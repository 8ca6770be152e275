"""Where a decode step's host time goes on a GPU: the scheduler in-process (no child processes)
on a real model shape with random weights and CUDA graphs, N decode steps under cProfile,
next to the wall time per step and the device's busy time per step (CUDA events).

    python benchmarks/profile_host_step.py --shape mt5-large --batch 128 --steps 100
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import tempfile
import time

from seq2serve.runtime.bench.shapes import write_shape
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.scheduler.scheduler import Scheduler


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="mt5-large")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    path = str(write_shape(args.shape, tempfile.mkdtemp()))
    sargs = ServerArgs(model_path=path, device="cuda", dtype="bfloat16", load_format="dummy",
                       max_running_requests=args.batch,
                       context_length=args.steps + 64)
    sched = Scheduler(sargs, ModelConfig.from_path(path), None)
    rng = random.Random(0)
    sp = {"temperature": 0, "max_new_tokens": args.steps + 40, "ignore_eos": True}
    for i in range(args.batch):
        sched.add_request(TokenizedRequest(
            rid=str(i), encoder_input_ids=[rng.randrange(3, 32000) for _ in range(args.input_len)],
            decoder_input_ids=[0], sampling_params=SamplingParams.from_dict(sp)))
    while sched.forwards["decode"] < 10:  # admission, encode, prefill, graph warm-up
        sched.step()
    device0, decode0 = sched.device_seconds, sched.forwards["decode"]
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    while sched.forwards["decode"] - decode0 < args.steps:
        sched.step()
    prof.disable()
    wall = time.perf_counter() - start
    n = sched.forwards["decode"] - decode0
    print(f"{args.shape} batch {args.batch}: {1e3 * wall / n:.3f} ms per decode step under "
          f"cProfile, device busy {1e3 * (sched.device_seconds - device0) / n:.3f} ms")
    # the same without the profiler's overhead
    device0, decode0, start = sched.device_seconds, sched.forwards["decode"], time.perf_counter()
    while sched.forwards["decode"] - decode0 < min(args.steps, 30):
        sched.step()
    n = sched.forwards["decode"] - decode0
    print(f"without the profiler: {1e3 * (time.perf_counter() - start) / n:.3f} ms per step, "
          f"device busy {1e3 * (sched.device_seconds - device0) / n:.3f} ms")
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
