"""A bias-free or biased linear layer whose weight may be assembled from several checkpoint
tensors (fused q/k/v, gate/up): the loader copies each shard into its rows."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int | list[int], bias: bool = False):
        super().__init__()
        shard_sizes = out_features if isinstance(out_features, list) else None
        total = sum(shard_sizes) if shard_sizes else out_features
        self.in_features, self.out_features = in_features, total
        self.shard_sizes = shard_sizes  # rows of each checkpoint tensor, read by the loader
        self.weight = nn.Parameter(torch.empty(total, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(total), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if uses_gemv(x):
            from seq2serve.runtime.kernels.triton_gemv import gemv

            return gemv(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def uses_gemv(x: torch.Tensor) -> bool:
    """Whether a Linear sends these rows to the Triton GEMV (few rows, on CUDA)."""
    return x.is_cuda and x.dim() == 2 and x.shape[0] <= _GEMV_MAX_M


def norm_linear(norm, linear: Linear, x: torch.Tensor, residual: torch.Tensor | None = None):
    """(linear(norm(x + residual)), x + residual), or (linear(norm(x)), x) without a residual:
    a pre-norm sublayer's input projection. For GEMV-sized batches the norm (and the add) run
    in the GEMV's prologue, one kernel instead of two."""
    if uses_gemv(x):
        from seq2serve.runtime.kernels.triton_gemv import norm_gemv

        return norm_gemv(x, norm.weight, norm.eps, linear.weight, linear.bias, residual)
    if residual is None:
        return linear(norm(x)), x
    normed, x = norm(x, residual=residual)
    return linear(normed), x


# decode GEMMs of at most this many rows go to the Triton GEMV on CUDA (0: always cuBLAS);
# it beats cuBLAS at 1 row on every mT5-large shape, loses at 2-4 (benchmarks/bench_gemv.py)
_GEMV_MAX_M = int(os.environ.get("SEQ2SERVE_GEMV_MAX_M", "1"))
