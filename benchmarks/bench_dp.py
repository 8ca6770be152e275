"""Serving throughput with one replica against `--dp-size N`, same model, same load, one run.

GPU (two GPUs, mT5-large shape, random weights, bf16):
    CUDA_VISIBLE_DEVICES=0,1 python benchmarks/bench_dp.py --shape mt5-large --dp 1,2
CPU (the bundled demo model, a quick check that it runs):
    python benchmarks/bench_dp.py --device cpu --num-requests 64 --output-len 16

For each dp size it starts `seq2serve serve` on a free port, runs the streaming load of
`seq2serve bench serving` (throughput, TTFT, ITL), then sends a set of sources twice and
reports the second round's encoder-cache hits and whether each went to the same replica;
it prints one JSON object with each run and the throughput ratio to the first.

On a CPU the ratio says little: each of N replicas runs cores/N threads, and one replica
with every core can be far slower on a busy host (OpenMP threads waiting on each other; on
the shared 2-core CI host one replica gave 43 tok/s, and 697 with OMP_NUM_THREADS=1).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from seq2serve.runtime.bench.serving import measure


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(model: str, dp: int, extra: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "seq2serve.runtime.cli", "serve", "--model-path", model,
           "--port", str(port), "--dp-size", str(dp), *extra]
    with open(log, "w") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dp {dp}: the server exited:\n{log.read_text()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError(f"dp {dp}: no /health:\n{log.read_text()}")


def _repeats(url: str, n: int, input_len: int) -> dict:
    sources = [" ".join(f"w{i}x{j}" for j in range(input_len)) for i in range(n)]

    def round_() -> list[dict]:
        out = []
        for s in sources:
            r = httpx.post(url + "/generate", timeout=600, json={
                "text": s, "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
            r.raise_for_status()
            out.append(r.json()["meta_info"])
        return out

    first, again = round_(), round_()
    return {"sources": n, "hits_second_round": sum(m["encoder_cache_hit"] for m in again),
            "same_replica": sum(a.get("replica") == b.get("replica")
                                for a, b in zip(first, again))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default=None, help="a real shape with random weights "
                    "(mt5-large, nllb-200-distilled-600m, llama-3.2-1b, ...)")
    ap.add_argument("--model-path", default=None, help="or a model directory")
    ap.add_argument("--dp", default="1,2", help="comma-separated dp sizes to compare")
    ap.add_argument("--device", default=None)
    ap.add_argument("--num-requests", type=int, default=1024)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    extra = ["--device", args.device] if args.device else []
    model = args.model_path
    if args.shape:
        from seq2serve.runtime.bench.shapes import write_shape

        model = str(write_shape(args.shape, tempfile.mkdtemp()))
        extra += ["--load-format", "dummy", "--dtype", "bfloat16"]
    if model is None:
        from seq2serve.runtime.tools.demo_checkpoint import default_demo_path

        model = str(default_demo_path())
    runs = []
    for dp in [int(x) for x in args.dp.split(",")]:
        log = Path(tempfile.gettempdir()) / f"bench-dp{dp}-{os.getpid()}.log"
        proc, url = _serve(model, dp, extra, log)
        try:
            # warm-up (compilation, CUDA graphs on every replica), then the measured load
            measure(url, 4 * dp, args.input_len, 8, 4 * dp, None)
            load = measure(url, args.num_requests, args.input_len, args.output_len,
                           args.concurrency, None)
            repeats = _repeats(url, 16, args.input_len)
            stats = httpx.get(url + "/debug/stats", timeout=60).json()
        finally:
            proc.terminate()
            proc.wait(60)
        startup = [line for line in log.read_text().splitlines() if "serving" in line]
        runs.append({"dp_size": dp, "startup": startup[:1], "load": load, "repeats": repeats,
                     "layout": stats.get("layout"), "router": stats.get("router")})
        print(f"dp {dp}: {load['output_tokens_per_s']:.0f} tok/s, {load['completed']}/"
              f"{load['requests']} completed; repeats: {repeats}", file=sys.stderr)
    base = runs[0]["load"]["output_tokens_per_s"]
    result = {"model": args.shape or model, "runs": runs,
              "throughput_ratio": [r["load"]["output_tokens_per_s"] / base for r in runs]}
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
