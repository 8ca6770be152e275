"""Where a steady beam-search decode step spends its time: the scheduler stepped in-process
(no server, no client) over a random-weight model of a real shape, every request with the same
beams, then per-step wall times, the device's kernels (torch.profiler, CUDA only) and the
host's Python (cProfile). The probe behind the beam figures of docs/benchmarks.md.

    python benchmarks/beam_step_profile.py --shape mt5-large --requests 512 --rows 2048
    python benchmarks/beam_step_profile.py --shape t5-small --device cpu --dtype float32 \\
        --requests 64 --rows 256 --input-len 32 --output-len 32
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import tempfile
import time

from seq2serve.runtime.bench.shapes import write_shape
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.scheduler.scheduler import Scheduler


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="mt5-large")
    p.add_argument("--requests", type=int, default=512)
    p.add_argument("--rows", type=int, default=2048, help="max_running_requests (beam rows)")
    p.add_argument("--beams", type=int, default=4)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--steps", type=int, default=10, help="steady steps timed and profiled")
    args = p.parse_args()

    path = write_shape(args.shape, tempfile.mkdtemp(prefix="beam-probe-"))
    extra = {"mem_fraction": 0.6, "cuda_graph_max_bs": args.rows} if args.device == "cuda" else {}
    sargs = ServerArgs(model_path=str(path), load_format="dummy", dtype=args.dtype,
                       device=args.device, max_running_requests=args.rows,
                       context_length=args.output_len + 16, **extra)
    sched = Scheduler(sargs, ModelConfig.from_path(str(path)), load_tokenizer(str(path)))
    vocab = min(ModelConfig.from_path(str(path)).vocab_size, 30000)
    rng = random.Random(0)

    def add(n: int, tag: str) -> None:
        for i in range(n):
            sp = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": args.output_len,
                                           "ignore_eos": True, "num_beams": args.beams})
            enc = [rng.randrange(100, vocab) for _ in range(args.input_len - 1)] + [1]
            sched.add_request(TokenizedRequest(
                rid=f"{tag}{i}", encoder_input_ids=enc, decoder_input_ids=[0],
                sampling_params=sp, stream=False, encoder_key=f"{tag}{i}"))

    def steps(n: int) -> list[float]:
        out = []
        for _ in range(n):
            start = time.perf_counter()
            sched.step_items()
            out.append((time.perf_counter() - start) * 1e3)
        return out

    add(min(args.requests, 8), "warm")  # compile and capture outside the timing
    while sched.has_work:
        steps(1)
    add(args.requests, "r")
    steps(8)  # admission and the groups' first steps
    wall = steps(args.steps)
    print(f"steady steps: median {sorted(wall)[len(wall) // 2]:.2f} ms "
          f"({' '.join(f'{x:.1f}' for x in wall)})")
    if args.device == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            steps(3)
        print("device, 3 steps:")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20,
                                        max_name_column_width=70))
    host = cProfile.Profile()
    host.enable()
    steps(args.steps)
    host.disable()
    print(f"host, {args.steps} steps:")
    pstats.Stats(host).sort_stats("tottime").print_stats(25)
    print(f"host, {args.steps} steps, the runtime's functions by time inside them:")
    pstats.Stats(host).sort_stats("cumtime").print_stats("seq2serve|runtime/", 45)


if __name__ == "__main__":
    main()
