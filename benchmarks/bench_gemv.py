"""The Triton GEMV (runtime/kernels/triton_gemv.py, 1-4 rows) and skinny GEMM (triton_skinny.py,
2-16 rows) against cuBLAS (`F.linear`) on mT5-large's decode shapes, bf16, replayed in CUDA
graphs (as decode steps are): time and achieved bandwidth.

    python benchmarks/bench_gemv.py
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench_cudagraph

from seq2serve.runtime.kernels.triton_gemv import MAX_M, gemv
from seq2serve.runtime.kernels.triton_skinny import skinny_gemm

SHAPES = {"self q/k/v": (3072, 1024), "attention out / cross q": (1024, 1024),
          "gated FFN in": (5632, 1024), "FFN out": (1024, 2816), "LM head": (250112, 1024)}


def main() -> None:
    rows = []
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.03
        for m in (1, 2, 4, 8, 16):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x, w).float()
            nbytes = w.numel() * 2 + x.numel() * 2 + m * n * 2
            row = {"shape": name, "n": n, "k": k, "m": m,
                   "cublas_us": do_bench_cudagraph(lambda: F.linear(x, w)) * 1e3}
            kernels = {"gemv": gemv} if m <= MAX_M else {}
            if m >= 2:
                kernels["skinny"] = skinny_gemm
            for kname, fn in kernels.items():
                torch.testing.assert_close(fn(x, w).float(), ref, atol=3e-2, rtol=3e-2)
                row[f"{kname}_us"] = do_bench_cudagraph(lambda: fn(x, w)) * 1e3
            line = f"{name:24s} m={m:2d}"
            for kname in ("cublas", "gemv", "skinny"):
                if f"{kname}_us" in row:
                    row[f"{kname}_gbs"] = nbytes / row[f"{kname}_us"] / 1e3
                    line += f"   {kname} {row[f'{kname}_us']:7.1f} us {row[f'{kname}_gbs']:5.0f} GB/s"
            rows.append(row)
            print(line, flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
