"""A linear layer's weight stored in 8 bits with one float32 scale per output channel (row):
W ~= qweight * scale[:, None]. `int8` is weight-only (activations stay in the model's dtype);
`fp8` (E4M3) also quantizes each activation row with its own scale when a GEMM runs on the
tensor cores (runtime/kernels/fp8_gemm.py). models/ops.py picks the kernel by the weight's
type; models/quantization.py decides which layers get one.
"""

from __future__ import annotations

import torch
from torch import nn

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
INT8_MAX = 127.0
STORAGE = {"int8": torch.int8, "fp8": FP8_DTYPE}


def row_amax(w: torch.Tensor) -> torch.Tensor:
    """Each row's largest magnitude, float32 [N]."""
    return w.float().abs().amax(dim=1)


def quantize_rows(w: torch.Tensor, method: str,
                  amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [N, K] in int8 or float8_e4m3fn, scale [N] float32): symmetric, one scale per row,
    the row's largest magnitude (`amax`: the whole row's, when `w` holds a tensor-parallel
    rank's columns of it) mapped to the format's largest value (127, 448). The
    rounding error of an element is at most scale / 2 (int8), or 2**-4 of its magnitude
    (fp8's 3 mantissa bits; absolute scale * 2**-10 below fp8's normal range)."""
    w = w.float()
    amax = (row_amax(w) if amax is None else amax).clamp(min=1e-12)
    if method == "int8":
        scale = amax / INT8_MAX
        q = torch.round(w / scale[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    elif method == "fp8":
        scale = amax / FP8_MAX
        q = (w / scale[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    else:
        raise ValueError(f"unknown quantization {method!r} (int8 or fp8)")
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """q * scale[:, None] computed in float32, in `dtype`."""
    return (q.float() * scale.float()[:, None]).to(dtype)


class QuantizedWeight(nn.Module):
    """Takes a Linear's `weight` place: `qweight` [N, K] (int8 or float8_e4m3fn) and `scale`
    [N] float32, both parameters so that the loader can fill them from an FP8 checkpoint
    (`shard_sizes` as the Linear's: fused q/k/v shards keep their own scales). `dtype` is the
    model's: what products are computed and returned in."""

    def __init__(self, out_features: int, in_features: int, method: str, dtype: torch.dtype,
                 shard_sizes: list[int] | None = None, device=None) -> None:
        super().__init__()
        if method not in STORAGE:
            raise ValueError(f"unknown quantization {method!r} (int8 or fp8)")
        self.method, self.dtype, self.shard_sizes = method, dtype, shard_sizes
        self.qweight = nn.Parameter(torch.empty(out_features, in_features, dtype=STORAGE[method],
                                                device=device), requires_grad=False)
        self.scale = nn.Parameter(torch.empty(out_features, dtype=torch.float32, device=device),
                                  requires_grad=False)

    @classmethod
    def from_float(cls, weight: torch.Tensor, method: str, shard_sizes: list[int] | None = None,
                   amax: torch.Tensor | None = None) -> QuantizedWeight:
        q, scale = quantize_rows(weight, method, amax)
        out = cls(weight.shape[0], weight.shape[1], method, weight.dtype, shard_sizes,
                  device=weight.device)
        out.qweight.data, out.scale.data = q, scale
        return out

    @property
    def shape(self) -> torch.Size:
        return self.qweight.shape

    def dequantize(self) -> torch.Tensor:
        return dequantize_rows(self.qweight, self.scale, self.dtype)

    def extra_repr(self) -> str:
        n, k = self.qweight.shape
        return f"{self.method}, out={n}, in={k}, dtype={self.dtype}"
