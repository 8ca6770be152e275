"""Time to first token served from the host tier (`--host-cache-gb`) vs recomputed.

1. Llama: a 2,000-token system prompt + a short question, TTFT when the prompt is
   recomputed, hit on the device, and hit on the host tier (evicted there by other prompts
   first, then copied back);
2. Mllama: a 4-tile image, TTFT when the vision tower runs, when its cross K/V are on the
   device, and when they come back from the host tier (evicted by other images first; the
   warm tier of hidden states is off so the host tier is what serves).

GPU (random weights of the real shapes, bf16), one command:
    python benchmarks/bench_host_tier.py --llama-shape llama-3.1-8b --mllama-shape mllama-11b
CPU (tiny random checkpoints, a smoke run):
    python benchmarks/bench_host_tier.py
Medians over --trials; each trial uses a new prompt / image. Every host hit is checked (the
cached tokens or the encoder hit, and the host-tier load counters).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time

import numpy as np
from PIL import Image

from seq2serve import Seq2SeqEngine

SP = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}


def _ttft(engine: Seq2SeqEngine, **kwargs) -> tuple[float, dict]:
    start = time.perf_counter()
    out = engine.generate(sampling_params=SP, **kwargs)
    return time.perf_counter() - start, out["meta_info"]


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 100000) for _ in range(n)]


def bench_llama(shape: str | None, trials: int, prompt_tokens: int, device: str | None) -> dict:
    tmp = tempfile.mkdtemp()
    if shape:
        from seq2serve.runtime.bench.shapes import write_shape

        path = write_shape(shape, tmp)
        kw = {"load_format": "dummy", "dtype": "bfloat16", "context_length": 8192}
    else:
        from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint

        path = write_llama_checkpoint(tmp)
        kw = {}
    pool = 4 * prompt_tokens  # four others do not fit beside the system prompt
    rng = random.Random(0)
    with Seq2SeqEngine(model_path=str(path), device=device, max_total_tokens=pool,
                       host_cache_gb=4.0, page_size=16, **kw) as engine:
        info = engine.info
        times: dict[str, list[float]] = {"recomputed": [], "device": [], "host": []}
        for t in range(trials + 1):  # the first is a warm-up
            system = _ids(rng, prompt_tokens)
            row = {}
            row["recomputed"], m = _ttft(engine, input_ids=system + _ids(rng, 16))
            assert m["cached_tokens"] == 0
            row["device"], m = _ttft(engine, input_ids=system + _ids(rng, 16))
            assert m["cached_tokens"] >= prompt_tokens // 16 * 16
            loaded = engine.stats()["radix_host_loaded_tokens"]
            for _ in range(4):  # other prompts push the system prompt to the host tier
                engine.generate(input_ids=_ids(rng, prompt_tokens), sampling_params=SP)
            row["host"], m = _ttft(engine, input_ids=system + _ids(rng, 16))
            stats = engine.stats()
            assert m["cached_tokens"] >= prompt_tokens // 16 * 16, m
            assert stats["radix_host_loaded_tokens"] - loaded >= prompt_tokens // 16 * 16, stats
            if t:
                for k, v in row.items():
                    times[k].append(v)
        engine.check_integrity()  # (raises if a page leaked)
    res = {"model": shape or "tiny-llama", "device": info["device"], "dtype": info["dtype"],
           "prompt_tokens": prompt_tokens}
    res.update({f"ttft_{k}_ms": statistics.median(v) * 1e3 for k, v in times.items()})
    res["host_vs_recomputed"] = res["ttft_recomputed_ms"] / res["ttft_host_ms"]
    return res


def _image(seed: int, size: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((size, size, 3)) * 255).astype("uint8"))


def bench_mllama(shape: str | None, trials: int, device: str | None) -> dict:
    tmp = tempfile.mkdtemp()
    if shape:
        from seq2serve.runtime.bench.shapes import write_shape

        path = write_shape(shape, tmp)
        kw = {"load_format": "dummy", "dtype": "bfloat16", "context_length": 4096,
              "max_total_tokens": 8192}
        size, tokens = 1120, 4 * 1601  # 2x2 tiles of 560: the 4-tile case
    else:
        from seq2serve.runtime.tools.demo_checkpoint import write_mllama_checkpoint

        path = write_mllama_checkpoint(tmp, vision={"image_size": 56, "num_hidden_layers": 4})
        kw, size, tokens = {}, 112, 4 * 17
    prompt = "<|image|>Describe the picture."  # the cross pool holds two images, not three
    with Seq2SeqEngine(model_path=str(path), device=device, max_cross_tokens=2 * tokens + 64,
                       encoder_hidden_cache_mb=0, host_cache_gb=4.0, max_images_per_request=1,
                       **kw) as engine:
        info = engine.info
        times: dict[str, list[float]] = {"vision_tower": [], "device": [], "host": []}
        for t in range(trials + 1):  # the first is a warm-up
            img, row = _image(1000 + t, size), {}
            row["vision_tower"], m = _ttft(engine, prompt=prompt, image_data=[img])
            assert not m["encoder_cache_hit"]
            row["device"], m = _ttft(engine, prompt=prompt, image_data=[img])
            assert m["encoder_cache_hit"]
            hits = engine.stats()["encoder_cache_host_hits"]
            for k in range(2):  # other images push this one's cross K/V to the host tier
                engine.generate(prompt=prompt, image_data=[_image(5000 + 10 * t + k, size)],
                                sampling_params=SP)
            row["host"], m = _ttft(engine, prompt=prompt, image_data=[img])
            assert m["encoder_cache_hit"] and engine.stats()["encoder_cache_host_hits"] == hits + 1
            if t:
                for k, v in row.items():
                    times[k].append(v)
        engine.check_integrity()  # (raises if a page leaked)
    res = {"model": shape or "tiny-mllama", "device": info["device"], "dtype": info["dtype"],
           "image_tiles": 4}
    res.update({f"ttft_{k}_ms": statistics.median(v) * 1e3 for k, v in times.items()})
    res["host_vs_vision_tower"] = res["ttft_vision_tower_ms"] / res["ttft_host_ms"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-shape", default=None, help="e.g. llama-3.1-8b (random weights)")
    ap.add_argument("--mllama-shape", default=None, help="e.g. mllama-11b (random weights)")
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    res = {"llama": bench_llama(args.llama_shape, args.trials, args.prompt_tokens, args.device),
           "mllama": bench_mllama(args.mllama_shape, args.trials, args.device)}
    print(json.dumps(res, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
