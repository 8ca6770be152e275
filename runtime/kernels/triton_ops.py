"""Fused elementwise kernels for the decoder's small ops on CUDA: RMS norm (optionally with the
residual add before it) and the gated activation. At small batch sizes a decode step is a
chain of tiny kernels whose launch cost dominates; these turn ~7 kernels into 1 each. The
PyTorch versions in models/ops.py (`TorchOps`) remain the reference (and run on the CPU).

`rms_inverse` and `rms_scaled` are the norm's arithmetic, shared with the GEMV prologue
(triton_gemv.py) so that the batch-1 path (norm fused into the GEMV) and the batched one (this
kernel, then a GEMM) normalize alike; `gated` likewise. Both round as the PyTorch reference
(and Hugging Face) does: the float32 result is cast to the model's dtype before the product
with the weight (or `up`), which is rounded to that dtype again.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from seq2serve.runtime.kernels.activations import ACTIVATIONS


@triton.jit
def rms_inverse(v, n, eps):
    """1 / rms of the float32 row v (zeros past its n values), as `x.float().pow(2).mean(-1)`
    and `rsqrt` compute it; every norm kernel sums a whole row in one `tl.sum`."""
    return tl.rsqrt(tl.sum(v * v, 0) / n + eps)


@triton.jit
def rms_scaled(v, inv, w):
    """weight * (v * inv) for float32 v, weight w loaded in its own dtype: v * inv cast to that
    dtype first, the product rounded to it again (the float32 product of two such values is
    exact, so this is the dtype's own multiply). Returned in w's dtype."""
    normed = (v * inv).to(w.dtype)
    return (w.to(tl.float32) * normed.to(tl.float32)).to(w.dtype)


@triton.jit
def _rmsnorm_kernel(x, res, out, res_out, w, stride_x, stride_r, stride_o, stride_ro, n, eps,
                    HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    v = tl.load(x + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:  # the residual stream: x + res, rounded to its dtype as torch's add would be
        summed = (v + tl.load(res + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
                  ).to(res_out.dtype.element_ty)
        tl.store(res_out + row * stride_ro + cols, summed, mask=mask)
        v = summed.to(tl.float32)
    weight = tl.load(w + cols, mask=mask, other=0.0)
    tl.store(out + row * stride_o + cols, rms_scaled(v, rms_inverse(v, n, eps), weight),
             mask=mask)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float,
            residual: torch.Tensor | None = None):
    """weight * x / rms(x) for x [rows, n] (rounded as `rms_scaled` says); with `residual`,
    x is first replaced by x + residual and (normed, x + residual) is returned."""
    rows, n = x.shape
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else out
    if rows:
        _rmsnorm_kernel[(rows,)](
            x, residual if residual is not None else x, out, res_out, weight, x.stride(0),
            residual.stride(0) if residual is not None else 0, out.stride(0),
            res_out.stride(0), n, eps, HAS_RES=residual is not None,
            BLOCK=triton.next_power_of_2(n), num_warps=4 if n <= 2048 else 8)
    return out if residual is None else (out, res_out)


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def activation(g, ACT: tl.constexpr):
    """ACT (a code of activations.ACTIVATIONS) of float32 g."""
    if ACT == "silu":
        a = g * tl.sigmoid(g)
    elif ACT == "gelu_tanh":
        a = 0.5 * g * (1.0 + _tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)))
    elif ACT == "gelu":
        a = 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))
    else:  # relu
        a = tl.maximum(g, 0.0)
    return a


@triton.jit
def gated(g, u, ACT: tl.constexpr, dtype: tl.constexpr):
    """act(g) * u for float32 g, u of a `dtype` tensor, rounded as PyTorch does in `dtype`:
    act(g) to dtype, then the product to dtype. Returned in float32."""
    a = activation(g, ACT).to(dtype).to(tl.float32)
    return (a * u).to(dtype).to(tl.float32)


@triton.jit
def _gated_kernel(gate_up, out, stride_in, stride_out, n, ACT: tl.constexpr,
                  BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    g = tl.load(gate_up + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gate_up + row * stride_in + n + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + row * stride_out + cols, gated(g, u, ACT, out.dtype.element_ty), mask=mask)


def gated_activation(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """act(gate) * up for gate_up = [gate | up] along the last dim (`activation`: a config's
    name, a key of activations.ACTIVATIONS)."""
    rows, two_n = gate_up.shape
    n = two_n // 2
    out = torch.empty(rows, n, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    if rows:
        _gated_kernel[(rows, triton.cdiv(n, block))](
            gate_up, out, gate_up.stride(0), out.stride(0), n,
            ACT=ACTIVATIONS[activation], BLOCK=block, num_warps=4)
    return out
