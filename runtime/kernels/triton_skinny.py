"""y = x @ W.T (+ b) for 2-16 rows: the decode GEMMs of a small batch.

A decode step at batch 2-16 reads every weight once, as at batch 1, and does little more
arithmetic; its time should be batch 1's. cuBLAS's small-M kernels reach about a quarter of the
copy bandwidth on mT5-large's shapes (docs/benchmarks.md), and the one-row GEMV
(triton_gemv.py) multiplies each row on CUDA cores, so it loses from 2 rows on. Here each
program streams BLOCK_N weight rows over K in BLOCK_K chunks and multiplies them with all rows
of x at once on the tensor cores (x padded to 16 rows, the smallest MMA shape: the padding
costs no memory traffic), accumulating in float32. The block shape is autotuned per (N, K) on
CUDA (the graph runner warms every bucket before capture); `F.linear` is the reference.

As the GEMV does, it folds the op before it into its prologue (`norm_skinny`: the RMS norm with
the residual add; `gated_skinny`: the gated activation), rounding as the GEMV and the separate
kernels do (the norm's sum of squares is taken over K in chunks, all rows at once: the
whole-row sums the GEMV makes, row by row, cost more than the GEMM at 16 rows): at batch 2-16
those small kernels' launches cost as much as the GEMM's own work.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from seq2serve.runtime.kernels.triton_gemv import GATED, NORM, PLAIN, prepare
from seq2serve.runtime.kernels.triton_ops import gated, rms_scaled

MAX_M = 16  # rows of x this kernel takes: the MMA's row count


@triton.jit
def _x_chunk(x, res, norm_w, inverses, rm, m_ok, kk, k_ok, K, stride_xm,
             PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr):
    """Rows [16, BLOCK_K] of the GEMM's input at columns kk, in x's dtype: x itself, or
    norm(x + res), or act(gate) * up."""
    ok = m_ok[:, None] & k_ok[None, :]
    at = rm[:, None] * stride_xm + kk[None, :]
    if PROLOGUE == 2:  # x = [gate | up] of 2K columns
        g = tl.load(x + at, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(x + at + K, mask=ok, other=0.0).to(tl.float32)
        return gated(g, u, ACT, x.dtype.element_ty).to(x.dtype.element_ty)
    v = tl.load(x + at, mask=ok, other=0.0)
    if PROLOGUE == 1:
        if HAS_RES:  # the residual stream, rounded to x's dtype as torch's add would be
            r = tl.load(res + at, mask=ok, other=0.0)
            v = (v.to(tl.float32) + r.to(tl.float32)).to(x.dtype.element_ty)
        nw = tl.load(norm_w + kk, mask=k_ok, other=0.0)
        v = rms_scaled(v.to(tl.float32), inverses[:, None], nw[None, :]).to(x.dtype.element_ty)
    return v


@triton.jit
def _skinny_kernel(x, w, b, out, norm_w, res, res_out, M, N, K, stride_xm, stride_wn,
                   stride_om, eps, HAS_BIAS: tl.constexpr, PROLOGUE: tl.constexpr,
                   HAS_RES: tl.constexpr, ACT: tl.constexpr, ROW_BLOCK: tl.constexpr,
                   IEEE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, 16)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    m_ok = rm < M
    inverses = tl.zeros((16,), dtype=tl.float32)
    if PROLOGUE == 1:  # 1 / rms of each row first, over K in chunks; program 0 writes x + res
        squares = tl.zeros((16,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + rk
            ok = m_ok[:, None] & (kk < K)[None, :]
            at = rm[:, None] * stride_xm + kk[None, :]
            v = tl.load(x + at, mask=ok, other=0.0)
            if HAS_RES:
                r = tl.load(res + at, mask=ok, other=0.0)
                v = (v.to(tl.float32) + r.to(tl.float32)).to(x.dtype.element_ty)
                tl.store(res_out + at, v, mask=ok & ((rm * 0 + pid) == 0)[:, None])
            v = v.to(tl.float32)
            squares += tl.sum(v * v, axis=1)
        inverses = tl.rsqrt(squares / K + eps)
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        k_ok = kk < K
        wt = tl.load(w + rn[:, None] * stride_wn + kk[None, :],
                     mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        xt = _x_chunk(x, res, norm_w, inverses, rm, m_ok, kk, k_ok, K, stride_xm, PROLOGUE,
                      HAS_RES, ACT)
        if IEEE:  # float32 models: no TF32 rounding
            acc = tl.dot(wt, tl.trans(xt), acc, input_precision="ieee")
        else:
            acc = tl.dot(wt, tl.trans(xt), acc)
    if HAS_BIAS:
        acc += tl.load(b + rn, mask=n_ok, other=0.0).to(tl.float32)[:, None]
    tl.store(out + rm[None, :] * stride_om + rn[:, None], acc.to(out.dtype.element_ty),
             mask=n_ok[:, None] & m_ok[None, :])


_CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=nw, num_stages=st)
            for bn, bk, nw, st in [(16, 256, 4, 4), (16, 512, 4, 3), (32, 128, 4, 4),
                                   (32, 256, 4, 4), (32, 512, 8, 3), (64, 128, 4, 4),
                                   (64, 256, 8, 3), (128, 128, 8, 3), (128, 64, 4, 4)]]
_skinny_tuned = triton.autotune(_CONFIGS, key=["N", "K", "PROLOGUE", "IEEE"])(_skinny_kernel)


def _launch(x: torch.Tensor, k: int, weight: torch.Tensor, bias: torch.Tensor | None,
            prologue: int, block_n: int | None, block_k: int | None, **prologue_args):
    args, meta, out, res_out = prepare("skinny_gemm", MAX_M, x, k, weight, bias, prologue,
                                       **prologue_args)
    n = weight.shape[0]
    meta.update(IEEE=x.dtype == torch.float32, ROW_BLOCK=1)  # (rows are summed in chunks)
    if block_n is None:
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
        _skinny_tuned[grid](*args, **meta)
    else:
        _skinny_kernel[(triton.cdiv(n, block_n),)](*args, **meta, BLOCK_N=block_n,
                                                   BLOCK_K=block_k)
    return out, res_out


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                block_n: int | None = None, block_k: int | None = None) -> torch.Tensor:
    """x [M, K] (M <= MAX_M) times weight [N, K] transposed, plus bias [N]. Block sizes are
    autotuned unless given (the CPU tests give them: the interpreter cannot time anything)."""
    return _launch(x, x.shape[-1], weight, bias, PLAIN, block_n, block_k)[0]


def norm_skinny(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                bias: torch.Tensor | None = None, residual: torch.Tensor | None = None, *,
                block_n: int | None = None, block_k: int | None = None):
    """(rmsnorm(x + residual) @ weight.T + bias, x + residual), as `triton_gemv.norm_gemv`."""
    out, summed = _launch(x, x.shape[-1], weight, bias, NORM, block_n, block_k,
                          norm_weight=norm_weight, eps=eps, residual=residual)
    return out, (x if summed is None else summed)


def gated_skinny(gate_up: torch.Tensor, act: str, weight: torch.Tensor,
                 bias: torch.Tensor | None = None, *, block_n: int | None = None,
                 block_k: int | None = None) -> torch.Tensor:
    """(act(gate) * up) @ weight.T + bias for gate_up = [gate | up], as
    `triton_gemv.gated_gemv`."""
    if gate_up.dim() != 2 or gate_up.shape[-1] % 2:
        raise ValueError(f"gated_skinny takes [gate | up] rows; got {tuple(gate_up.shape)}")
    return _launch(gate_up, gate_up.shape[-1] // 2, weight, bias, GATED, block_n, block_k,
                   act=act)[0]
