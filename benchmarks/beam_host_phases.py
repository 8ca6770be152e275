"""Where a steady beam decode step's host time goes, phase by phase, in real time (not
cProfile's, which inflates Python loops many times over): a tiny random BART on the CPU,
`--groups` beam requests of `--beams` beams each, all running, the scheduler stepped
in-process. Each phase is timed around its function, every step; the medians over
`--steps` steps are printed. The model's forward and the sampler are the device's work on a
GPU (here the CPU's: left out of `host`); the rest is what the host does each step.

    python benchmarks/beam_host_phases.py --groups 512 --beams 4 --steps 40

To compare two trees on this noisy machine, run each in turn a few times (PYTHONPATH at
each tree's package) and compare the `host` lines.
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import sys
import time
from pathlib import Path

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.executor import model_runner
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.scheduler import schedule_batch, scheduler, step_launcher, step_plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from beam_overlap_share import tiny_bart  # noqa: E402  (the same tiny BART)

# (owner, function, phase name): the launch side, the device's work, the read side
PHASES = [
    (step_launcher.StepLauncher, "launch", "launch (all of it)"),
    (step_plan, "lay_out", "  lay_out"),
    (step_launcher.StepLauncher, "_beam_layout", "  beam fields"),
    (step_launcher.StepLauncher, "_sampling", "  sampling batch"),
    (schedule_batch, "decode_batch", "  decode columns and slots"),
    (model_runner.ModelRunner, "forward", "  forward + sampler (device work on a GPU)"),
    (scheduler.Scheduler, "_process", "read (all of it)"),
    (scheduler, "follow_device_rules", "  the device's rules taken in"),
    (scheduler.Scheduler, "_follow_beams", "  books follow the device"),
]


def timed_phases(groups: int, beams: int, steps: int) -> dict[str, float]:
    """Median ms a step of each phase (and `step`, `host`) over `steps` steady steps."""
    path = tiny_bart()
    rows = groups * beams
    sched = scheduler.Scheduler(ServerArgs(
        model_path=path, device="cpu", dtype="float32", load_format="dummy",
        max_running_requests=rows, context_length=256), ModelConfig.from_path(path), None)
    rng = random.Random(0)
    sp = {"max_new_tokens": steps + 40, "ignore_eos": True, "num_beams": beams}
    for i in range(groups):
        sched.add_request(TokenizedRequest(
            rid=str(i), encoder_input_ids=[rng.randrange(3, 500) for _ in range(32)],
            decoder_input_ids=[2], sampling_params=SamplingParams.from_dict(sp)))
    spent: dict[str, float] = {}
    for owner, name, label in PHASES:
        # (the callers look these names up in their modules: patched where they are read)
        original = getattr(owner, name)
        timer_ = timer(original, label, spent)
        for where in (owner, step_launcher, scheduler):
            if getattr(where, name, None) is original:
                setattr(where, name, timer_)
    while sched.running_rows < rows or sched.forwards["decode"] < 5:
        sched.step()
    per_step = []
    for _ in range(steps):
        spent.clear()
        start = time.perf_counter()
        sched.step()
        spent["step"] = time.perf_counter() - start
        per_step.append(dict(spent))
    out = {k: statistics.median(s.get(k, 0.0) for s in per_step) * 1e3 for k in per_step[0]}
    out["host"] = statistics.median(
        (s["step"] - s.get(PHASES[5][2], 0.0)) * 1e3 for s in per_step)
    return out


def timer(fn, label: str, spent: dict[str, float], calls: dict[str, int] | None = None):
    """`fn` adding its real time to `spent[label]` (and counting its calls in `calls`)."""
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - start
            if calls is not None:
                calls[label] = calls.get(label, 0) + 1
    return timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=512)
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    out = timed_phases(a.groups, a.beams, a.steps)
    print(f"{a.groups} groups x {a.beams} beams, median ms a step over {a.steps} steps")
    for _, _, label in PHASES:
        print(f"{out.get(label, 0.0):8.2f}  {label}")
    print(f"{out['step']:8.2f}  step\n{out['host']:8.2f}  host (the step less forward + "
          "sampler)")


if __name__ == "__main__":
    main()
