"""Where a decode step's device time goes: the scheduler in-process (no child processes) on a
real model shape with random weights, a few decode steps under torch.profiler, kernels
sorted by total device time.

    python benchmarks/profile_decode.py --shape mt5-large --batch 128
"""

from __future__ import annotations

import argparse
import random
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

from seq2serve.runtime.bench.shapes import write_shape
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.scheduler.scheduler import Scheduler


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="mt5-large")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--graphs", action="store_true", help="profile with CUDA graphs on")
    args = ap.parse_args()
    path = str(write_shape(args.shape, tempfile.mkdtemp()))
    sargs = ServerArgs(model_path=path, device="cuda", dtype="bfloat16", load_format="dummy",
                       max_running_requests=args.batch, context_length=300,
                       disable_cuda_graph=not args.graphs)
    sched = Scheduler(sargs, ModelConfig.from_path(path), None)
    rng = random.Random(0)
    for i in range(args.batch):
        sched.add_request(TokenizedRequest(
            rid=str(i), encoder_input_ids=[rng.randrange(3, 32000) for _ in range(args.input_len)],
            decoder_input_ids=[0], sampling_params=SamplingParams(
                max_new_tokens=200, temperature=0, ignore_eos=True)))
    for _ in range(20):  # prefill and warm-up decode steps
        sched.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            sched.step()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    print(averages.table(sort_by="self_device_time_total", row_limit=22,
                         max_name_column_width=70))
    kernels = sum(e.self_device_time_total for e in averages) / 5 / 1e3
    print(f"device time per decode step: {kernels:.2f} ms at batch {args.batch}")


if __name__ == "__main__":
    main()
