"""Feed-forward blocks: plain (act(x W_in) W_out) and gated (act(x W_gate) * x W_up) W_out."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from seq2serve.models.linear import Linear

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "swish": F.silu,
}


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, activation: str) -> None:
        super().__init__()
        self.up = Linear(hidden, intermediate)
        self.down = Linear(intermediate, hidden)
        self.act = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, activation: str) -> None:
        super().__init__()
        self.gate_up = Linear(hidden, [intermediate, intermediate])  # shard 0: gate, 1: up
        self.down = Linear(intermediate, hidden)
        self.act = ACTIVATIONS[activation]
        self.activation = activation
        self.intermediate = intermediate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up(x)
        if gate_up.is_cuda and gate_up.dim() == 2:  # one fused kernel for act(gate) * up
            from seq2serve.models.triton_ops import gated_activation

            return self.down(gated_activation(gate_up, self.activation))
        gate, up = gate_up.split(self.intermediate, dim=-1)
        return self.down(self.act(gate) * up)
