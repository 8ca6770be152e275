"""y = x @ W.T for FP8 (E4M3) weights with one scale per output channel, on the tensor cores:
each row of x is quantized to FP8 with its own scale (dynamic, per token: a token with a large
activation does not cost the others their precision), and `torch._scaled_mm` multiplies the
two FP8 matrices with both scale vectors applied in its epilogue (row-wise scaling: CUTLASS on
sm_89+; PyTorch also runs it on the CPU, which the tests use). Rows of a batch-1 decode step
go to the FP8 GEMV instead (triton_gemv.py: weights dequantized in registers, x unquantized).
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(xq [M, K] float8_e4m3fn, scale [M, 1] float32) with x ~= xq * scale, per row."""
    xf = x.float()
    # (times the reciprocal: a division by a scalar is one on the CPU and this on CUDA)
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp_(min=1e-12) * (1.0 / FP8_MAX)
    return (xf / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def fp8_linear(x: torch.Tensor, qweight: torch.Tensor, w_scale: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] (bf16/fp16/fp32) times the FP8 weight [N, K] (scale [N]) transposed, plus
    bias, in x's dtype. N and K must be multiples of 16 (cuBLASLt's FP8 layouts; the
    quantizer keeps other layers unquantized)."""
    shape = x.shape
    out = scaled_product(*quantize_tokens(x.reshape(-1, shape[-1])), qweight, w_scale, bias,
                         x.dtype)
    return out.view(*shape[:-1], qweight.shape[0])


def scaled_product(xq: torch.Tensor, x_scale: torch.Tensor, qweight: torch.Tensor,
                   w_scale: torch.Tensor, bias: torch.Tensor | None,
                   dtype: torch.dtype) -> torch.Tensor:
    """(xq * x_scale) @ (qweight * w_scale).T (+ bias) in `dtype`, rows [M, N], from FP8
    activations quantized per row (here, or by triton_fp8_quant.py with the op before)."""
    # row-wise scaling computes in float32 and writes bf16 (the only output it supports)
    out = torch._scaled_mm(xq, qweight.t(), scale_a=x_scale, scale_b=w_scale.view(1, -1),
                           out_dtype=torch.bfloat16)
    out = out.to(dtype)
    return out if bias is None else out + bias
