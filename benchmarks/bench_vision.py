"""Mllama-11B's vision tower on fresh 4-tile images against the card's measured bf16 matmul
peak, with each of PyTorch's attention kernels first (cuDNN's, as SEQ2SERVE_VISION_CUDNN=1
runs it: one call per image) (random weights, bf16, CUDA).

    python benchmarks/bench_vision.py [--images 64 --batch 16]

The FLOPs counted are the tower's matmuls and attention (QK^T and PV over every query and key
of the padded layout, as the tower computes them); the peak is the best of a few large square
bf16 `torch.mm`s timed in the same run.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.nn.attention import SDPBackend
from triton.testing import do_bench

from seq2serve.models.mllama import vision
from seq2serve.models.mllama.config import MllamaVisionConfig
from seq2serve.runtime.bench.hardware import matmul_peak_tflops
from seq2serve.runtime.bench.shapes import SHAPES


def tower_flops(cfg: MllamaVisionConfig, images: int, tiles: int) -> float:
    patches = cfg.num_patches
    padded = patches + (8 - patches % 8) % 8
    t = tiles * padded  # tokens per image, as the tower lays them out
    d, ff = cfg.hidden_size, cfg.intermediate_size
    layers = cfg.num_hidden_layers + cfg.num_global_layers
    linear = 2 * t * (4 * d * d + 2 * d * ff)
    attention = 4 * t * t * d
    patch_embed = 2 * tiles * (patches - 1) * cfg.num_channels * cfg.patch_size**2 * d
    return images * (layers * (linear + attention) + patch_embed)


def build_tower(cfg: MllamaVisionConfig) -> vision.MllamaVisionModel:
    with torch.device("cuda"):
        model = vision.MllamaVisionModel(cfg).to(torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, p in model.named_parameters():
        if "gate" in name:
            p.data.fill_(0.5)
        elif "norm" in name:
            p.data.fill_(1.0) if name.endswith("weight") else p.data.zero_()
        else:
            p.data.normal_(0, 0.02, generator=g)
    return model.eval()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16, help="images per tower call")
    args = ap.parse_args()
    cfg = MllamaVisionConfig.from_hf(SHAPES["mllama-11b"]["vision_config"])
    tiles = cfg.max_num_tiles
    model = build_tower(cfg)
    pixels = torch.randn(args.batch, tiles, cfg.num_channels, cfg.image_size, cfg.image_size,
                         device="cuda", dtype=torch.bfloat16)
    ratio_ids = torch.full((args.batch,), 6, device="cuda")  # 2 x 2 tiles
    calls = args.images // args.batch
    peak = matmul_peak_tflops((4096, 8192, 16384))
    flops = tower_flops(cfg, calls * args.batch, tiles)
    result = {"images": calls * args.batch, "batch": args.batch, "tiles": tiles,
              "tflop": flops / 1e12, "matmul_peak_tflops": peak, "orders": {}}
    print(f"bf16 matmul peak {peak:.0f} TFLOP/s; {result['images']} images x {tiles} tiles: "
          f"{flops / 1e12:.0f} TFLOP", flush=True)
    flash = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    orders = {"cudnn first, per image (SEQ2SERVE_VISION_CUDNN=1)":
              [SDPBackend.CUDNN_ATTENTION] + flash,
              "flash first (default)": flash,
              "efficient first": [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]}
    default = list(vision.VISION_SDPA_BACKENDS)
    patches = cfg.num_patches + (8 - cfg.num_patches % 8) % 8
    heads = cfg.attention_heads
    q = torch.randn(args.batch, heads, tiles * patches, cfg.hidden_size // heads,
                    device="cuda", dtype=torch.bfloat16)

    def attention(q, k, v):
        with torch.nn.attention.sdpa_kernel(vision.VISION_SDPA_BACKENDS, set_priority=True):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)
    with torch.inference_mode():
        for name, order in orders.items():
            vision.VISION_SDPA_BACKENDS[:] = order
            vision.VISION_CUDNN = order[0] == SDPBackend.CUDNN_ATTENTION
            run = lambda: [model(pixels, ratio_ids, [tiles] * args.batch)  # noqa: E731
                           for _ in range(calls)]
            cold = _time(lambda: model(pixels[:3], ratio_ids[:3], [tiles] * 3), repeats=1)
            run()
            torch.cuda.synchronize()
            ms = _time(run)
            tflops = flops / ms / 1e9
            attn_ms = do_bench(lambda: attention(q, q, q), warmup=5, rep=50)
            attn_tflops = 4 * q.shape[0] * q.shape[2] ** 2 * cfg.hidden_size / attn_ms / 1e9
            result["orders"][name] = {"seconds": ms / 1e3, "tflops": tflops,
                                      "share_of_peak": tflops / peak,
                                      "attention_alone_tflops": attn_tflops,
                                      "first_call_ms_3_images": cold}
            print(f"{name:52s} {ms / 1e3:6.2f} s  {ms / result['images']:6.1f} ms/image  "
                  f"{tflops:5.0f} TFLOP/s  {100 * tflops / peak:4.1f} % of the matmul peak; "
                  f"one layer's attention alone {attn_tflops:4.0f} TFLOP/s; first call of 3 images "
                  f"{cold:.0f} ms",
                  flush=True)
    vision.VISION_SDPA_BACKENDS[:] = default
    vision.VISION_CUDNN = default[0] == SDPBackend.CUDNN_ATTENTION
    print(json.dumps(result))


def _time(fn, repeats: int = 3) -> float:
    """Best of `repeats` wall times of fn() in ms, the device synchronized around each."""
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


if __name__ == "__main__":
    main()
