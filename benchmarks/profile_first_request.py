"""What a server's first requests wait for on a GPU: the scheduler in-process on a real model
shape with random weights (loaded, kernels warmed, CUDA graphs captured, as `serve` starts),
then requests of new shapes one at a time, each timed, with every Triton compile and every
autotuning that ran inside it listed (kernel, seconds). `--batches` submits rounds of several
requests at once instead (a batch's first encoder pass and decoder steps compile variants a
single request does not: a fresh whisper-large-v3 server spent ~2.5 s so, twenty-first
session); a Whisper shape's requests are distinct 30 s clips with Whisper's prompt.

    python benchmarks/profile_first_request.py --shape mt5-large --lengths 10,10,37,128
    python benchmarks/profile_first_request.py --shape whisper-large-v3 --batches 1,9,10,4,127
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

from seq2serve.encoders.audio_features import AudioFeatures
from seq2serve.runtime.bench.shapes import write_shape
from seq2serve.runtime.bench.workload import audio_requests
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
    ap.add_argument("--batches", default=None,
                    help="requests submitted together, a round each (e.g. 1,9,127); text "
                         "requests take the first of --lengths")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    path = str(write_shape(args.shape, tempfile.mkdtemp()))
    start = time.perf_counter()
    config = ModelConfig.from_path(path)
    sched = Scheduler(ServerArgs(model_path=path, device=args.device, dtype="bfloat16",
                                 load_format="dummy"), config, None)
    print(f"{args.shape}: scheduler ready in {time.perf_counter() - start:.1f} s")
    _hook_triton()
    audio = args.shape.startswith("whisper")
    lengths = [int(x) for x in args.lengths.split(",")]
    rounds = ([int(x) for x in args.batches.split(",")] if args.batches
              else [1] * len(lengths))
    requests = _requests(path, sum(rounds), lengths, bool(args.batches), audio)
    sp = {"temperature": 0, "max_new_tokens": args.new_tokens, "ignore_eos": True}
    sent = 0
    for i, count in enumerate(rounds):
        EVENTS.clear()
        if args.device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for rid in range(sent, sent + count):
            encoder_ids, decoder_ids, inputs = requests[rid]
            sched.add_request(TokenizedRequest(
                rid=str(rid), encoder_input_ids=encoder_ids, decoder_input_ids=decoder_ids,
                encoder_inputs=inputs, sampling_params=SamplingParams.from_dict(sp)))
        sent += count
        while sched.has_work:
            sched.step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        total = defaultdict(float)
        for kind, _, seconds in EVENTS:
            total[kind] += seconds
        what = (f"{count} clip(s) of 30 s" if audio else
                f"{count} source(s) of {len(requests[sent - 1][0])} tokens")
        print(f"round {i}: {what}, {args.new_tokens} new tokens in "
              f"{(time.perf_counter() - start) * 1e3:.0f} ms; Triton compiles "
              f"{total['compile'] * 1e3:.0f} ms, autotuning {total['tune'] * 1e3:.0f} ms")
        for kind, what, seconds in EVENTS:
            print(f"    {kind:8s}{seconds * 1e3:8.0f} ms  {what}")


def _requests(path: str, n: int, lengths: list[int], batched: bool,
              audio: bool) -> list[tuple[list[int], list[int], list]]:
    """Each request's encoder ids, decoder prompt and encoder inputs: distinct clips for a
    Whisper shape (their features as the frontend makes them, samples in the request), else
    random sources of `lengths` (all of the first length when batched)."""
    if audio:
        out = []
        for j, r in enumerate(audio_requests(path, n)):
            feats = AudioFeatures(torch.from_numpy(r.audio), 1500, f"profile-clip-{j}")
            out.append(([], list(r.input_ids), [feats]))
        return out
    rng = random.Random(0)
    sizes = [lengths[0]] * n if batched else lengths
    return [([rng.randrange(3, 32000) for _ in range(k)] + [1], [0], []) for k in sizes]


if __name__ == "__main__":
    main()
