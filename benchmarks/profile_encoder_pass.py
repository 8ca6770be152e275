"""What one encoder pass costs, by its size: a served load encodes a few arrivals at a time,
the offline engine hundreds, and the twenty-ninth session's served OPUS-MT run measured ~18 ms
of device time a pass (event to event) for ~18 inputs, against ~16 ms a pass of 128 offline.
The scheduler is stepped in-process on a bench shape (random weights), requests are admitted
`--sizes` at a time, and each pass of `EncoderStage.run` is timed: the host's wall time in it,
the device's time from its first to its last event, and, under torch.profiler, the kernels it
launched (CUDA) and its top-level operators, the most frequent listed.

    python3 benchmarks/profile_encoder_pass.py --shape opus-mt --device cuda --sizes 1,18,128
    python benchmarks/profile_encoder_pass.py --shape opus-mt --sizes 1,18   (CPU: host only)
`--plain`: no profiler; the host-device syncs in a pass counted instead (their messages listed).
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import tempfile
import time
import warnings
from pathlib import Path

import torch

from seq2serve.encoders import encoder_stage
from seq2serve.runtime.bench.shapes import SHAPES, write_shape
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.scheduler.scheduler import Scheduler


def _shape_path(shape: str, tiny: bool) -> str:
    path = Path(write_shape(shape, tempfile.mkdtemp()))
    if tiny:  # (the CPU: the same layers, narrow)
        cfg = dict(SHAPES[shape], d_model=64, encoder_ffn_dim=64, decoder_ffn_dim=64,
                   encoder_attention_heads=2, decoder_attention_heads=2)
        (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="opus-mt")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", default="1,18,128", help="inputs admitted at once, a pass each")
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="passes of each size (the first "
                    "of all is a warm-up)")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--table", type=int, default=0, help="each profiled pass's N operators "
                    "and kernels of most self time (torch.profiler's table)")
    ap.add_argument("--plain", action="store_true", help="no profiler (its overhead per "
                    "operator inflates the host time); count the host-device syncs instead")
    a = ap.parse_args()
    cuda = a.device.startswith("cuda")
    path = _shape_path(a.shape, tiny=not cuda)
    config = ModelConfig.from_path(path)
    sched = Scheduler(ServerArgs(model_path=path, device=a.device,
                                 dtype="bfloat16" if cuda else "float32", load_format="dummy",
                                 max_running_requests=1024, context_length=256),
                      config, None)
    rng = random.Random(0)
    passes: list[dict] = []
    run = encoder_stage.EncoderStage.run

    def timed(self, jobs):
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        if cuda:
            torch.cuda.synchronize()
            first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                enable_timing=True)
            first.record()
        start = time.perf_counter()
        if a.plain:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if cuda:
                    torch.cuda.set_sync_debug_mode("warn")
                run(self, jobs)
                host = time.perf_counter() - start
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
                    last.record()
                    torch.cuda.synchronize()
            syncs = [str(w.message).split("\n")[0][:80] for w in caught
                     if "synchroniz" in str(w.message)]
            passes.append({"inputs": len(jobs), "host_ms": host * 1e3,
                           "device_ms": first.elapsed_time(last) if cuda else None,
                           "syncs": len(syncs),
                           "most": collections.Counter(syncs).most_common(a.top)})
            return
        with profile(activities=activities) as prof:
            run(self, jobs)
            host = time.perf_counter() - start
            if cuda:
                last.record()
                torch.cuda.synchronize()
        events = prof.events()
        if a.table:
            print(f"-- a pass of {len(jobs)} inputs: host {host * 1e3:.2f} ms")
            key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
            for sort in ("self_cpu_time_total", key)[: 1 + cuda]:
                print(prof.key_averages().table(sort_by=sort, row_limit=a.table))
        top = [e for e in events if e.name.startswith("aten::")
               and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
        kernels = [e for e in events if getattr(e, "device_type", None) is not None
                   and str(e.device_type).endswith("CUDA") and not e.name.startswith("aten::")]
        passes.append({"inputs": len(jobs), "host_ms": host * 1e3,
                       "device_ms": first.elapsed_time(last) if cuda else None,
                       "kernels": len(kernels), "top_ops": len(top),
                       "most": collections.Counter(e.name for e in top).most_common(a.top)})

    encoder_stage.EncoderStage.run = timed
    vocab = config.vocab_size
    start = SHAPES[a.shape].get("decoder_start_token_id") or 0  # (a one-token decoder prompt)
    n = 0
    sizes = [int(s) for s in a.sizes.split(",")]
    for size in [sizes[0]] + [s for s in sizes for _ in range(a.repeats)]:
        sp = SamplingParams.from_dict({"max_new_tokens": 1, "ignore_eos": True})
        for _ in range(size):
            sched.add_request(TokenizedRequest(
                rid=str(n), encoder_input_ids=[rng.randrange(3, vocab - 1)
                                               for _ in range(a.input_len)],
                decoder_input_ids=[start], sampling_params=sp))
            n += 1
        while sched.has_work:
            sched.step()
    encoder_stage.EncoderStage.run = run
    print(f"{a.shape} on {a.device}, {a.input_len} tokens an input; the first pass a warm-up")
    for p in passes[1:]:
        device = f"{p['device_ms']:7.2f} ms" if p["device_ms"] is not None else "      -"
        if a.plain:
            print(f"pass of {p['inputs']:4d} inputs: host {p['host_ms']:7.2f} ms, device "
                  f"{device} (first to last event), {p['syncs']} syncs: {p['most']}")
            continue
        print(f"pass of {p['inputs']:4d} inputs: host {p['host_ms']:7.2f} ms, device {device} "
              f"(first to last event), {p['kernels']:4d} kernels, {p['top_ops']:4d} top-level "
              f"ops; most: {p['most'][:6]}")


if __name__ == "__main__":
    main()
