"""Where a beam search decode step's time goes on a GPU: the scheduler in-process on a real
model shape with random weights, N beam requests decoding together, then some steps under
cProfile (host) and some under torch.profiler (device kernels), next to the wall and device
time per step.

    python benchmarks/profile_beam_step.py --shape mt5-large --requests 64 --beams 4
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import tempfile
import time

import torch

from seq2serve.runtime.bench.shapes import write_shape
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.scheduler.scheduler import Scheduler


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="mt5-large")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    path = str(write_shape(args.shape, tempfile.mkdtemp()))
    rows = args.requests * args.beams
    sched = Scheduler(ServerArgs(model_path=path, device="cuda", dtype="bfloat16",
                                 load_format="dummy", max_running_requests=rows,
                                 cuda_graph_max_bs=max(rows, 8), context_length=256),
                      ModelConfig.from_path(path), None)
    rng = random.Random(0)
    sp = {"max_new_tokens": 3 * args.steps + 20, "ignore_eos": True, "num_beams": args.beams}
    for i in range(args.requests):
        sched.add_request(TokenizedRequest(
            rid=str(i), encoder_input_ids=[rng.randrange(3, 32000) for _ in range(args.input_len)],
            decoder_input_ids=[0], sampling_params=SamplingParams.from_dict(sp)))
    while sched.running_rows < rows or sched.forwards["decode"] < 5:
        sched.step()

    def timed(n: int) -> tuple[float, float]:
        torch.cuda.synchronize()
        device0, start = sched.device_seconds, time.perf_counter()
        for _ in range(n):
            sched.step()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / n * 1e3, (sched.device_seconds - device0) / n * 1e3

    wall, busy = timed(args.steps)
    print(f"{args.shape}: {args.requests} requests x {args.beams} beams: {wall:.2f} ms per "
          f"step, device busy {busy:.2f} ms")
    prof = cProfile.Profile()
    prof.enable()
    timed(args.steps)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        timed(5)
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
