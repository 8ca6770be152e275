"""What a wave of beam requests costs the host beyond its steady steps: the offline engine
runs its requests in waves (all admitted together, all finishing together), and each wave
has an admission step (encoder cache, pools, encoder pass), a step where every group takes
its first beam step (its rows spawned, its books entered) and a step where every group
finishes (results, releases). A tiny random BART on the CPU, the scheduler stepped
in-process over `--requests` requests; each step's wall time is filed under the kind of
step it was. The heap is frozen after startup as the scheduler process freezes it;
`--no-gc` runs with the cyclic collector off (what of the admission is the collector's).

    python benchmarks/beam_wave_steps.py --requests 1024 --beams 4 --rows 2048 --new-tokens 64
"""

from __future__ import annotations

import argparse
import collections
import gc
import random
import sys
import time
from pathlib import Path

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.memory.collector import freeze_heap
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.scheduler.scheduler import Scheduler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from beam_overlap_share import tiny_bart  # noqa: E402  (the same tiny BART)


def step_kinds(requests: int, beams: int, rows: int, new_tokens: int) -> dict[str, list]:
    """Each kind of step ("admits", "first steps", "finishes", "steady") -> its wall times."""
    path = tiny_bart()
    sched = Scheduler(ServerArgs(model_path=path, device="cpu", dtype="float32",
                                 load_format="dummy", max_running_requests=rows,
                                 context_length=256), ModelConfig.from_path(path), None)
    rng = random.Random(0)
    sp = {"max_new_tokens": new_tokens, "ignore_eos": True, "num_beams": beams}
    for i in range(requests):
        sched.add_request(TokenizedRequest(
            rid=str(i), encoder_input_ids=[rng.randrange(3, 500) for _ in range(64)],
            decoder_input_ids=[2], sampling_params=SamplingParams.from_dict(sp), group="g"))
    freeze_heap()  # (as the scheduler process does after startup: torch's objects frozen)
    kinds: dict[str, list] = collections.defaultdict(list)
    while sched.has_work:
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
    return kinds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--no-gc", action="store_true")
    a = ap.parse_args()
    if a.no_gc:
        gc.disable()
    kinds = step_kinds(a.requests, a.beams, a.rows, a.new_tokens)
    for kind, times in kinds.items():
        times = sorted(times)
        print(f"{kind:12s} {len(times):4d} steps  {sum(times):6.2f} s  "
              f"p50 {times[len(times) // 2] * 1e3:8.2f} ms  max {times[-1] * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
