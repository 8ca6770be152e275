"""The CPU's ops: PyTorch's reference arithmetic, with each float32 linear weight prepacked once
for oneDNN (the layout its GEMM reads, reordered at load rather than at every call), and each
int8 weight (`--quantization int8`) prepacked for an int8 x int8 GEMM (fbgemm).

On the 2-core development machine (AMD EPYC, torch 2.13's MKL and oneDNN) a 64-row product
with t5-small's 32,128 x 512 LM head took 38 ms through `F.linear` and 18 ms prepacked; the
decoder's own 64-row products gained 10-30 %, the encoder's thousand-row ones nothing
(docs/benchmarks.md). The packed copy is a second copy of each weight in host memory; the
original stays, since other code reads it (a tied embedding, quantization, tests).

With `int8_activations` (`--int8-activations`) the int8 weights' products quantize the
activations too, as CTranslate2's int8 does: each row
(token) of x is scaled by its own largest magnitude (so one per-tensor quantization of the
scaled rows is a per-token one), multiplied in int8 by PyTorch's dynamic quantized linear,
and scaled back; about 1.5x the float32 products' speed. Weight-only int8 (the reference's
arithmetic) gains nothing on a CPU. Layers a model keeps out of low-precision activations
(`keep_in_model_dtype`: T5's `wo`, whose inputs have outliers within a row) run their int8
weight dequantized once, in float32. Without it int8 is weight-only, as the reference runs
it (exact in x's dtype, slower than float32 on a CPU: docs/quantization.md).

Layers keep calling `ops.linear(x, weight, bias)`: the weight tensor they pass is looked up
by identity. A weight that was not packed (another dtype, a `QuantizedWeight`) runs as the
reference runs it. Weights must not change after `warm` (nothing in the runtime changes them).

Host memory per product shape: oneDNN builds a primitive for each (rows, weight shape) it is
given, and both its primitive cache and PyTorch's ideep layer over it keep it (LRUs of 1,024
entries: ONEDNN_PRIMITIVE_CACHE_CAPACITY, LRU_CACHE_CAPACITY), about 0.55 MB of heap per shape
(torch 2.13, AVX-512: 400 new row counts of one weight, +225 MB; 1,600: 451 MB, flat from about
1,100). Every new batch size or encoder batch length is a new shape, so a CPU scheduler grows by
up to ~0.45 GB over its first thousands of requests (`cached_shapes`; docs/reliability.md).
Rows padded to fewer shapes cost 7-42 % a product (the input's copy); caches capped at 256
doubled an 8,000-request run's time (primitives rebuilt, 0.5-1 ms each).
"""

from __future__ import annotations

import warnings
import weakref

import torch
from torch import nn

from seq2serve.models.ops import TorchOps
from seq2serve.models.quantized_weight import QuantizedWeight
from seq2serve.runtime.kernels.activations import torch_activation

_INT8_ENGINES = ("x86", "fbgemm")  # the dynamic int8 linear's x86 back ends
_CACHED_SHAPES = 1024  # oneDNN's and ideep's caches: shapes kept (their default capacity)
_LIVE: weakref.WeakSet = weakref.WeakSet()  # this process's OneDnnOps (cached_gemm_shapes)


def cached_gemm_shapes() -> int | None:
    """Product shapes this process's oneDNN ops have run (about 0.55 MB of host memory each,
    up to oneDNN's 1,024), or None where no model computes through them (a GPU, or CPU
    models in another dtype)."""
    return sum(o.cached_shapes for o in _LIVE) if _LIVE else None


def int8_activations_available() -> bool:
    """Whether PyTorch's dynamic int8 linear (fbgemm, x86) runs here."""
    return torch.backends.quantized.engine in _INT8_ENGINES


def onednn_available() -> bool:
    """Whether this PyTorch build has oneDNN's prepacked linear (x86 and Arm CPU wheels do)."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class OneDnnOps(TorchOps):
    """TorchOps whose float32 linears run oneDNN's GEMM on weights packed by `warm`, and whose
    int8 weights run an int8 GEMM with per-token activation scales."""

    name = "onednn"

    def __init__(self, int8_activations: bool = False) -> None:
        if int8_activations and not int8_activations_available():
            raise ValueError("int8 activations need PyTorch's fbgemm int8 kernels (an x86 "
                             "CPU build); this build has "
                             f"{torch.backends.quantized.supported_engines}")
        self.int8_activations = int8_activations
        # id(weight) -> (weight, its packed copy); the weight is held so its id stays its own
        self._packed: dict[int, tuple[torch.Tensor | QuantizedWeight, torch.Tensor]] = {}
        self._int8: dict[int, tuple[QuantizedWeight, object]] = {}  # fbgemm's packed params
        # (rows, out, in, bias) of the products run: the primitives oneDNN holds, up to its cap
        self._shapes: set[tuple[int, int, int, bool]] = set()
        _LIVE.add(self)

    @torch.inference_mode()
    def warm(self, model: nn.Module, keep: tuple[str, ...] = ()) -> None:
        """Pack every float32 (or int8) CPU weight of a layer that computes through these
        ops; int8 layers named with a suffix in `keep` keep float activations."""
        for name, module in model.named_modules():
            w = getattr(module, "weight", None)
            if getattr(module, "ops", None) is not self or id(w) in self._packed:
                continue
            if isinstance(w, QuantizedWeight) and w.method == "int8":
                if w.qweight.device.type != "cpu" or w.dtype != torch.float32:
                    continue
                if not any(name.endswith(k) for k in keep):
                    if self.int8_activations:
                        self._int8[id(w)] = (w, _prepack_int8(w))
                    continue
                dense = w.dequantize()  # weight-only: dequantized once
            elif (isinstance(w, torch.Tensor) and w.dim() == 2 and w.dtype == torch.float32
                  and w.device.type == "cpu"):
                dense = w
            else:
                continue
            self._packed[id(w)] = (w, torch.ops.mkldnn._reorder_linear_weight(dense))

    @property
    def cached_shapes(self) -> int:
        """Product shapes run through oneDNN (counted up to its caches' 1,024): the host memory
        its primitives hold, about 0.55 MB each while the caches fill."""
        return len(self._shapes)

    def gated(self, gate_up: torch.Tensor, activation: str) -> torch.Tensor:
        """act(gate) * up, the product written into act(gate)'s buffer (the reference's
        arithmetic; one [rows, d_ff] buffer fewer: the encoder's are 8 MB at t5-small's
        2,048 x 1,024)."""
        gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
        return torch_activation(activation)(gate).mul_(up)

    def linear(self, x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.dtype != torch.float32 or x.requires_grad:
            return super().linear(x, weight, bias)
        packed = self._packed.get(id(weight))
        if packed is not None:
            if len(self._shapes) < _CACHED_SHAPES:
                self._shapes.add((x.numel() // x.shape[-1], *weight.shape, bias is not None))
            return torch.ops.mkldnn._linear_pointwise(x, packed[1], bias, "none", [], "")
        int8 = self._int8.get(id(weight))
        if int8 is not None:
            return int8_linear(x, int8[1], bias)
        return super().linear(x, weight, bias)


def _prepack_int8(w: QuantizedWeight):
    """fbgemm's packed int8 weight, its per-channel scales as they are (no re-rounding)."""
    zeros = torch.zeros(w.scale.numel(), dtype=torch.int64)
    with warnings.catch_warnings():  # quantized tensors are deprecated: this one lives here only
        warnings.filterwarnings("ignore", message=".*quantized tensor creation.*")
        q = torch._make_per_channel_quantized_tensor(w.qweight.data, w.scale.double(), zeros, 0)
    return torch.ops.quantized.linear_prepack(q, None)


def int8_linear(x: torch.Tensor, packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W.T (+ bias) in int8: each row of x divided by its largest magnitude, the rows
    quantized together (then per row, in effect: every row spans [-1, 1]) to 7 bits
    (reduce_range: AVX2's 16-bit pair sums cannot overflow), and the product's rows scaled
    back."""
    rows = x.reshape(-1, x.shape[-1])
    scale = rows.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12)
    out = torch.ops.quantized.linear_dynamic(rows / scale, packed, True).mul_(scale)
    out = out.view(*x.shape[:-1], out.shape[-1])
    return out if bias is None else out + bias
