"""y = x @ W.T (+ b) for 2-16 rows: the decode GEMMs of a small batch.

A decode step at batch 2-16 reads every weight once, as at batch 1, and does little more
arithmetic; its time should be batch 1's. cuBLAS's small-M kernels reach about a quarter of the
copy bandwidth on mT5-large's shapes (docs/benchmarks.md), and the one-row GEMV
(triton_gemv.py) multiplies each row on CUDA cores, so it loses from 2 rows on. Here each
program streams BLOCK_N weight rows over K in BLOCK_K chunks and multiplies them with all rows
of x at once on the tensor cores (x padded to 16 rows, the smallest MMA shape: the padding
costs no memory traffic), accumulating in float32. The block shape is autotuned per (N, K) on
CUDA (the graph runner warms every bucket before capture); `F.linear` is the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_M = 16  # rows of x this kernel takes: the MMA's row count


@triton.jit
def _skinny_kernel(x, w, w_scale, b, out, M, N, K, stride_xm, stride_wn, stride_om,
                   HAS_BIAS: tl.constexpr, HAS_WSCALE: tl.constexpr, IEEE: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, 16)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    m_ok = rm < M
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        k_ok = kk < K
        wt = tl.load(w + rn[:, None] * stride_wn + kk[None, :],
                     mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        xt = tl.load(x + rm[:, None] * stride_xm + kk[None, :],
                     mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if HAS_WSCALE:  # an 8-bit weight, widened to x's dtype (exact); scaled at the end
            wt = wt.to(tl.float32).to(x.dtype.element_ty)  # (via fp32: the interpreter's
            # int8 -> bf16 is wrong; on the GPU the compiler folds it)
        if IEEE:  # float32 models: no TF32 rounding
            acc = tl.dot(wt, tl.trans(xt), acc, input_precision="ieee")
        else:
            acc = tl.dot(wt, tl.trans(xt), acc)
    if HAS_WSCALE:
        acc *= tl.load(w_scale + rn, mask=n_ok, other=0.0)[:, None]
    if HAS_BIAS:
        acc += tl.load(b + rn, mask=n_ok, other=0.0).to(tl.float32)[:, None]
    tl.store(out + rm[None, :] * stride_om + rn[:, None], acc.to(out.dtype.element_ty),
             mask=n_ok[:, None] & m_ok[None, :])


_CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=nw, num_stages=st)
            for bn, bk, nw, st in [(16, 256, 4, 4), (16, 512, 4, 3), (32, 128, 4, 4),
                                   (32, 256, 4, 4), (32, 512, 8, 3), (64, 128, 4, 4),
                                   (64, 256, 8, 3), (128, 128, 8, 3), (128, 64, 4, 4)]]
_skinny_tuned = triton.autotune(_CONFIGS, key=["N", "K", "IEEE", "HAS_WSCALE"])(_skinny_kernel)


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                block_n: int | None = None, block_k: int | None = None,
                w_scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (M <= MAX_M) times weight [N, K] transposed, plus bias [N]. Block sizes are
    autotuned unless given (the CPU tests give them: the interpreter cannot time anything).
    With `w_scale` [N] float32 the weight is 8-bit (int8, or float8_e4m3fn on sm_89+) and
    stands for weight * w_scale[:, None] (widened to x's dtype in registers: half the bytes
    read of a 16-bit weight)."""
    m, k = x.shape if x.dim() == 2 else (0, 0)
    n = weight.shape[0]
    if x.dim() != 2 or not 0 < m <= MAX_M or weight.shape[1] != k or weight.stride(1) != 1:
        raise ValueError(f"skinny_gemm takes x [1..{MAX_M}, K] and a row-major weight [N, K]; "
                         f"got {tuple(x.shape)} and {tuple(weight.shape)}")
    x = x if x.stride(1) == 1 else x.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    args = (x, weight, weight if w_scale is None else w_scale, weight if bias is None else bias,
            out, m, n, k, x.stride(0), weight.stride(0), out.stride(0))
    meta = dict(HAS_BIAS=bias is not None, HAS_WSCALE=w_scale is not None,
                IEEE=x.dtype == torch.float32)
    if block_n is None:
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
        _skinny_tuned[grid](*args, **meta)
    else:
        _skinny_kernel[(triton.cdiv(n, block_n),)](*args, **meta, BLOCK_N=block_n,
                                                   BLOCK_K=block_k)
    return out
