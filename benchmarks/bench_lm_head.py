"""The logits GEMM of a vocabulary that is not a multiple of 8 (OPUS-MT's 58,101, NLLB's
256,206, Whisper's 51,866, Florence-2's 51,290, Pegasus's 96,103), on a GPU, three ways, each
followed by the float32 copy the sampler makes of the logits:

- plain: `F.linear(x, W)` into [rows, vocab] (the output's rows are not 16-byte aligned, and
  cuBLAS may fall back to an alignment-1 kernel: on an H200 the OPUS-MT head ran on
  `cutlass_75_tensorop_bf16_s1688`, 1.35 ms of a 4.0 ms beam step at 2,048 rows);
- padded: the weight padded with zero rows to a multiple of 64, the logits sliced back;
- transposed: `W @ x.T` (the output's leading dimension is the row count), read back as
  [rows, vocab] by the float32 copy.

A vocabulary that is a multiple of 64 (mt5-large, bart-large-cnn) is the control. Prints ms a
call and TFLOP/s, and the largest difference between their logits.

    python3 benchmarks/bench_lm_head.py --rows 512,2048
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from seq2serve.runtime.bench.shapes import SHAPES

_SHAPES = ("opus-mt", "nllb-200-distilled-600m", "whisper-large-v3", "florence-2-large",
           "pegasus-large", "bart-large-cnn", "mt5-large")


def dims(shape: str) -> tuple[int, int]:
    """(hidden size, vocabulary) of a shape."""
    cfg = SHAPES[shape]
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    d = cfg.get("d_model") or text.get("d_model") or cfg.get("hidden_size")
    return int(d), int(cfg.get("vocab_size") or text["vocab_size"])


def timed(fn, reps: int) -> float:
    """Median ms of `fn` over `reps` calls (CUDA events), after three warm-ups."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(_SHAPES))
    ap.add_argument("--rows", default="512,2048")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}: ms a call (TFLOP/s), logits GEMM + float32 copy")
    for shape in args.shapes.split(","):
        d, vocab = dims(shape)
        padded_vocab = -(-vocab // 64) * 64
        w = torch.randn(vocab, d, device="cuda", dtype=torch.bfloat16) / d ** 0.5
        w_pad = torch.zeros(padded_vocab, d, device="cuda", dtype=torch.bfloat16)
        w_pad[:vocab] = w
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, d, device="cuda", dtype=torch.bfloat16)
            ways = {
                "plain": lambda: F.linear(x, w).float(),
                "padded": lambda: F.linear(x, w_pad)[:, :vocab].float(),
                "transposed": lambda: (w @ x.t()).t().float(),
            }
            flops = 2 * rows * d * vocab
            got = {name: fn() for name, fn in ways.items()}
            diff = max((got["plain"] - v).abs().max().item() for v in got.values())
            cells = []
            for name, fn in ways.items():
                ms = timed(fn, args.reps)
                cells.append(f"{name} {ms:.3f} ({flops / ms / 1e9:.0f})")
                gemm = {"plain": lambda: F.linear(x, w),
                        "padded": lambda: F.linear(x, w_pad),
                        "transposed": lambda: w @ x.t()}[name]
                cells[-1] += f" [GEMM {timed(gemm, args.reps):.3f}]"
            print(f"{shape:24s} vocab {vocab:6d} rows {rows:5d}: " + ", ".join(cells)
                  + f"; largest difference {diff:.2e}")


if __name__ == "__main__":
    main()
