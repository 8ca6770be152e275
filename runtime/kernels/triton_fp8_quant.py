"""Per-token FP8 activation quantization for `torch._scaled_mm` (fp8_gemm.py) in one kernel,
with the op before the GEMM fused into it: the RMS norm (and the residual add before it) or the
gated activation. Eager PyTorch spends about 8 kernels on one row-wise quantization (float
copy, abs, amax, clamp, two divisions, clamp, cast), plus the norm's or activation's own
kernel; this is one, each program a whole row held in registers.

It rounds as the PyTorch reference (`fp8_gemm.quantize_tokens` after `TorchOps.rms_norm` or
`TorchOps.gated`) does: the norm or activation is rounded to the model's dtype first (the
shared `rms_scaled` and `gated` of triton_ops.py), then scale = max|row| * (1 / 448) in
float32 and each value divided by it (IEEE division) and cast to E4M3 (round to nearest even).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from seq2serve.runtime.kernels.activations import ACTIVATIONS
from seq2serve.runtime.kernels.triton_ops import gated, rms_inverse, rms_scaled

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)


@triton.jit
def _quantize_kernel(x, res, res_out, norm_w, xq, x_scale, stride_x, stride_r, stride_ro,
                     stride_q, n, eps, fp8_max, inv_fp8_max, MODE: tl.constexpr,
                     HAS_RES: tl.constexpr, ACT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    if MODE == "gated":  # x = [gate | up], each n wide
        g = tl.load(x + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x + row * stride_x + n + cols, mask=mask, other=0.0).to(tl.float32)
        v = gated(g, u, ACT, x.dtype.element_ty)
    else:
        v = tl.load(x + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:  # the residual stream x + res, rounded to its dtype as torch's add is
            summed = (v + tl.load(res + row * stride_r + cols, mask=mask, other=0.0).to(
                tl.float32)).to(res_out.dtype.element_ty)
            tl.store(res_out + row * stride_ro + cols, summed, mask=mask)
            v = summed.to(tl.float32)
        if MODE == "norm":
            w = tl.load(norm_w + cols, mask=mask, other=0.0)
            v = rms_scaled(v, rms_inverse(v, n, eps), w).to(tl.float32)
    # as quantize_tokens computes them: the scale times the float32 reciprocal of 448, each
    # value IEEE-divided by the scale ('/' is the GPU's approximate div.full.f32, which
    # rounds a rare value to the other E4M3 neighbour)
    scale = tl.maximum(tl.max(tl.abs(v), 0), 1e-12) * inv_fp8_max
    q = tl.minimum(tl.maximum(tl.math.div_rn(v, scale), -fp8_max), fp8_max)
    tl.store(xq + row * stride_q + cols, q.to(xq.dtype.element_ty), mask=mask)
    tl.store(x_scale + row, scale)


def _launch(x: torch.Tensor, n: int, mode: str, norm_weight=None, eps: float = 0.0,
            residual: torch.Tensor | None = None, act: str = "relu"):
    rows = x.shape[0]
    xq = torch.empty(rows, n, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else x
    block = triton.next_power_of_2(n)
    if rows:
        _quantize_kernel[(rows,)](
            x, residual if residual is not None else x, res_out,
            norm_weight if norm_weight is not None else x, xq, scale, x.stride(0),
            residual.stride(0) if residual is not None else 0, res_out.stride(0), xq.stride(0),
            n, eps, FP8_MAX, 1.0 / FP8_MAX, MODE=mode, HAS_RES=residual is not None, ACT=ACTIVATIONS[act],
            BLOCK=block, num_warps=4 if n <= 2048 else 8)  # (the norm kernel's: its sum's order)
    return xq, scale, res_out


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(xq [rows, n] E4M3, scale [rows, 1] float32) with x ~= xq * scale, per row of x
    [rows, n]: `fp8_gemm.quantize_tokens` in one kernel."""
    xq, scale, _ = _launch(x, x.shape[1], "plain")
    return xq, scale


def norm_quantize(x: torch.Tensor, weight: torch.Tensor, eps: float,
                  residual: torch.Tensor | None = None):
    """quantize(rms_norm(x + residual)) and, with `residual`, x + residual:
    ((xq, scale), summed or None)."""
    xq, scale, summed = _launch(x, x.shape[1], "norm", weight, eps, residual)
    return (xq, scale), summed if residual is not None else None


def gated_quantize(gate_up: torch.Tensor, act: str) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize(act(gate) * up) for gate_up = [gate | up] (`act`: a config's activation
    name)."""
    xq, scale, _ = _launch(gate_up, gate_up.shape[1] // 2, "gated", act=act)
    return xq, scale
