"""The sampler's step alone at a 128k vocabulary: greedy, sampled (seeded, unseeded), top-k and
top-p, by batch size, on the CPU (thread CPU time, one thread: robust on a shared host) or CUDA
(events). With a second sampler module (`--baseline path.py`, e.g. an older sampler.py) both
run on the same logits. Also checks, on the device, that a seeded row draws the same token
alone and inside a batch (the noise and reductions per row independent of the batch).

    python benchmarks/bench_sampler.py [--device cuda] [--batch-sizes 1,8,64,256]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time

import torch

from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.executor.sampler import Sampler
from seq2serve.runtime.executor.sampling_batch import SamplingBatch
from seq2serve.runtime.scheduler.req import Req

VOCAB = 128256
CASES = {"seeded": {"temperature": 0.8}, "unseeded": {"temperature": 0.8},
         "top_k 50": {"temperature": 0.8, "top_k": 50},
         "top_p 0.9": {"temperature": 0.8, "top_p": 0.9}}


def _batch(params: list[dict], device: str, step: int = 5) -> SamplingBatch:
    reqs = []
    for i, p in enumerate(params):
        r = Req(rid=str(i), encoder_input_ids=[], decoder_input_ids=[0],
                sampling_params=SamplingParams.from_dict(p))
        r.output_ids = [0] * step
        reqs.append(r)
    sb = SamplingBatch.from_reqs(reqs, VOCAB, eos_ids=(1,), device=device)
    # what a sampler before seeded_race.py read instead of `keys`
    sb.seeds = (torch.tensor([p.get("seed", -1) for p in params], device=device)
                if any("seed" in p for p in params) else None)
    sb.steps = torch.full((len(params),), step, device=device)
    return sb


def _time_ms(fn, device: str, reps: int = 20) -> float:
    fn()
    if device == "cpu":
        best = float("inf")
        for _ in range(reps):
            t = time.thread_time()
            fn()
            best = min(best, time.thread_time() - t)
        return best * 1e3
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def _load(path: str):
    spec = importlib.util.spec_from_file_location("baseline_sampler", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod.Sampler()


def batch_independence(device: str, trials: int = 50) -> int:
    """Trials (of `trials`) where a seeded row drew the same token alone and in a batch of 64."""
    g = torch.Generator(device=device).manual_seed(0)
    same = 0
    for t in range(trials):
        logits = torch.randn(64, VOCAB, device=device, generator=g) * 2
        params = [{"temperature": 1.0, "seed": 100 + t}] + [{"temperature": 0.7}] * 63
        together = Sampler()(logits, _batch(params, device, t)).next_token_ids[0]
        alone = Sampler()(logits[:1], _batch(params[:1], device, t)).next_token_ids[0]
        same += int(together == alone)
    return same


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--baseline", default=None, help="another sampler.py to time alike")
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    samplers = {"new": Sampler()} | ({"baseline": _load(args.baseline)} if args.baseline else {})
    rows = []
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        logits = torch.randn(b, VOCAB, device=args.device) * 4  # peaked enough for top-p
        greedy = _time_ms(lambda: samplers["new"].greedy(logits), args.device)  # noqa: B023
        row = {"batch": b, "greedy_ms": greedy}
        for case, p in CASES.items():
            params = [p | ({"seed": i} if case != "unseeded" else {}) for i in range(b)]
            sb = _batch(params, args.device)
            for name, s in samplers.items():
                row[f"{case} {name}_ms"] = _time_ms(lambda: s(logits, sb), args.device)  # noqa: B023
        rows.append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                          for k, v in row.items()}), flush=True)
    same = batch_independence(args.device)
    print(f"seeded row alone vs in a batch of 64: same token in {same}/50 trials")


if __name__ == "__main__":
    main()
