"""Per-step wall times of a scheduler (Llama-3.2-1B shape, random bf16 weights, CUDA) with 128
decoding rows, before and after admissions of several sizes: what one admission costs every
running stream (issue 38's Llama ITL tail; docs/benchmarks.md, 2026-11-26 tenth session).

    source benchmarks/gpu_setup.sh
    python3 benchmarks/admission_probe.py [server_arg=value ...]   # e.g. chunked_prefill_size=256
"""

from __future__ import annotations

import random
import statistics
import sys
import time

from seq2serve.runtime.bench.shapes import write_shape
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.scheduler.scheduler import Scheduler

ADMISSIONS = [(1, 32), (1, 32), (8, 32), (32, 32), (1, 1000), (1, 1000), (4, 1000)]


def main(argv: list[str]) -> None:
    path = write_shape("llama-3.2-1b", "/tmp/shape-llama")
    extra = {k: int(v) for k, v in (a.split("=") for a in argv)}
    args = ServerArgs(model_path=str(path), load_format="dummy", dtype="bfloat16",
                      device="cuda", mem_fraction=0.45, max_running_requests=256, **extra)
    sched = Scheduler(args, ModelConfig.from_path(str(path)), load_tokenizer(str(path)))
    rng = random.Random(0)
    count = 0

    def add(k: int, prompt_len: int) -> None:
        nonlocal count
        for _ in range(k):
            sp = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": 4000,
                                           "ignore_eos": True})
            ids = [rng.randrange(1000, 100000) for _ in range(prompt_len)]
            sched.add_request(TokenizedRequest(rid=f"r{count}", encoder_input_ids=[],
                                               decoder_input_ids=ids, sampling_params=sp,
                                               stream=True))
            count += 1

    def steps(k: int) -> list[float]:
        out = []
        for _ in range(k):
            t = time.perf_counter()
            sched.step_items()
            out.append((time.perf_counter() - t) * 1e3)
        return out

    add(128, 32)
    steps(30)
    base = steps(40)
    print(f"steady 128 rows: median {statistics.median(base):.2f} ms, max {max(base):.2f}")
    for k, prompt_len in ADMISSIONS:
        add(k, prompt_len)
        print(f"+{k} x {prompt_len} tokens: steps "
              + " ".join(f"{x:.1f}" for x in steps(6)))
        steps(10)
    st = sched.stats()
    print({k: st[k] for k in ("forwards_by_mode", "device_busy_seconds", "host_wait_seconds")})


if __name__ == "__main__":
    main(sys.argv[1:])
