"""Feed-forward blocks: plain (act(x W_in) W_out) and gated (act(x W_gate) * x W_up) W_out.
`in_proj` and `after_in_proj` split each at its input projection, so that a pre-norm block can
fuse its norm into that projection (models/block.py)."""

from __future__ import annotations

import torch
from torch import nn

from seq2serve.models.linear import ColumnParallelLinear, Linear, RowParallelLinear
from seq2serve.models.ops import REFERENCE, TorchOps
from seq2serve.runtime.kernels.activations import torch_activation


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, activation: str,
                 bias: bool = False) -> None:
        super().__init__()
        self.up = ColumnParallelLinear(hidden, intermediate, bias, what="feed-forward channels")
        self.down = RowParallelLinear(intermediate, hidden, bias, what="feed-forward channels")
        self.act = torch_activation(activation)

    @property
    def in_proj(self) -> Linear:
        return self.up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after_in_proj(self.up(x))

    def after_in_proj(self, h: torch.Tensor) -> torch.Tensor:
        """The rest of the block, from in_proj's output."""
        return self.down(self.act(h))


class GatedMLP(nn.Module):
    ops: TorchOps = REFERENCE  # the model's, set at load (ops.use_ops)

    def __init__(self, hidden: int, intermediate: int, activation: str) -> None:
        super().__init__()
        # shard 0: gate, 1: up (each rank: its channels of both)
        self.gate_up = ColumnParallelLinear(hidden, [intermediate, intermediate],
                                            what="feed-forward channels")
        self.down = RowParallelLinear(intermediate, hidden, what="feed-forward channels")
        self.activation = activation

    @property
    def in_proj(self) -> Linear:
        return self.gate_up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after_in_proj(self.gate_up(x))

    def after_in_proj(self, gate_up: torch.Tensor) -> torch.Tensor:
        """down(act(gate) * up) from in_proj's output [gate | up]."""
        # (down has no bias: a row-parallel one would be added once per rank before the sum)
        return self.down.reduce(
            self.ops.gated_linear(gate_up, self.activation, self.down.weight))
