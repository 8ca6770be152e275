"""What a wave of beam requests costs the host beyond its steady steps: the offline engine
runs its requests in waves (all admitted together, all finishing together), and each wave
has an admission step (encoder cache, pools, encoder pass), a step where every group takes
its first beam step (its rows spawned, its books entered) and a step where every group
finishes (results, releases). The scheduler stepped in-process over `--requests` requests
(a tiny random BART on the CPU by default; `--shape opus-mt --device cuda` for a real shape
with random bf16 weights); each step's wall time is filed under the kind of step it was, and
the real time spent in a few named functions (`--phases`) beside it. The heap is frozen after
startup as the scheduler process freezes it; `--no-gc` runs with the cyclic collector off.

    python benchmarks/beam_wave_steps.py --requests 1024 --beams 4 --rows 2048 --new-tokens 64
    python3 benchmarks/beam_wave_steps.py --shape opus-mt --device cuda --requests 4096 --phases

On CUDA one wave of requests runs first, untimed (`--warm-up`): on a fresh machine the first
wave compiles kernels inside its steps, which the device's event-to-event time counts too.
"""

from __future__ import annotations

import argparse
import collections
import gc
import random
import sys
import tempfile
import time
from pathlib import Path

from seq2serve.runtime.bench.shapes import write_shape
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.memory.collector import CollectorPauses, freeze_heap
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.scheduler import request_memory, scheduler
from seq2serve.runtime.scheduler.scheduler import Scheduler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from beam_host_phases import timer  # noqa: E402  (the same timers)
from beam_overlap_share import tiny_bart  # noqa: E402  (the same tiny BART)

# (owner, attribute, label): the functions whose real time `--phases` adds up
PHASES = [
    (request_memory.RequestMemory, "admit", "RequestMemory.admit"),
    (request_memory.RequestMemory, "reorder_beams", "RequestMemory.reorder_beams"),
    (request_memory.RequestMemory, "_first_step", "  of it _first_step"),
    (scheduler.Scheduler, "_admit", "Scheduler._admit"),
    (scheduler.Scheduler, "_extend", "Scheduler._extend"),
    (scheduler.Scheduler, "_process", "Scheduler._process"),
    (scheduler.Scheduler, "_beam_steps", "  of it _beam_steps"),
    (scheduler.Scheduler, "_finish_beams", "  of it _finish_beams"),
    (scheduler.Scheduler, "_launch", "Scheduler._launch"),
]


# (module, attribute path, label): the steady step's parts, `--steady` (a module-level
# function is replaced wherever it was imported by name)
STEADY = [
    ("seq2serve.runtime.scheduler.step_plan", "rows_ahead", "rows_ahead"),
    ("seq2serve.runtime.scheduler.step_launcher", "StepLauncher.launch", "StepLauncher.launch"),
    ("seq2serve.runtime.scheduler.step_launcher", "StepLauncher._beam_layout",
     "  of it _beam_layout"),
    ("seq2serve.runtime.scheduler.step_launcher", "StepLauncher._sampling", "  of it _sampling"),
    ("seq2serve.runtime.scheduler.schedule_batch", "decode_batch", "  of it decode_batch"),
    ("seq2serve.runtime.scheduler.schedule_batch", "_beam_columns", "    of it _beam_columns"),
    ("seq2serve.runtime.scheduler.request_memory", "RequestMemory.alloc_beam_next",
     "      of it alloc_beam_next"),
    ("seq2serve.runtime.executor.model_runner", "ModelRunner.forward", "  of it forward"),
    ("seq2serve.runtime.executor.sampler", "Sampler.__call__", "    of it the sampler"),
    ("seq2serve.runtime.scheduler.beam_search", "follow_device_rules", "follow_device_rules"),
    ("seq2serve.runtime.scheduler.request_memory", "RequestMemory.follow_beams", "follow_beams"),
    ("seq2serve.runtime.scheduler.beam_book", "BeamBook.follow", "  of it BeamBook.follow"),
    # (what a batch that changes adds: encoder passes, the first steps' page copies)
    ("seq2serve.encoders.encoder_stage", "EncoderStage.run", "EncoderStage.run"),
    ("seq2serve.runtime.scheduler.request_memory", "_DeviceCopies.apply",
     "first steps' device copies"),
]


def time_phases(steady: bool = False) -> tuple[dict[str, float], dict[str, int]]:
    """Wraps PHASES' functions (and STEADY's) with real-time timers: (label -> seconds, label
    -> calls)."""
    import importlib

    spent: dict[str, float] = {label: 0.0 for _, _, label in PHASES}
    calls: dict[str, int] = {label: 0 for _, _, label in PHASES}
    for owner, attr, label in PHASES:
        setattr(owner, attr, timer(getattr(owner, attr), label, spent, calls))
    for module, path, label in STEADY if steady else ():
        owner = importlib.import_module(module)
        *outer, attr = path.split(".")
        for name in outer:
            owner = getattr(owner, name)
        fn = getattr(owner, attr)
        wrapped = timer(fn, label, spent, calls)
        spent[label], calls[label] = 0.0, 0
        if outer:
            setattr(owner, attr, wrapped)
        else:  # (and in every module that imported it by name)
            for m in list(sys.modules.values()):
                if getattr(m, attr, None) is fn:
                    setattr(m, attr, wrapped)
    return spent, calls


def step_kinds(requests: int, beams: int, rows: int, new_tokens: int, shape: str | None,
               device: str, sync, context_length: int | None = 256, arrive: int = 0,
               freeze_first: bool = False, warm: int = 0, reset=None) -> dict[str, list]:
    """Each kind of step ("admits", "first steps", "finishes", "steady") -> its wall times.
    `arrive`: requests are added `arrive` a step inside the timed loop (as the engine's
    scheduler receives a call's requests in lists) instead of all before it;
    `freeze_first`: the heap frozen before the requests are made (as in the engine's
    scheduler process, whose requests come after its startup freeze); `warm`: requests run
    to the end before anything is timed (on a fresh GPU machine the first wave compiles
    kernels inside its steps), then `reset()` (the phase timers)."""
    if shape is None:
        path, dtype, vocab, extra = tiny_bart(), "float32", 500, {}
    else:
        path, dtype, vocab = str(write_shape(shape, tempfile.mkdtemp())), "bfloat16", 32000
        extra = {"cuda_graph_max_bs": rows, "mem_fraction": 0.9}
    sched = Scheduler(ServerArgs(model_path=path, device=device, dtype=dtype,
                                 load_format="dummy", max_running_requests=rows,
                                 context_length=context_length, **extra),
                      ModelConfig.from_path(path), None)
    rng = random.Random(0)
    sp = {"max_new_tokens": new_tokens, "ignore_eos": True, "num_beams": beams}
    for i in range(warm):
        sched.add_request(TokenizedRequest(
            rid=f"warm{i}", encoder_input_ids=[rng.randrange(3, vocab) for _ in range(64)],
            decoder_input_ids=[2], sampling_params=SamplingParams.from_dict(sp), group="g"))
    while sched.has_work:
        sched.step()
    sync()
    warm_busy = sched.device_seconds
    if reset is not None:
        reset()
    if freeze_first:
        freeze_heap()
    pending = [TokenizedRequest(
        rid=str(i), encoder_input_ids=[rng.randrange(3, vocab) for _ in range(64)],
        decoder_input_ids=[2], sampling_params=SamplingParams.from_dict(sp), group="g")
        for i in range(requests)]
    pending.reverse()
    while pending and not arrive:
        sched.add_request(pending.pop())
    if not freeze_first:
        freeze_heap()  # (as the scheduler process does after startup: torch's objects frozen)
    kinds: dict[str, list] = collections.defaultdict(list)
    sync()
    pauses = CollectorPauses()  # (the run's own passes: the freeze's full pass before it)
    started = time.perf_counter()
    while sched.has_work or pending:
        for _ in range(min(arrive, len(pending))):
            sched.add_request(pending.pop())
        before = len(sched.running)
        firsts = sum(1 for r in sched.running if r.beam is not None and len(r.beam.rows) == 1)
        start = time.perf_counter()
        outputs = sched.step()
        took = time.perf_counter() - start
        finished = sum(1 for o in outputs if getattr(o, "finished_reason", None))
        admitted = len(sched.running) - before + finished
        kind = ("finishes" if finished else "admits" if admitted > 0
                else "first steps" if firsts else "steady")
        kinds[kind].append(took)
    sync()
    kinds["(whole run)"] = [time.perf_counter() - started]
    kinds["(device busy)"] = [sched.device_seconds - warm_busy]
    kinds["(collector)"] = [t / 1e3 for t in pauses.stats()["gc_pause_total_ms"]]
    pauses.close()
    return kinds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--shape", default=None, help="a bench shape (default: a tiny BART)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--phases", action="store_true")
    ap.add_argument("--steady", action="store_true", help="with --phases: the steady step's parts")
    ap.add_argument("--context-length", type=int, default=256, help="0: the model's")
    ap.add_argument("--arrive", type=int, default=0, help="requests added a step (0: all first)")
    ap.add_argument("--freeze-first", action="store_true")
    ap.add_argument("--no-gc", action="store_true")
    ap.add_argument("--warm-up", type=int, default=-1, help="requests run before the timed "
                    "ones (-1: one wave, rows / beams, on CUDA; none on the CPU)")
    ap.add_argument("--gc-threshold", default="", help="gc.set_threshold's, e.g. 50000,20,100")
    a = ap.parse_args()
    if a.gc_threshold:
        gc.set_threshold(*map(int, a.gc_threshold.split(",")))
    if a.no_gc:
        gc.disable()
    sync = lambda: None  # noqa: E731
    if a.device == "cuda":
        import torch
        sync = torch.cuda.synchronize
    spent, calls = time_phases(a.steady) if a.phases else ({}, {})

    def reset() -> None:
        for label in spent:
            spent[label], calls[label] = 0.0, 0

    warm = a.warm_up if a.warm_up >= 0 else (a.rows // a.beams if a.device == "cuda" else 0)
    kinds = step_kinds(a.requests, a.beams, a.rows, a.new_tokens, a.shape, a.device, sync,
                       a.context_length or None, a.arrive, a.freeze_first, warm, reset)
    for kind, times in kinds.items():
        if kind == "(collector)":
            continue
        times = sorted(times)
        print(f"{kind:13s} {len(times):4d} steps  {sum(times):6.2f} s  "
              f"p50 {times[len(times) // 2] * 1e3:8.2f} ms  max {times[-1] * 1e3:8.2f} ms")
    tokens = a.requests * a.new_tokens
    print(f"{tokens / kinds['(whole run)'][0]:,.0f} tok/s of best hypotheses; the collector's "
          f"pauses (gen 0 / 1 / 2): {[round(t * 1e3) for t in kinds['(collector)']]} ms")
    for label, seconds in spent.items():
        n = calls[label]
        print(f"{label:30s} {seconds:7.3f} s  {n:6d} calls  "
              f"{seconds / max(n, 1) * 1e6:9.1f} us a call")


if __name__ == "__main__":
    main()
