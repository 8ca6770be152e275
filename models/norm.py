"""RMS layer norm (T5's "LayerNorm" and Llama's RMSNorm): no mean, no bias, variance in float32;
and the real LayerNorm (mean and bias) of the BART family. The arithmetic and its rounding are
models/ops.py's."""

from __future__ import annotations

import torch
from torch import nn

from seq2serve.models.ops import REFERENCE, TorchOps


class RMSNorm(nn.Module):
    """With `residual`, computes x + residual first and returns (normed, x + residual): the
    residual add of the previous sublayer fused into this norm (one kernel with TritonOps)."""

    ops: TorchOps = REFERENCE  # the model's, set at load (ops.use_ops)

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return self.ops.rms_norm(x, self.weight, self.eps, residual)


class LayerNorm(nn.Module):
    """LayerNorm with a mean and a bias (Marian, M2M100/NLLB, mBART)."""

    ops: TorchOps = REFERENCE  # the model's, set at load (ops.use_ops)

    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.layer_norm(x, self.weight, self.bias, self.eps)
