"""A bias-free or biased linear layer whose weight may be assembled from several checkpoint
tensors (fused q/k/v, gate/up): the loader copies each shard into its rows. Which kernel runs
is models/ops.py's choice.

Tensor parallelism (models/parallel_state.py) splits a layer one of two ways, as Megatron
does: `ColumnParallelLinear` keeps this rank's slice of the output features (of each fused
shard: its heads of q, k and v), `RowParallelLinear` its slice of the input features, and sums
the ranks' partial outputs. `tp_dims` tells the loader which dimension of each parameter is
this rank's slice of the checkpoint tensor. At tp_size 1 both are plain `Linear`s.
"""

from __future__ import annotations

import torch
from torch import nn

from seq2serve.models import parallel_state
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
        self.tp_dims: dict[str, int] = {}  # parameter -> its dimension split over ranks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.linear(x, self.weight, self.bias)

    def reduce(self, y: torch.Tensor) -> torch.Tensor:
        """`y` computed from this layer's weight outside `forward` (a fused kernel), made the
        layer's output: nothing to do unless the layer is row-parallel."""
        return y


class ColumnParallelLinear(Linear):
    """This rank's slice of the output features (of each fused shard); `what` names them in
    the error when the ranks cannot share them evenly."""

    def __init__(self, in_features: int, out_features: int | list[int], bias: bool = False,
                 what: str = "output features"):
        tp = parallel_state.tensor_parallel()
        if isinstance(out_features, list):
            out_features = [tp.shard(n, what) for n in out_features]
        else:
            out_features = tp.shard(out_features, what)
        super().__init__(in_features, out_features, bias)
        if tp.size > 1:
            self.tp_dims = {"weight": 0, "bias": 0}


class RowParallelLinear(Linear):
    """This rank's slice of the input features; the output is the sum over ranks (an
    all-reduce), the bias added once, after it."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 what: str = "input features"):
        tp = parallel_state.tensor_parallel()
        super().__init__(tp.shard(in_features, what), out_features, bias)
        self.tp_size = tp.size
        if tp.size > 1:
            self.tp_dims = {"weight": 1}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self.ops.linear(x, self.weight, self.bias)
        y = parallel_state.all_reduce(self.ops.linear(x, self.weight))
        return y if self.bias is None else y + self.bias

    def reduce(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.tp_size == 1 else parallel_state.all_reduce(y)
