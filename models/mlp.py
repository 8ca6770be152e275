"""Feed-forward blocks: plain (act(x W_in) W_out) and gated (act(x W_gate) * x W_up) W_out.
`in_proj` and `after_in_proj` split each at its input projection, so that a pre-norm block can
fuse its norm into that projection (models/block.py)."""

from __future__ import annotations

import torch
from torch import nn

from seq2serve.models.linear import Linear
from seq2serve.models.ops import REFERENCE, TorchOps
from seq2serve.runtime.kernels.activations import torch_activation


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, activation: str,
                 bias: bool = False) -> None:
        super().__init__()
        self.up = Linear(hidden, intermediate, bias)
        self.down = Linear(intermediate, hidden, bias)
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
        self.gate_up = Linear(hidden, [intermediate, intermediate])  # shard 0: gate, 1: up
        self.down = Linear(intermediate, hidden)
        self.activation = activation

    @property
    def in_proj(self) -> Linear:
        return self.gate_up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after_in_proj(self.gate_up(x))

    def after_in_proj(self, gate_up: torch.Tensor) -> torch.Tensor:
        """down(act(gate) * up) from in_proj's output [gate | up]."""
        return self.ops.gated_linear(gate_up, self.activation, self.down.weight, self.down.bias)
