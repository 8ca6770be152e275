"""florence-2-large offline (bench offline's workload: 256 requests, a 768x768 image and 16
prompt tokens each, 3 beams, 64 tokens) on one engine, a call sent in parts of 16 prompts
(`tokenizer_manager.media_parts`) against the same call sent whole, interleaved; and when each
part reached the scheduler's link, from the call's start (where the front end, the encoder or
the decode steps hold a run).

    python3 benchmarks/florence_parts.py [--rounds 3] [--parts 16,1000000] [--threads 16,1]
    python benchmarks/florence_parts.py --model-path <a Florence-2 dir> --device cpu \
        --dtype float32 --no-compile --requests 8 --rounds 1 --parts 2,1000000

`--threads`: the engine process's torch threads (the media threads' torch ops; the scheduler
is a process of its own) tried for each part size. `--jpeg`: each image given as the bytes of
a JPEG (quality 90, as a client uploads it: the front end decodes it) instead of a decoded
PIL image. `--media-processes N`: the engine's images preprocessed in N worker processes
(`--media-processes`) instead of its media threads. Each line is printed as it is measured.
"""

from __future__ import annotations

import argparse
import io
import json
import time

import torch

import seq2serve.runtime.frontend.tokenizer_manager as tm_module
from seq2serve.runtime.bench import cli_bench
from seq2serve.runtime.bench.engine_bench import time_engine, warm_engine
from seq2serve.runtime.frontend import media_workers


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--parts", default="16,1000000")
    p.add_argument("--threads", default="")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--model-path", default=None,
                   help="a Florence-2 checkpoint instead of florence-2-large's shape")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--no-compile", action="store_true", help="the tower not compiled")
    p.add_argument("--jpeg", action="store_true", help="images as JPEG bytes (see above)")
    p.add_argument("--media-processes", type=int, default=0,
                   help="the engine's media worker processes (0: its media threads)")
    cli = p.parse_args()
    # (the workers keep no memo here: every round's images are preprocessed again, as the
    # threads' memo is cleared below)
    media_workers.WORKER_MEMO = 0
    args = argparse.Namespace(
        shape=None if cli.model_path else "florence-2-large", model_path=cli.model_path,
        num_requests=cli.requests, input_len=16, output_len=64, image_size=None,
        batch_sizes="384", num_beams=3, dtype=cli.dtype, device=cli.device,
        engine_args=json.dumps({"compile_encoder": not cli.no_compile,
                                "media_processes": cli.media_processes}), baseline=set())
    model_dir, load = cli_bench._model(args)
    _, reqs = cli_bench._requests(model_dir, args, cli.requests)
    if cli.jpeg:
        for r in reqs:
            buf = io.BytesIO()
            r.image.save(buf, format="JPEG", quality=90)
            r.image = buf.getvalue()
    threads = [int(t) for t in cli.threads.split(",") if t] or [torch.get_num_threads()]
    with cli_bench._engine(model_dir, load, args, 384) as engine:
        tm = engine.tokenizer_manager
        print(f"image processor {type(tm.image_processor.hf).__name__}, media processes "
              f"{cli.media_processes}", flush=True)
        warm_engine(engine, reqs, 3, full=(384, 64))
        sends: list[tuple[float, int]] = []
        send = tm.link.send

        def timed_send(msg, *a, **k):
            sends.append((time.perf_counter(), len(msg)))
            return send(msg, *a, **k)

        tm.link.send = timed_send
        for _ in range(cli.rounds):
            for part in [int(x) for x in cli.parts.split(",")]:
                for n in threads:
                    tm_module.MEDIA_PART = part
                    torch.set_num_threads(n)
                    tm.image_processor.memo.clear()  # (every image preprocessed again)
                    sends.clear()
                    start = time.perf_counter()
                    r = time_engine(engine, reqs, 64, 3)
                    # (the timed call's sends: time_engine then runs a greedy call of its own)
                    at = [t - start for t, _ in sends if t - start <= r["seconds"]]
                    sent = len(at)
                    at = at or [float("nan")]
                    print(f"part {part:7d} threads {n:2d}: {r['tokens_per_s']:6.0f} tok/s, "
                          f"{r['seconds']:.2f} s, {r['decode_steps']} forwards, encoder "
                          f"{r['encoder_seconds']:.2f} s, scheduler ttft p50/p99 "
                          f"{r['ttft_p50_ms']:.0f}/{r['ttft_p99_ms']:.0f} ms; {sent} "
                          f"sends from {at[0]:.3f} to {at[-1]:.3f} s", flush=True)


if __name__ == "__main__":
    main()
