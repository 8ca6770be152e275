"""Fused elementwise kernels for the decoder's small ops on CUDA: RMS norm (optionally with the
residual add before it) and the gated activation. At small batch sizes a decode step is a
chain of tiny kernels whose launch cost dominates; these turn ~7 kernels into 1 each. The
PyTorch versions in norm.py / mlp.py remain the reference (and run on the CPU)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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
    var = tl.sum(v * v, 0) / n
    normed = (v * tl.rsqrt(var + eps)).to(out.dtype.element_ty)
    weight = tl.load(w + cols, mask=mask, other=0.0)
    tl.store(out + row * stride_o + cols, weight * normed, mask=mask)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float,
            residual: torch.Tensor | None = None):
    """weight * x / rms(x) in float32 (cast back before the weight, as HF does); with
    `residual`, x is first replaced by x + residual and (normed, x + residual) is returned."""
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
    """ACT (a FUSED_ACTIVATIONS value) of float32 g."""
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
def _gated_kernel(gate_up, out, stride_in, stride_out, n, ACT: tl.constexpr,
                  BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    g = tl.load(gate_up + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gate_up + row * stride_in + n + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + row * stride_out + cols, (activation(g, ACT) * u).to(out.dtype.element_ty),
             mask=mask)


FUSED_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_new": "gelu_tanh",
                     "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


def gated_activation(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """act(gate) * up for gate_up = [gate | up] along the last dim."""
    rows, two_n = gate_up.shape
    n = two_n // 2
    out = torch.empty(rows, n, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    if rows:
        _gated_kernel[(rows, triton.cdiv(n, block))](
            gate_up, out, gate_up.stride(0), out.stride(0), n,
            ACT=FUSED_ACTIVATIONS[activation], BLOCK=block, num_warps=4)
    return out
