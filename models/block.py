"""The step every pre-norm residual block repeats, shared by the model families.

T5's blocks, Llama's decoder layer and Mllama's cross-attention layer all compute
`h = sublayer(norm(x)); x = x + h`. A layer here returns its last sublayer's h without adding
it, and the next norm adds it: the add, the norm and the sublayer's input projection are then
one step (`pre_norm`), one kernel with TritonOps (and, at batch 1, one GEMV with the add and
the norm in its prologue).
"""

from __future__ import annotations

import torch

from seq2serve.models.linear import Linear
from seq2serve.models.norm import RMSNorm


def pre_norm(norm: RMSNorm, x: torch.Tensor, h: torch.Tensor | None = None,
             proj: Linear | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(proj(norm(x + h)), x + h): a sublayer's input and the new residual stream. h None:
    nothing to add (x returned as is); proj None: the normalized rows themselves."""
    ops = norm.ops
    if proj is not None:
        return ops.norm_linear(x, norm.weight, norm.eps, proj.weight, proj.bias, h)
    if h is None:
        return ops.rms_norm(x, norm.weight, norm.eps), x
    return ops.rms_norm(x, norm.weight, norm.eps, h)
