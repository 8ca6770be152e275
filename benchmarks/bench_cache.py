"""Time to first token for a repeated encoder input (cached) vs a fresh one (encoder runs).

GPU (Llama-3.2-11B-Vision shape, random weights, bf16, one 4-tile image):
    python benchmarks/bench_cache.py --shape mllama-11b
CPU (tiny random Mllama):
    python benchmarks/bench_cache.py
Each trial uses a new image (fresh: encoder + projections + prefill) and then the same image
again (cached: prefill only); medians over the trials are reported with their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import numpy as np
from PIL import Image

from seq2serve import Seq2SeqEngine


def _image(seed: int, height: int, width: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((height, width, 3)) * 255).astype("uint8"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default=None, help="a real shape (mllama-11b) with random weights")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    if args.shape:
        from seq2serve.runtime.bench.shapes import write_shape

        path = write_shape(args.shape, tmp)
        kwargs = dict(load_format="dummy", dtype="bfloat16", max_running_requests=8,
                      context_length=4096)
        size = 1120  # 2x2 tiles of 560: the 4-tile case
    else:
        from seq2serve.runtime.tools.demo_checkpoint import write_mllama_checkpoint

        path = write_mllama_checkpoint(tmp, vision={"image_size": 56, "num_hidden_layers": 4})
        kwargs, size = {}, 112
    sp = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}
    words = " ".join(["word"] * (args.prompt_tokens - 3))
    with Seq2SeqEngine(model_path=str(path), device=args.device, **kwargs) as engine:
        info = engine.info
        for _ in range(2):  # warm-up of both paths (compilation, allocator): fresh, then hit
            engine.generate(prompt="<|image|>" + words, image_data=[_image(0, size, size)],
                            sampling_params=sp)
        fresh, cached, metas = [], [], {"fresh": [], "cached": []}
        for t in range(args.trials):
            img = _image(t + 1, size, size)
            for bucket, name in ((fresh, "fresh"), (cached, "cached")):
                start = time.perf_counter()
                out = engine.generate(prompt="<|image|>" + words, image_data=[img],
                                      sampling_params=sp)
                bucket.append(time.perf_counter() - start)
                m = out["meta_info"]
                assert m["encoder_cache_hit"] == (bucket is cached)
                metas[name].append({k: m.get(k) for k in (
                    "ttft", "scheduler_ttft", "e2e_latency", "cached_tokens", "prompt_tokens")})
        print(json.dumps(metas, indent=1))
    res = {"shape": args.shape or "tiny-mllama", "device": info["device"],
           "dtype": info["dtype"], "ttft_fresh_ms": statistics.median(fresh) * 1e3,
           "ttft_cached_ms": statistics.median(cached) * 1e3}
    res["speedup"] = res["ttft_fresh_ms"] / res["ttft_cached_ms"]
    for name in ("fresh", "cached"):  # the scheduler's part: admission to first token
        res[f"scheduler_ttft_{name}_ms"] = statistics.median(
            m["scheduler_ttft"] for m in metas[name]) * 1e3
    print(json.dumps(res, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
