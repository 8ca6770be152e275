"""The Triton GEMV (runtime/kernels/triton_gemv.py) against cuBLAS (`F.linear`) on mT5-large's decode
shapes, bf16, replayed in CUDA graphs (as decode steps are): time and achieved bandwidth.

    python benchmarks/bench_gemv.py
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench_cudagraph

from seq2serve.runtime.kernels.triton_gemv import gemv

SHAPES = {"self q/k/v": (3072, 1024), "attention out / cross q": (1024, 1024),
          "gated FFN in": (5632, 1024), "FFN out": (1024, 2816), "LM head": (250112, 1024)}


def main() -> None:
    rows = []
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.03
        for m in (1, 2, 4):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(gemv(x, w).float(), F.linear(x, w).float(),
                                       atol=3e-2, rtol=3e-2)
            nbytes = w.numel() * 2 + x.numel() * 2 + m * n * 2
            t_cublas = do_bench_cudagraph(lambda: F.linear(x, w)) * 1e3  # us
            t_gemv = do_bench_cudagraph(lambda: gemv(x, w)) * 1e3
            rows.append({"shape": name, "n": n, "k": k, "m": m, "cublas_us": t_cublas,
                         "gemv_us": t_gemv, "cublas_gbs": nbytes / t_cublas / 1e3,
                         "gemv_gbs": nbytes / t_gemv / 1e3})
            r = rows[-1]
            print(f"{name:24s} m={m}  cuBLAS {r['cublas_us']:7.1f} us {r['cublas_gbs']:6.0f} GB/s"
                  f"   gemv {r['gemv_us']:7.1f} us {r['gemv_gbs']:6.0f} GB/s", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
