"""What a server's first requests wait for on a GPU: the scheduler in-process on a real model
shape with random weights (loaded, kernels warmed, CUDA graphs captured, as `serve` starts),
then requests of new shapes one at a time, each timed, with every Triton compile and every
autotuning that ran inside it listed (kernel, seconds).

    python benchmarks/profile_first_request.py --shape mt5-large --lengths 10,10,37,128
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections import defaultdict

import torch
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

from seq2serve.runtime.bench.shapes import write_shape
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.scheduler.scheduler import Scheduler

EVENTS: list[tuple[str, str, float]] = []


def _hook_triton() -> None:
    """Record each compile (JITFunction._do_compile) and each new autotuning (Autotuner.run
    adding a cache entry) with its wall time."""
    do_compile = JITFunction._do_compile

    def timed_compile(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return do_compile(self, *args, **kwargs)
        finally:
            EVENTS.append(("compile", self.__name__, time.perf_counter() - start))

    run = Autotuner.run

    def timed_run(self, *args, **kwargs):
        before, start = len(self.cache), time.perf_counter()
        try:
            return run(self, *args, **kwargs)
        finally:
            if len(self.cache) > before:
                key = list(self.cache)[-1]
                EVENTS.append(("tune", f"{self.base_fn.__name__} {key}",
                               time.perf_counter() - start))

    JITFunction._do_compile, Autotuner.run = timed_compile, timed_run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="mt5-large")
    ap.add_argument("--lengths", default="10,10,37,128", help="source lengths, one request each")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    path = str(write_shape(args.shape, tempfile.mkdtemp()))
    start = time.perf_counter()
    sched = Scheduler(ServerArgs(model_path=path, device=args.device, dtype="bfloat16",
                                 load_format="dummy"), ModelConfig.from_path(path), None)
    print(f"{args.shape}: scheduler ready in {time.perf_counter() - start:.1f} s")
    _hook_triton()
    rng = random.Random(0)
    sp = {"temperature": 0, "max_new_tokens": args.new_tokens, "ignore_eos": True}
    for i, n in enumerate(int(x) for x in args.lengths.split(",")):
        EVENTS.clear()
        if args.device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        sched.add_request(TokenizedRequest(
            rid=str(i), encoder_input_ids=[rng.randrange(3, 32000) for _ in range(n)] + [1],
            decoder_input_ids=[0], sampling_params=SamplingParams.from_dict(sp)))
        while sched.has_work:
            sched.step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        total = defaultdict(float)
        for kind, _, seconds in EVENTS:
            total[kind] += seconds
        print(f"request {i}: source of {n + 1} tokens, {args.new_tokens} new tokens in "
              f"{(time.perf_counter() - start) * 1e3:.0f} ms; Triton compiles "
              f"{total['compile'] * 1e3:.0f} ms, autotuning {total['tune'] * 1e3:.0f} ms")
        for kind, what, seconds in EVENTS:
            print(f"    {kind:8s}{seconds * 1e3:8.0f} ms  {what}")


if __name__ == "__main__":
    main()
