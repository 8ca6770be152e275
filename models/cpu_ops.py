"""The CPU's ops: PyTorch's reference arithmetic, with each float32 linear weight prepacked once
for oneDNN (the layout its GEMM reads, reordered at load rather than at every call).

On the 2-core development machine (AMD EPYC, torch 2.13's MKL and oneDNN) a 64-row product
with t5-small's 32,128 x 512 LM head took 38 ms through `F.linear` and 18 ms prepacked; the
decoder's own 64-row products gained 10-30 %, the encoder's thousand-row ones nothing
(docs/benchmarks.md). The packed copy is a second copy of each weight in host memory; the
original stays, since other code reads it (a tied embedding, quantization, tests).

Layers keep calling `ops.linear(x, weight, bias)`: the weight tensor they pass is looked up
by identity. A weight that was not packed (another dtype, a `QuantizedWeight`) runs as the
reference runs it. Weights must not change after `warm` (nothing in the runtime changes them).
"""

from __future__ import annotations

import torch
from torch import nn

from seq2serve.models.ops import TorchOps


def onednn_available() -> bool:
    """Whether this PyTorch build has oneDNN's prepacked linear (x86 and Arm CPU wheels do)."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class OneDnnOps(TorchOps):
    """TorchOps whose float32 linears run oneDNN's GEMM on weights packed by `warm`."""

    name = "onednn"

    def __init__(self) -> None:
        # id(weight) -> (weight, its packed copy); the weight is held so its id stays its own
        self._packed: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @torch.inference_mode()
    def warm(self, model: nn.Module) -> None:
        """Pack every float32 CPU weight of a layer that computes through these ops."""
        for module in model.modules():
            w = getattr(module, "weight", None)
            if (getattr(module, "ops", None) is self and isinstance(w, torch.Tensor)
                    and w.dim() == 2 and w.dtype == torch.float32 and w.device.type == "cpu"
                    and id(w) not in self._packed):
                self._packed[id(w)] = (w, torch.ops.mkldnn._reorder_linear_weight(w))

    def linear(self, x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
        packed = self._packed.get(id(weight))
        if packed is None or x.dtype != torch.float32 or x.requires_grad:
            return super().linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, packed[1], bias, "none", [], "")
