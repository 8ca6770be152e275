"""The activation functions a config may name, in one table for the Triton kernels and PyTorch.

Configs use several names for one function (T5's "gelu_new" and Llama's "gelu_pytorch_tanh"
are both tanh-approximated GELU). `ACTIVATIONS` maps each name a config may use to the
function's code, which is the `ACT` constexpr of `triton_ops.activation`; `TORCH_ACTIVATIONS`
is the PyTorch function of each code (the reference, and what runs on the CPU).
"""

from __future__ import annotations

from functools import partial

import torch.nn.functional as F

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu", "swish": "silu"}

TORCH_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu,
                     "gelu_tanh": partial(F.gelu, approximate="tanh"), "silu": F.silu}


def torch_activation(name: str):
    """The PyTorch function for a config's activation name."""
    return TORCH_ACTIVATIONS[ACTIVATIONS[name]]
