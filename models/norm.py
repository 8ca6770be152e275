"""RMS layer norm (T5's "LayerNorm" and Llama's RMSNorm): no mean, no bias, variance in float32."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        x = (x.float() * torch.rsqrt(variance + self.eps)).to(self.weight.dtype)
        return self.weight * x
