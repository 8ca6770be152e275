"""y = x @ W.T (+ b) for a handful of rows: the decode GEMMs of a small batch, with the small
op before each folded into its prologue.

At batch 1 a decode step is a chain of matrix-vector products whose cost is reading the
weights once; cuBLAS's small-M kernels reach well under the card's copy bandwidth on these
shapes (docs/benchmarks.md). Here each program streams BLOCK_N weight rows over K in
BLOCK_K chunks, multiplies them with every row of x (M <= MAX_M, padded to a power of two)
in float32 and writes BLOCK_N outputs per row: no tensor cores, no split-K, just enough
programs to keep the memory system busy. The block shape is autotuned per (N, K, M) on CUDA
(the first call of each shape runs outside CUDA-graph capture: the graph runner warms every
bucket up first); `F.linear` remains the reference and the CPU path.

What comes before a decoder GEMM is an RMS norm (with the previous sublayer's residual add)
or a gated activation: each is a tiny kernel whose launch costs as much as the GEMV's own
work at batch 1, so the GEMV does it itself (`norm_gemv`, `gated_gemv`). Every program
recomputes it (x is a few KB, read from L2). The norm first sums each whole row's squares, as
`triton_ops.rmsnorm` does, then normalizes each K chunk with the same `rms_scaled` (x / rms
rounded to the model's dtype before the weight, as Hugging Face rounds), so batch 1 and a
batch normalize alike; program 0 also writes the new residual stream. The gated activation
rounds as `triton_ops.gated_activation` does (the same `gated`). With PDL
(runtime/kernels/pdl.py) the first weight chunk is loaded before waiting for the kernel
before.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from seq2serve.runtime.kernels.activations import ACTIVATIONS
from seq2serve.runtime.kernels.pdl import gdc_launch_dependents, gdc_wait, pdl_enabled, pdl_launch
from seq2serve.runtime.kernels.triton_ops import gated, rms_inverse, rms_scaled

MAX_M = 4  # rows of x this kernel takes (models/ops.py sends it only 1 by default)
_PLAIN, _NORM, _GATED = 0, 1, 2  # prologues


@triton.jit
def _summed(x, res, row, kk, k_ok, stride_xm, HAS_RES: tl.constexpr):
    """x[row, kk] (+ res[row, kk], rounded to x's dtype as torch's add would be), float32."""
    v = tl.load(x + row * stride_xm + kk, mask=k_ok, other=0.0)
    if HAS_RES:
        r = tl.load(res + row * stride_xm + kk, mask=k_ok, other=0.0)
        v = (v.to(tl.float32) + r.to(tl.float32)).to(x.dtype.element_ty)
    return v.to(tl.float32)


@triton.jit
def _row_inverses(x, res, res_out, pid, M, K, stride_xm, eps, HAS_RES: tl.constexpr,
                  M_PAD: tl.constexpr, ROW_BLOCK: tl.constexpr):
    """1 / rms of each row of x (+ res) [M_PAD], each whole row summed at once as in
    `triton_ops.rmsnorm`; program 0 writes the summed rows to res_out."""
    cols = tl.arange(0, ROW_BLOCK)
    ok = cols < K
    rm = tl.arange(0, M_PAD)
    inverses = tl.zeros((M_PAD,), dtype=tl.float32)
    for m in tl.static_range(M_PAD):
        row = tl.minimum(m, M - 1)  # padding rows repeat the last one; never stored
        v = _summed(x, res, row, cols, ok, stride_xm, HAS_RES)
        if HAS_RES:  # (conditions as vectors: the interpreter wants them so)
            first = ((cols * 0 + pid) == 0) & ((cols * 0 + row) == m)
            tl.store(res_out + row * stride_xm + cols, v.to(res_out.dtype.element_ty),
                     mask=ok & first)
        inverses = tl.where(rm == m, rms_inverse(v, K, eps), inverses)
    return inverses


@triton.jit
def _chunk(acc, inverses, wt, kk, k_ok, rm, x, res, norm_w, M, K, stride_xm,
           PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
           M_PAD: tl.constexpr):
    """Add one K chunk's products to acc [M_PAD, BLOCK_N]."""
    wt = wt.to(tl.float32)
    if PROLOGUE == 1:
        nw = tl.load(norm_w + kk, mask=k_ok, other=0.0)
    for m in tl.static_range(M_PAD):
        row = tl.minimum(m, M - 1)  # padding rows repeat the last one; never stored
        if PROLOGUE == 1:  # weight * x / rms, rounded as triton_ops.rmsnorm rounds it
            v = _summed(x, res, row, kk, k_ok, stride_xm, HAS_RES)
            inv = tl.sum(tl.where(rm == m, inverses, 0.0), 0)
            xm = rms_scaled(v, inv, nw).to(tl.float32)
        elif PROLOGUE == 2:  # act(gate) * up, x = [gate | up] of 2K columns
            g = tl.load(x + row * stride_xm + kk, mask=k_ok, other=0.0).to(tl.float32)
            u = tl.load(x + row * stride_xm + K + kk, mask=k_ok, other=0.0).to(tl.float32)
            xm = gated(g, u, ACT, x.dtype.element_ty)
        else:
            xm = tl.load(x + row * stride_xm + kk, mask=k_ok, other=0.0).to(tl.float32)
        part = tl.sum(wt * xm[None, :], axis=1)  # [BLOCK_N]
        acc += tl.where(rm[:, None] == m, part[None, :], 0.0)
    return acc


@triton.jit
def _gemv_kernel(x, w, w_scale, b, out, norm_w, res, res_out, M, N, K, stride_xm, stride_wn,
                 stride_om, eps, HAS_BIAS: tl.constexpr, HAS_WSCALE: tl.constexpr,
                 PROLOGUE: tl.constexpr, HAS_RES: tl.constexpr,
                 ACT: tl.constexpr, M_PAD: tl.constexpr, ROW_BLOCK: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pid = tl.program_id(0)
    if PDL:
        gdc_launch_dependents()
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    rm = tl.arange(0, M_PAD)
    n_ok = rn < N
    w_rows = w + rn[:, None] * stride_wn
    # the first weight chunk: weights are never written, so this may overlap the kernel before
    wt = tl.load(w_rows + rk[None, :], mask=n_ok[:, None] & (rk < K)[None, :], other=0.0)
    if PDL:
        gdc_wait()  # x (and everything we write) belongs to the kernels before us
    inverses = tl.zeros((M_PAD,), dtype=tl.float32)
    if PROLOGUE == 1:
        inverses = _row_inverses(x, res, res_out, pid, M, K, stride_xm, eps, HAS_RES, M_PAD,
                                 ROW_BLOCK)
    acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
    acc = _chunk(acc, inverses, wt, rk, rk < K, rm, x, res, norm_w, M, K, stride_xm,
                 PROLOGUE, HAS_RES, ACT, M_PAD)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        kk = k0 + rk
        k_ok = kk < K
        wt = tl.load(w_rows + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _chunk(acc, inverses, wt, kk, k_ok, rm, x, res, norm_w, M, K, stride_xm,
                     PROLOGUE, HAS_RES, ACT, M_PAD)
    if HAS_WSCALE:  # 8-bit weights: one float32 scale per output channel
        acc *= tl.load(w_scale + rn, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out + rm[:, None] * stride_om + rn[None, :], acc.to(out.dtype.element_ty),
             mask=(rm[:, None] < M) & n_ok[None, :])


_CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=nw)
            for bn, bk, nw in [(2, 1024, 4), (4, 512, 4), (4, 1024, 4), (8, 256, 4),
                               (8, 512, 4), (8, 1024, 8), (16, 256, 4), (16, 512, 8),
                               (32, 256, 8)]]
_gemv_tuned = triton.autotune(_CONFIGS, key=["N", "K", "M_PAD", "PROLOGUE", "HAS_WSCALE"])(
    _gemv_kernel)


def _launch(x: torch.Tensor, k: int, weight: torch.Tensor, bias: torch.Tensor | None,
            prologue: int, block_n: int | None, block_k: int | None, *,
            norm_weight: torch.Tensor | None = None, eps: float = 0.0,
            residual: torch.Tensor | None = None, act: str = "silu",
            w_scale: torch.Tensor | None = None):
    m = x.shape[0]
    n = weight.shape[0]
    if m > MAX_M or x.dim() != 2 or weight.shape[1] != k or weight.stride(1) != 1:
        raise ValueError(f"gemv takes x [<= {MAX_M}, K] and a row-major weight [N, K]; got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    x = x.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    res_out = None
    if residual is not None:
        residual = residual.contiguous()
        res_out = torch.empty_like(x)
    unused = weight  # any tensor, for pointers a variant does not read
    args = (x, weight, unused if w_scale is None else w_scale,
            unused if bias is None else bias, out,
            unused if norm_weight is None else norm_weight,
            unused if residual is None else residual, unused if res_out is None else res_out,
            m, n, k, x.stride(0), weight.stride(0), out.stride(0), eps)
    meta = dict(HAS_BIAS=bias is not None, HAS_WSCALE=w_scale is not None, PROLOGUE=prologue,
                HAS_RES=residual is not None,
                ACT=ACTIVATIONS[act], M_PAD=triton.next_power_of_2(m),
                ROW_BLOCK=triton.next_power_of_2(k) if prologue == _NORM else 1,
                PDL=pdl_enabled(),
                **pdl_launch())
    if block_n is None:
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
        _gemv_tuned[grid](*args, **meta)
    else:
        _gemv_kernel[(triton.cdiv(n, block_n),)](*args, **meta, BLOCK_N=block_n,
                                                 BLOCK_K=block_k)
    return out, res_out


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
         block_n: int | None = None, block_k: int | None = None,
         w_scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (M <= MAX_M) times weight [N, K] transposed, plus bias [N]. Block sizes are
    autotuned unless given (the CPU tests give them: the interpreter cannot time anything).
    With `w_scale` [N] (float32) the weight is 8-bit (int8 or float8_e4m3fn, sm_89+) and
    stands for weight * w_scale[:, None]: each row's products are scaled once at the end, so
    the kernel reads half the bytes of a 16-bit weight."""
    return _launch(x, x.shape[-1], weight, bias, _PLAIN, block_n, block_k, w_scale=w_scale)[0]


def norm_gemv(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
              bias: torch.Tensor | None = None, residual: torch.Tensor | None = None, *,
              block_n: int | None = None, block_k: int | None = None,
              w_scale: torch.Tensor | None = None):
    """(rmsnorm(x + residual) @ weight.T + bias, x + residual): `triton_ops.rmsnorm` (same
    rounding) and the GEMV in one kernel. Without `residual`, the second item is x itself.
    `w_scale`: an 8-bit weight's row scales, as in `gemv`."""
    out, summed = _launch(x, x.shape[-1], weight, bias, _NORM, block_n, block_k,
                          norm_weight=norm_weight, eps=eps, residual=residual, w_scale=w_scale)
    return out, (x if summed is None else summed)


def gated_gemv(gate_up: torch.Tensor, act: str, weight: torch.Tensor,
               bias: torch.Tensor | None = None, *, block_n: int | None = None,
               block_k: int | None = None, w_scale: torch.Tensor | None = None) -> torch.Tensor:
    """(act(gate) * up) @ weight.T + bias for gate_up = [gate | up]: `gated_activation` and
    the GEMV in one kernel. `w_scale`: an 8-bit weight's row scales, as in `gemv`."""
    if gate_up.dim() != 2 or gate_up.shape[-1] % 2:
        raise ValueError(f"gated_gemv takes [gate | up] rows; got {tuple(gate_up.shape)}")
    return _launch(gate_up, gate_up.shape[-1] // 2, weight, bias, _GATED, block_n, block_k,
                   act=act, w_scale=w_scale)[0]
