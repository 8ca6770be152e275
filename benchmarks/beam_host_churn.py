"""A beam decode step's host time in steady state against the same batch with churn (groups
finishing and new ones joining every step, as a served load has them), in-process, with the
real time inside named functions (`--phases`) or cProfile's top functions (`--top`) for each.
Steady state is what the offline engine mostly runs; churn is what a server runs: every batch
differs from the one before, so whatever is kept while a batch's rows stay is made again, and
new groups are admitted, encoded and take their first step while others finish.

On CUDA (`--shape opus-mt --device cuda`), `--syncs` lists the operations that made the host
wait for the device inside the timed steps (torch's sync debug mode; the scheduler's own
read of the step in flight is one a step), by where they were called: a sync in the launch
path serializes the host and the device, which the overlap schedule exists to avoid.

    python benchmarks/beam_host_churn.py --groups 128 --beams 4 --steps 40
    python3 benchmarks/beam_host_churn.py --shape opus-mt --device cuda --groups 128 \
        --phases --syncs
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path

from seq2serve.runtime.bench.shapes import write_shape
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.scheduler.scheduler import Scheduler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from beam_overlap_share import tiny_bart  # noqa: E402  (the same tiny BART)
from beam_wave_steps import time_phases  # noqa: E402  (the same timers)


def model(shape: str | None, device: str, rows: int) -> tuple[str, dict]:
    """The model directory and the ServerArgs fields of a run: a tiny BART (float32) or a
    bench shape (random bf16 weights; CUDA graphs up to the run's rows)."""
    if shape is None:
        return tiny_bart(), {"dtype": "float32"}
    extra = {"cuda_graph_max_bs": rows, "mem_fraction": 0.6} if device == "cuda" else {}
    return str(write_shape(shape, tempfile.mkdtemp())), {"dtype": "bfloat16", **extra}


def measure(path: str, groups: int, beams: int, steps: int, churn: bool, profile: bool,
            device: str = "cpu", fields: dict | None = None, syncs: bool = False,
            timers: tuple[dict, dict] | None = None
            ) -> tuple[float, pstats.Stats | None, dict, collections.Counter]:
    """Mean ms a scheduler step over `steps` steps after a warm-up; with `churn`, requests of
    40-63 tokens, each finished one replaced at once (about groups / 52 a step). Also the
    forwards by mode, and (`syncs`, CUDA) the synchronizing operations by call site.
    `timers`: time_phases' (seconds, calls), zeroed when the timed steps start."""
    sched = Scheduler(ServerArgs(model_path=path, device=device, load_format="dummy",
                                 max_running_requests=groups * beams, context_length=512,
                                 **(fields or {"dtype": "float32"})),
                      ModelConfig.from_path(path), None)
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
    for counts in timers or ():
        for label in counts:
            counts[label] = 0
    prof = cProfile.Profile() if profile else None
    sync_sites: collections.Counter = collections.Counter()
    catch = warnings.catch_warnings(record=True) if syncs else None
    if syncs:
        import torch

        caught = catch.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
    start = time.perf_counter()
    if prof:
        prof.enable()
    for _ in range(steps):
        sched.step()
        refill()
    if prof:
        prof.disable()
    ms = (time.perf_counter() - start) / steps * 1e3
    if syncs:
        torch.cuda.set_sync_debug_mode(0)
        catch.__exit__(None, None, None)
        for w in caught:
            where = f"{Path(w.filename).name}:{w.lineno}"
            sync_sites[f"{where}  {str(w.message).splitlines()[0][:90]}"] += 1
    forwards = {k: v - before.get(k, 0) for k, v in sched.forwards.items()}
    return ms, pstats.Stats(prof) if prof else None, forwards, sync_sites


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=128)
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--shape", default=None, help="a bench shape (default: a tiny BART)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--phases", action="store_true", help="real time inside named functions")
    ap.add_argument("--syncs", action="store_true", help="CUDA: the synchronizing operations")
    ap.add_argument("--top", type=int, default=0, help="cProfile's top N by cumulative time")
    args = ap.parse_args()
    path, fields = model(args.shape, args.device, args.groups * args.beams)
    run = lambda churn, profile=False, syncs=False, timers=None: measure(  # noqa: E731
        path, args.groups, args.beams, args.steps, churn, profile, args.device, fields, syncs,
        timers)
    for r in range(args.rounds):
        for churn in (False, True):
            ms, _, forwards, _ = run(churn)
            print(f"round {r} {'churn ' if churn else 'steady'}: {ms:7.2f} ms a step  "
                  f"forwards {forwards}", flush=True)
    if args.phases:
        spent, calls = time_phases(steady=True)
        for churn in (False, True):
            ms, _, _, _ = run(churn, timers=(spent, calls))
            print(f"== {'churn' if churn else 'steady'}: {ms:.2f} ms a step; inside, a step:")
            for label, seconds in spent.items():
                if calls[label]:
                    print(f"  {label:30s} {seconds / args.steps * 1e3:8.3f} ms  "
                          f"({calls[label]} calls)")
    if args.syncs and args.device == "cuda":
        for churn in (False, True):
            _, _, _, sites = run(churn, syncs=True)
            print(f"== {'churn' if churn else 'steady'}: synchronizing operations in "
                  f"{args.steps} steps")
            for site, n in sites.most_common(25):
                print(f"  {n:5d}  {site}")
    if args.top:
        for churn in (False, True):
            _, stats, _, _ = run(churn, profile=True)
            print(f"== {'churn' if churn else 'steady'}, cProfile")
            stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
