"""A bias-free or biased linear layer whose weight may be assembled from several checkpoint
tensors (fused q/k/v, gate/up): the loader copies each shard into its rows. Which kernel runs
is models/ops.py's choice."""

from __future__ import annotations

import torch
from torch import nn

from seq2serve.models.ops import REFERENCE, TorchOps


class Linear(nn.Module):
    ops: TorchOps = REFERENCE  # the model's, set at load (ops.use_ops)

    def __init__(self, in_features: int, out_features: int | list[int], bias: bool = False):
        super().__init__()
        shard_sizes = out_features if isinstance(out_features, list) else None
        total = sum(shard_sizes) if shard_sizes else out_features
        self.in_features, self.out_features = in_features, total
        self.shard_sizes = shard_sizes  # rows of each checkpoint tensor, read by the loader
        self.weight = nn.Parameter(torch.empty(total, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(total), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.linear(x, self.weight, self.bias)
