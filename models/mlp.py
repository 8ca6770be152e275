"""Feed-forward blocks: plain (act(x W_in) W_out) and gated (act(x W_gate) * x W_up) W_out."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from seq2serve.models.linear import Linear, uses_gemv

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

    @property
    def in_proj(self) -> Linear:
        return self.up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after_in_proj(self.up(x))

    def after_in_proj(self, h: torch.Tensor) -> torch.Tensor:
        """The rest of the block, from in_proj's output (callers fusing a norm into it)."""
        return self.down(self.act(h))


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, activation: str) -> None:
        super().__init__()
        self.gate_up = Linear(hidden, [intermediate, intermediate])  # shard 0: gate, 1: up
        self.down = Linear(intermediate, hidden)
        self.act = ACTIVATIONS[activation]
        self.activation = activation
        self.intermediate = intermediate

    @property
    def in_proj(self) -> Linear:
        return self.gate_up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after_in_proj(self.gate_up(x))

    def after_in_proj(self, gate_up: torch.Tensor) -> torch.Tensor:
        """down(act(gate) * up) from in_proj's output [gate | up]."""
        if uses_gemv(gate_up):  # the activation in the down GEMV's prologue
            from seq2serve.runtime.kernels.triton_gemv import gated_gemv

            return gated_gemv(gate_up, self.activation, self.down.weight, self.down.bias)
        if gate_up.is_cuda and gate_up.dim() == 2:  # one fused kernel for act(gate) * up
            from seq2serve.runtime.kernels.triton_ops import gated_activation

            return self.down(gated_activation(gate_up, self.activation))
        gate, up = gate_up.split(self.intermediate, dim=-1)
        return self.down(self.act(gate) * up)
