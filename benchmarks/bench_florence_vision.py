"""Florence-2-large's DaViT tower on 768x768 images: seq2serve's (`models/florence2/vision.py`)
and HF's `Florence2VisionBackbone` with the same random weights, bf16 on CUDA, at several
images per call, against the card's measured bf16 matmul peak; then the CUDA kernels of
seq2serve's tower at the largest batch, heaviest first (torch.profiler).

    python3 benchmarks/bench_florence_vision.py [--batches 1,8,32 --images 64 --json out]

The FLOPs counted are the tower's matmuls (q/k/v, output, MLP), its attention (window
attention over the padded windows, channel attention over every token), the depthwise and
patch convolutions (issue 44: the florence-2-large shape's encoder took 2.7 s of the 4.2 s
that 128 requests took on an H200, ~80 TFLOP/s).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

from seq2serve.models.florence2.config import Florence2VisionConfig
from seq2serve.models.florence2.vision import DaViT
from seq2serve.models.loader import ops_for
from seq2serve.models.ops import use_ops
from seq2serve.runtime.bench.hardware import matmul_peak_tflops
from seq2serve.runtime.bench.shapes import SHAPES, write_shape

SIZE = 768


def tower_flops(cfg: Florence2VisionConfig, size: int = SIZE) -> float:
    """One image's FLOPs through the tower."""
    h = w = size
    channels, total = cfg.in_channels, 0.0
    for i, (kernel, stride, padding) in enumerate(cfg.stages):
        h = (h + 2 * padding - kernel) // stride + 1
        w = (w + 2 * padding - kernel) // stride + 1
        d, n, s = cfg.embed_dim[i], h * w, cfg.window_size
        padded = -(-h // s) * s * -(-w // s) * s
        ff = int(d * cfg.mlp_ratio)
        linear = 2 * n * (4 * d * d + 2 * d * ff)  # per mixing block
        window = 4 * padded * s * s * d
        channel = 4 * n * d * (d // cfg.num_groups[i])
        depthwise = 2 * 2 * n * d * 9
        block = 2 * linear + window + channel + 2 * depthwise
        total += 2 * n * d * channels * kernel * kernel + cfg.depths[i] * block
        channels = d
    return total


def towers(cfg: Florence2VisionConfig):
    """(seq2serve's tower, HF's), one set of random weights, bf16 on CUDA."""
    from transformers import AutoConfig
    from transformers.models.florence2.modeling_florence2 import Florence2VisionBackbone

    path = write_shape("florence-2-large", tempfile.mkdtemp())
    with torch.device("cuda"):
        hf = Florence2VisionBackbone(AutoConfig.from_pretrained(path).vision_config)
        ours = DaViT(cfg)
    hf = hf.to(torch.bfloat16).eval()
    ours = ours.to(torch.bfloat16).eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    ops = ops_for("cuda", torch.bfloat16)
    use_ops(ours, ops)
    return ours, hf


def _ms_per_image(fn, pixels: torch.Tensor, calls: int) -> float:
    fn(pixels)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn(pixels)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (calls * pixels.shape[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--images", type=int, default=64, help="images timed per batch size")
    ap.add_argument("--json")
    ap.add_argument("--compile", action="store_true",
                    help="also time seq2serve's tower under torch.compile (one graph a batch size)")
    ap.add_argument("--dynamic", action="store_true",
                    help="also time it under torch.compile with the batch dimension dynamic "
                         "(one graph for every batch size)")
    args = ap.parse_args()
    cfg = Florence2VisionConfig.from_hf(SHAPES["florence-2-large"]["vision_config"])
    ours, hf = towers(cfg)
    variants = [("seq2serve", ours), ("hf", hf)]
    if args.compile:
        variants.append(("compiled", torch.compile(ours, dynamic=False)))
    if args.dynamic:
        dynamic = torch.compile(ours, dynamic=False)

        def any_batch(pixels: torch.Tensor) -> torch.Tensor:
            torch._dynamo.mark_dynamic(pixels, 0)
            return dynamic(pixels)

        variants.append(("dynamic", any_batch))
    peak, flops = matmul_peak_tflops(), tower_flops(cfg)
    print(f"bf16 matmul peak {peak:.0f} TFLOP/s; {flops / 1e12:.2f} TFLOP an image", flush=True)
    result = {"matmul_peak_tflops": peak, "tflop_per_image": flops / 1e12, "runs": []}
    batches = [int(b) for b in args.batches.split(",")]
    with torch.inference_mode():
        for b in batches:
            pixels = torch.randn(b, 3, SIZE, SIZE, device="cuda", dtype=torch.bfloat16)
            calls = max(1, args.images // b)
            for name, model in variants:
                start = time.perf_counter()
                model(pixels)  # (a compiled tower compiles here)
                torch.cuda.synchronize()
                first = time.perf_counter() - start
                ms = _ms_per_image(model, pixels, calls)
                tflops = flops / ms / 1e9
                result["runs"].append({"tower": name, "batch": b, "ms_per_image": ms,
                                       "tflops": tflops, "share_of_peak": tflops / peak,
                                       "first_call_s": first})
                print(f"{name:9s} batch {b:3d}: {ms:6.2f} ms an image, {tflops:5.0f} TFLOP/s, "
                      f"{100 * tflops / peak:4.1f} % of the matmul peak (first call "
                      f"{first:.1f} s)", flush=True)
        pixels = torch.randn(batches[-1], 3, SIZE, SIZE, device="cuda", dtype=torch.bfloat16)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            ours(pixels)
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
