"""`bench offline --repeats N`: seq2serve and each baseline run alternately, N times each, in
one command, on one engine and one loaded (or converted) baseline model; each side reported
by its median tokens/s, min and max (runtime/bench/repeats.py says why)."""

from __future__ import annotations

import gc

from seq2serve.runtime.bench.repeats import interleave, paired_ratios, summarize


def offline_repeated(args, model_dir: str, load: dict, reqs, results: dict,
                     open_engine) -> dict:
    """Fills `results["seq2serve"]` (one entry per concurrency) and `results["hf"]` (one per
    baseline) with medians over `args.repeats` interleaved rounds. The baselines are loaded
    before the engine starts (which plans its pools from the memory then free) and stay
    loaded: with a baseline, one concurrency only."""
    from seq2serve.runtime.bench.engine_bench import time_engine, warm_engine

    concurrencies = [int(x) for x in args.batch_sizes.split(",")]
    if args.baseline and len(concurrencies) > 1:
        raise ValueError("--repeats with a baseline takes one --batch-sizes value (the "
                         "baselines run once per round, next to one engine)")
    sizes = args.hf_batch_size or [max(concurrencies)]
    if len(sizes) > 1:
        raise ValueError("--repeats takes one --hf-batch-size (run the sizes without --repeats "
                         "to find the baseline's best, then repeat at it)")
    batch = sizes[0]
    baselines = _baselines(args, model_dir, reqs, batch)
    for c in concurrencies:
        with open_engine(model_dir, load, args, c) as engine:
            warm_engine(engine, reqs, args.num_beams, full=(c, args.output_len))
            runners = {"seq2serve": lambda e=engine: time_engine(e, reqs, args.output_len,
                                                                 args.num_beams)}
            runs = interleave(runners | baselines, args.repeats, _print_run)
        ours = runs.pop("seq2serve")
        outputs = ours[0]["output_ids"]
        results["seq2serve"].append({"concurrency": c, **summarize(ours),
                                     "runs": [_without_ids(r) for r in ours]})
        _print_summary(f"seq2serve concurrency {c}", results["seq2serve"][-1])
    for name, theirs in runs.items():
        entry = {"mode": theirs[0]["mode"], "batch_size": theirs[0]["batch_size"],
                 **summarize(theirs), "paired_ratios": paired_ratios(ours, theirs),
                 "runs": [_without_ids(r) for r in theirs]}
        if "output_ids" in theirs[0]:
            entry["same_output_as_seq2serve"] = sum(
                a == b for a, b in zip(outputs, theirs[0]["output_ids"]))
        results["hf"].append(entry)
        _print_summary(name, entry)
        lo, hi = min(entry["paired_ratios"]), max(entry["paired_ratios"])
        print(f"  seq2serve / {name} round by round: {lo:.2f}x - {hi:.2f}x", flush=True)
    return results


def _baselines(args, model_dir: str, reqs, batch: int) -> dict:
    """name -> a callable that runs that baseline once (timed, after its own warm-up)."""
    out = {}
    if "hf" in args.baseline:
        for mode in args.hf_modes.split(","):
            out[f"HF {mode}"] = _HfRunner(args, model_dir, reqs, batch, mode)
    if "ct2" in args.baseline:
        from seq2serve.runtime.bench.ct2_baseline import Ct2Runner

        if (args.device or "cpu") != "cpu":
            raise ValueError("--baseline ct2 runs on a CPU (--device cpu)")
        out[f"ct2-{args.ct2_compute_type}"] = Ct2Runner(model_dir, reqs, batch,
                                                        args.output_len, args.ct2_compute_type,
                                                        beam_size=args.num_beams)
    gc.collect()
    return out


class _HfRunner:
    """One HF model, loaded once; its first run warms up (and compiles, static mode)."""

    def __init__(self, args, model_dir: str, reqs, batch: int, mode: str) -> None:
        import torch

        from seq2serve.runtime.bench.hf_baseline import load_hf_model

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = load_hf_model(model_dir, getattr(torch, args.dtype), device)
        self.args, self.model_dir, self.reqs, self.batch, self.mode = (
            args, model_dir, reqs, batch, mode)
        self.warm = False

    def __call__(self) -> dict:
        from seq2serve.runtime.bench.hf_baseline import bench_hf

        a = self.args
        r = bench_hf(self.model, self.model_dir, self.reqs, self.batch, a.output_len, self.mode,
                     a.hf_max_batches, a.num_beams, warmup=not self.warm)
        self.warm = True
        return r


def _without_ids(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "output_ids"}


def _print_run(round_: int, name: str, r: dict) -> None:
    print(f"round {round_ + 1}: {name:24s} {r['tokens_per_s']:10.0f} tok/s", flush=True)


def _print_summary(name: str, s: dict) -> None:
    print(f"{name}: median {s['tokens_per_s']:.0f} tok/s (min {s['tokens_per_s_min']:.0f}, "
          f"max {s['tokens_per_s_max']:.0f}, {s['repeats']} runs)", flush=True)
