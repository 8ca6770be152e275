"""The models' compute ops (RMS norm, linear, the gated activation, and their fusions) and the
one place that picks how they run.

A layer never asks where it runs: it calls `self.ops`, which `use_ops` sets for the whole
model once, at load (models/loader.py, by device). `TorchOps` is plain PyTorch: the reference,
rounding as Hugging Face does, and the CPU path. `TritonOps` runs the fused kernels of
runtime/kernels, which round norms and gated activations as the reference does (x / rms cast
to the model's dtype before the weight multiply). Its one choice per call is by row count:
a GEMM of at most `gemv_max_m` rows (SEQ2SERVE_GEMV_MAX_M, default 1: the Triton GEMV beats
cuBLAS at 1 row on every mT5-large shape and loses at 2-4, benchmarks/bench_gemv.py) goes to
the GEMV with the op before it in its prologue; up to `skinny_max_m` rows
(SEQ2SERVE_SKINNY_MAX_M, default 16) to the tensor-core skinny GEMM after the norm or
activation kernel (folded into the skinny GEMM's prologue, as into the GEMV's, they cost more
than the launches they save: every program recomputes them for 16 padded rows); more rows to
cuBLAS.

A weight may be a `QuantizedWeight` (8-bit rows and their scales, models/quantization.py): the
GEMV and the skinny GEMM read it as it is and scale each output channel at the end; more rows
go to `torch._scaled_mm` with per-token FP8 activations (fp8: quantized in one kernel with the
norm or gated activation before, triton_fp8_quant.py), or multiply the int8 values and scale
each output channel after (int8).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from seq2serve.models.padded_rows import needs_padding, pad_rows, padded
from seq2serve.models.quantized_weight import QuantizedWeight
from seq2serve.runtime.kernels.activations import torch_activation
from seq2serve.runtime.kernels.fp8_gemm import fp8_linear, scaled_product


class TorchOps:
    """Plain PyTorch: the reference every other implementation rounds like."""

    name = "torch"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None):
        """weight * x / rms(x), variance in float32 and x / rms cast to the weight's dtype
        before the weight multiply (HF's T5LayerNorm and LlamaRMSNorm). With `residual`:
        (norm(x + residual), x + residual), the residual add of the sublayer before."""
        if residual is not None:
            x = x + residual
            return self.rms_norm(x, weight, eps), x
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return weight * (x.float() * torch.rsqrt(variance + eps)).to(weight.dtype)

    def layer_norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                   eps: float) -> torch.Tensor:
        """LayerNorm with mean and bias (the BART family's); PyTorch's kernel on every
        device."""
        return F.layer_norm(x, weight.shape, weight, bias, eps)

    def linear(self, x: torch.Tensor, weight: torch.Tensor | QuantizedWeight,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(weight, QuantizedWeight):
            return quantized_linear(x, weight, bias)
        return F.linear(x, weight, bias)

    def logits(self, x: torch.Tensor, weight: torch.Tensor | QuantizedWeight,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        """An LM head's logits, `bias` (BART's final_logits_bias) added after the product, as
        HF adds it. The result may be a strided view (its rows wider than the vocabulary):
        every reader takes one."""
        out = self.linear(x, weight)
        return out if bias is None else out + bias

    def norm_linear(self, x: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                    weight: torch.Tensor, bias: torch.Tensor | None = None,
                    residual: torch.Tensor | None = None):
        """(linear(rms_norm(x + residual)), x + residual); without `residual`, (..., x)."""
        if residual is None:
            return self.linear(self.rms_norm(x, norm_weight, eps), weight, bias), x
        normed, x = self.rms_norm(x, norm_weight, eps, residual)
        return self.linear(normed, weight, bias), x

    def gated(self, gate_up: torch.Tensor, activation: str) -> torch.Tensor:
        """act(gate) * up for gate_up = [gate | up] along the last dim."""
        gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
        return torch_activation(activation)(gate) * up

    def gated_linear(self, gate_up: torch.Tensor, activation: str, weight: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
        """linear(gated(gate_up)): a gated MLP's down projection."""
        return self.linear(self.gated(gate_up, activation), weight, bias)

    def warm(self, model: nn.Module, keep: tuple[str, ...] = ()) -> None:
        """Prepare the kernels for `model`'s weights before serving (nothing to do here)."""


class TritonOps(TorchOps):
    """The Triton kernels (CUDA; on the CPU under TRITON_INTERPRET=1, for tests).
    `gemv_blocks` (block_n, block_k) fixes the GEMV's tile instead of autotuning it (the
    interpreter cannot time anything)."""

    name = "triton"

    def __init__(self, gemv_max_m: int | None = None,
                 gemv_blocks: tuple[int, int] | None = None,
                 skinny_max_m: int | None = None) -> None:
        from seq2serve.runtime.kernels import (
            triton_fp8_quant,
            triton_gemv,
            triton_ops,
            triton_skinny,
        )

        self._k, self._gemv, self._skinny = triton_ops, triton_gemv, triton_skinny
        self._fp8 = triton_fp8_quant
        if gemv_max_m is None:
            gemv_max_m = int(os.environ.get("SEQ2SERVE_GEMV_MAX_M", "1"))
        if skinny_max_m is None:
            skinny_max_m = int(os.environ.get("SEQ2SERVE_SKINNY_MAX_M", "16"))
        self.gemv_max_m = gemv_max_m  # 0: never the GEMV
        self._head_biases: dict = {}  # (bias storage, padded rows) -> the bias zero-padded
        self.skinny_max_m = min(skinny_max_m, triton_skinny.MAX_M)  # 0: never the skinny GEMM
        block_n, block_k = gemv_blocks or (None, None)
        self._blocks = {"block_n": block_n, "block_k": block_k}
        # the skinny GEMM's tile is at least 16 x 16 (the MMA shape)
        self._skinny_blocks = ({"block_n": max(block_n, 16), "block_k": max(block_k, 16)}
                               if gemv_blocks else {"block_n": None, "block_k": None})

    def _small(self, x: torch.Tensor, weight: torch.Tensor | QuantizedWeight):
        """The kernel module for these rows (the one per-call choice): the GEMV, the skinny
        GEMM, or None (the norm and activation kernels and cuBLAS)."""
        if isinstance(weight, QuantizedWeight):
            weight = weight.qweight
        if x.dim() != 2 or weight.stride(1) != 1:
            return None
        if 0 < x.shape[0] <= self.gemv_max_m:
            return self._gemv
        return self._skinny if 0 < x.shape[0] <= self.skinny_max_m else None

    @torch.inference_mode()
    def warm(self, model, keep=()):
        """Autotune the GEMV and the skinny GEMM for every weight shape of `model` that runs
        through these ops, at load: a new shape's tuning takes about a second, which the first
        request of a new shape (a short source's cross K/V projection) would otherwise wait."""
        seen = set()
        for module in model.modules():
            w = getattr(module, "weight", None)
            stored = w.qweight if isinstance(w, QuantizedWeight) else w
            if (getattr(module, "ops", None) is not self
                    or not isinstance(stored, torch.Tensor) or stored.dim() != 2
                    or (tuple(w.shape), w.dtype, stored.dtype) in seen
                    or (stored.device.type != "cuda" and self._blocks["block_n"] is None)):
                continue  # (off CUDA only fixed blocks run: the interpreter cannot tune)
            if stored is w and stored.device.type == "cuda" and needs_padding(w):
                pad_rows(w)  # (before tuning: the GEMV reads the same first rows)
            seen.add((tuple(w.shape), w.dtype, stored.dtype))
            for rows in {min(1, self.gemv_max_m), min(2, self.skinny_max_m)} - {0}:
                self.linear(torch.zeros(rows, w.shape[1], dtype=w.dtype, device=stored.device),
                            w)

    def rms_norm(self, x, weight, eps, residual=None):
        out = self._k.rmsnorm(_rows(x), weight, eps, None if residual is None else _rows(residual))
        if residual is None:
            return out.view(x.shape)
        return out[0].view(x.shape), out[1].view(x.shape)

    def linear(self, x, weight, bias=None):
        stored, scale = _stored(weight)
        if (small := self._small(x, weight)) is self._gemv:
            return small.gemv(x, stored, bias, **self._blocks, **scale)
        if small is self._skinny:
            return small.skinny_gemm(x, stored, bias, **self._skinny_blocks, **scale)
        if _is_fp8(weight):
            return self._fp8_product(x, self._fp8.quantize(_rows(x)), weight, bias)
        if needs_padding(stored) and (whole := padded(stored)) is not None:
            # (an output row count not a multiple of 8: cuBLAS's aligned kernels on the padded
            # weight, the padding's columns cut off; models/padded_rows.py)
            out = F.linear(x, whole)[..., :stored.shape[0]]
            return out + bias if bias is not None else out.contiguous()
        return super().linear(x, weight, bias)

    def logits(self, x, weight, bias=None):
        """On a padded head (an odd vocabulary), the padded product's first columns as a view,
        with no copy to make them contiguous and the bias added in the product's epilogue (one
        rounding in bf16, where HF rounds the product and the sum): for OPUS-MT's [2,048,
        58,101] logits two passes over them fewer (~0.4 ms of a 3.0 ms beam step on an H200,
        docs/benchmarks.md)."""
        stored, _ = _stored(weight)
        if (self._small(x, weight) is None and not _is_fp8(weight) and needs_padding(stored)
                and (whole := padded(stored)) is not None):
            n = stored.shape[0]
            if bias is not None:  # (zeros past the vocabulary: the padding's columns)
                key = (bias.data_ptr(), whole.shape[0])
                if key in self._head_biases:
                    bias = self._head_biases[key]
                elif x.is_cuda and torch.cuda.is_current_stream_capturing():
                    # (made by the graph at each replay: a tensor made while capturing holds
                    # nothing until the graph first runs, so none is kept for eager calls)
                    bias = F.pad(bias, (0, whole.shape[0] - n))
                else:
                    bias = self._head_biases[key] = F.pad(bias, (0, whole.shape[0] - n))
            return F.linear(x, whole, bias)[..., :n]
        return super().logits(x, weight, bias)

    def norm_linear(self, x, norm_weight, eps, weight, bias=None, residual=None):
        if self._small(x, weight) is self._gemv:
            stored, scale = _stored(weight)
            return self._gemv.norm_gemv(x, norm_weight, eps, stored, bias, residual,
                                        **self._blocks, **scale)
        if _is_fp8(weight) and self._small(x, weight) is None:
            quantized, summed = self._fp8.norm_quantize(
                _rows(x), norm_weight, eps, None if residual is None else _rows(residual))
            out = self._fp8_product(x, quantized, weight, bias)
            return out, x if summed is None else summed.view(x.shape)
        return super().norm_linear(x, norm_weight, eps, weight, bias, residual)

    def gated(self, gate_up, activation):
        return self._k.gated_activation(_rows(gate_up), activation).view(*gate_up.shape[:-1], -1)

    def gated_linear(self, gate_up, activation, weight, bias=None):
        if self._small(gate_up, weight) is self._gemv:
            stored, scale = _stored(weight)
            return self._gemv.gated_gemv(gate_up, activation, stored, bias, **self._blocks,
                                         **scale)
        if _is_fp8(weight) and self._small(gate_up, weight) is None:
            return self._fp8_product(gate_up, self._fp8.gated_quantize(_rows(gate_up),
                                                                       activation), weight, bias)
        return super().gated_linear(gate_up, activation, weight, bias)

    @staticmethod
    def _fp8_product(x: torch.Tensor, quantized: tuple[torch.Tensor, torch.Tensor],
                     weight: QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        """`torch._scaled_mm` of rows quantized by triton_fp8_quant.py, shaped as x's."""
        out = scaled_product(*quantized, weight.qweight, weight.scale, bias, x.dtype)
        return out.view(*x.shape[:-1], weight.shape[0])


def _is_fp8(weight: torch.Tensor | QuantizedWeight) -> bool:
    return isinstance(weight, QuantizedWeight) and weight.method == "fp8"


def _stored(weight: torch.Tensor | QuantizedWeight) -> tuple[torch.Tensor, dict]:
    """(the tensor a kernel reads, its w_scale keyword if 8-bit)."""
    if isinstance(weight, QuantizedWeight):
        return weight.qweight, {"w_scale": weight.scale}
    return weight, {}


def quantized_linear(x: torch.Tensor, weight: QuantizedWeight,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W.T (+ bias) for an 8-bit weight, many rows: fp8 through `torch._scaled_mm` with
    per-token activation scales; int8 weight-only: x times the int8 values (exact in x's
    dtype), each output channel scaled after, in float32. (PyTorch's `_weight_int8pack_mm`
    was 5-40x slower than this from 16 rows on on a 2-core CPU.)"""
    if weight.method == "fp8":
        return fp8_linear(x, weight.qweight, weight.scale, bias)
    if x.dtype == torch.float16:  # x @ q.T may leave fp16's range before the scale
        return F.linear(x, weight.dequantize(), bias)
    out = (F.linear(x, weight.qweight.to(x.dtype)).float() * weight.scale).to(x.dtype)
    return out if bias is None else out + bias


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as the kernels read it: [rows, last dim] with unit column stride."""
    x = x.reshape(-1, x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()


REFERENCE = TorchOps()  # what a layer uses until use_ops says otherwise


def use_ops(model: nn.Module, ops: TorchOps) -> nn.Module:
    """Make every layer of `model` that computes through `ops` (those whose class declares
    an `ops` attribute) use these."""
    for module in model.modules():
        if isinstance(getattr(type(module), "ops", None), TorchOps):
            module.ops = ops
    return model
