"""RMS layer norm (T5's "LayerNorm" and Llama's RMSNorm): no mean, no bias, variance in float32."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """With `residual`, computes x + residual first and returns (normed, x + residual): the
    residual add of the previous sublayer fused into this norm (one kernel on CUDA)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if x.is_cuda and x.dim() == 2:
            from seq2serve.runtime.kernels.triton_ops import rmsnorm

            return rmsnorm(x, self.weight, self.eps, residual)
        if residual is not None:
            x = x + residual
            return self._norm(x), x
        return self._norm(x)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        x = (x.float() * torch.rsqrt(variance + self.eps)).to(self.weight.dtype)
        return self.weight * x
