"""y = x @ W.T (+ b) for a handful of rows: the decode GEMMs of a small batch.

At batch 1 a decode step is a chain of matrix-vector products whose cost is reading the
weights once; cuBLAS's small-M kernels reach well under the card's copy bandwidth on these
shapes (docs/benchmarks.md). Here each program streams BLOCK_N weight rows over K in
BLOCK_K chunks, multiplies them with every row of x (M <= MAX_M, padded to a power of two)
in float32 and writes BLOCK_N outputs per row: no tensor cores, no split-K, just enough
programs to keep the memory system busy. The block shape is autotuned per (N, K, M) on CUDA
(the first call of each shape runs outside CUDA-graph capture: the graph runner warms every
bucket up first); `F.linear` remains the reference and the CPU path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_M = 4  # rows of x this kernel takes (Linear sends it only 1: see models/linear.py)


@triton.jit
def _gemv_kernel(x, w, b, out, M, N, K, stride_xm, stride_wn, stride_om,
                 HAS_BIAS: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    rm = tl.arange(0, M_PAD)
    n_ok = rn < N
    acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        k_ok = kk < K
        wt = tl.load(w + rn[:, None] * stride_wn + kk[None, :],
                     mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        for m in tl.static_range(M_PAD):
            row = tl.minimum(m, M - 1)  # padding rows repeat the last one; never stored
            xm = tl.load(x + row * stride_xm + kk, mask=k_ok, other=0.0).to(tl.float32)
            part = tl.sum(wt * xm[None, :], axis=1)  # [BLOCK_N]
            acc += tl.where(rm[:, None] == m, part[None, :], 0.0)
    if HAS_BIAS:
        acc += tl.load(b + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out + rm[:, None] * stride_om + rn[None, :], acc.to(out.dtype.element_ty),
             mask=(rm[:, None] < M) & n_ok[None, :])


_CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=nw)
            for bn, bk, nw in [(2, 1024, 4), (4, 512, 4), (4, 1024, 4), (8, 256, 4),
                               (8, 512, 4), (8, 1024, 8), (16, 256, 4), (16, 512, 8),
                               (32, 256, 8)]]
_gemv_tuned = triton.autotune(_CONFIGS, key=["N", "K", "M_PAD"])(_gemv_kernel)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
         block_n: int | None = None, block_k: int | None = None) -> torch.Tensor:
    """x [M, K] (M <= MAX_M) times weight [N, K] transposed, plus bias [N]. Block sizes are
    autotuned unless given (the CPU tests give them: the interpreter cannot time anything)."""
    m, k = x.shape
    n = weight.shape[0]
    if m > MAX_M or weight.shape[1] != k or weight.stride(1) != 1:
        raise ValueError(f"gemv takes x [<= {MAX_M}, K] and a row-major weight [N, K]; got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    x = x.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    m_pad = triton.next_power_of_2(m)
    args = (x, weight, bias if bias is not None else weight, out, m, n, k, x.stride(0),
            weight.stride(0), out.stride(0))
    if block_n is None:
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
        _gemv_tuned[grid](*args, HAS_BIAS=bias is not None, M_PAD=m_pad)
    else:
        _gemv_kernel[(triton.cdiv(n, block_n),)](*args, HAS_BIAS=bias is not None,
                                                 M_PAD=m_pad, BLOCK_N=block_n,
                                                 BLOCK_K=block_k)
    return out
