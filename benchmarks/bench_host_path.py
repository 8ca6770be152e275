"""The scheduler's host time per decode step, without a model: a fake executor (tests/
fake_executor.py) answers instantly, so what is left of each step is the host's own work
(building the batch, allocating pages, processing outputs, stop checks, messages). On a GPU
this is the time the host must hide behind the device's step (issue 20).

    python benchmarks/bench_host_path.py [--batch-sizes 1,8,64,128,256] [--steps 200]
"""

from __future__ import annotations

import argparse
import time

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.scheduler.scheduler import Scheduler
from seq2serve.runtime.tools.demo_checkpoint import default_demo_path
from seq2serve.tests.fake_executor import FakeExecutor
from seq2serve.tests.helpers import request


def measure(batch: int, steps: int, stream: bool) -> dict:
    config = ModelConfig.from_path(str(default_demo_path()))
    args = ServerArgs(model_path=config.model_path, device="cpu", max_running_requests=batch)
    fake = FakeExecutor(args, config, kv_tokens=batch * (steps + 64) * 2,
                        cross_tokens=batch * 64, context_len=steps + 64)
    sched = Scheduler(args, config, None, fake)
    for i in range(batch):
        tr = request(f"r{i}", [5 + i % 50, 6, 7, 8], max_new_tokens=steps + 8, ignore_eos=True)
        tr.stream = stream
        sched.add_request(tr)
    while sched.forwards.get("decode", 0) < 5:  # admission, prefill, the first decodes
        sched.step()
    in_fake, start, first = fake.seconds, time.perf_counter(), sched.forwards["decode"]
    while sched.forwards["decode"] - first < steps:
        sched.step()
    n = sched.forwards["decode"] - first
    total = time.perf_counter() - start
    in_fake = fake.seconds - in_fake
    return {"batch": batch, "steps": n, "host_ms_per_step": 1e3 * (total - in_fake) / n,
            "fake_ms_per_step": 1e3 * in_fake / n}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", default="1,8,64,128,256")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--no-stream", action="store_true", help="outputs only when a request ends")
    a = p.parse_args()
    for bs in map(int, a.batch_sizes.split(",")):
        r = measure(bs, a.steps, not a.no_stream)
        print(f"batch {r['batch']:4d}: host {r['host_ms_per_step']:.3f} ms/step "
              f"({1e3 * r['host_ms_per_step'] / r['batch']:.1f} us/request; the fake executor "
              f"{r['fake_ms_per_step']:.3f} ms/step, not counted)")


if __name__ == "__main__":
    main()
