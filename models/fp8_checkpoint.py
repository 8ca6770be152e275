"""Checkpoints whose linear weights are already FP8: Hugging Face `compressed-tensors`
(float 8-bit weights, per-channel or per-tensor `weight_scale`, as Neural Magic / Red Hat
publish) and `fbgemm_fp8` (per-channel `weight_scale` [N, 1], Meta's Llama FP8 releases).

A quantized layer is known by its tensors, not by the config's target and ignore lists: its
`X.weight` is float8_e4m3fn and `X.weight_scale` exists. Before loading, each such Linear's
weight becomes an empty fp8 `QuantizedWeight` (`prepare`); the loader then copies the FP8
bytes as they are into `qweight` and each shard's scale, broadcast per row, into `scale`
(`targets`, `fit_scale`). Static activation scales (`input_scale`, `input_scale_ub`) are
dropped: activations are quantized per token, dynamically. Block-wise scales and integer
formats are refused by name.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors import safe_open
from torch import nn

from seq2serve.models.linear import Linear
from seq2serve.models.quantized_weight import FP8_DTYPE, QuantizedWeight

SCALE = ".weight_scale"
DROPPED = (".input_scale", ".input_scale_ub")
FORMATS = ("compressed-tensors", "fbgemm_fp8")


def check_config(model_dir: str) -> str | None:
    """The checkpoint's quantization method (one of FORMATS) or None; ValueError for a
    quantized checkpoint this loader cannot read."""
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        qc = json.load(f).get("quantization_config")
    if not qc:
        return None
    method = qc.get("quant_method")
    if method == "fbgemm_fp8":
        return method
    if method == "compressed-tensors":
        for name, group in (qc.get("config_groups") or {}).items():
            w = group.get("weights") or {}
            if (w.get("type"), w.get("num_bits"), w.get("strategy")) not in (
                    ("float", 8, "channel"), ("float", 8, "tensor")):
                raise ValueError(
                    f"{path}: compressed-tensors group {name!r} has weights of type "
                    f"{w.get('type')!r}, {w.get('num_bits')} bits, strategy "
                    f"{w.get('strategy')!r}; only FP8 weights (float, 8 bits) with channel or "
                    f"tensor scales are supported")
        return method
    raise ValueError(f"{path}: quantization_config quant_method {method!r} is not supported "
                     f"(FP8 checkpoints load: {', '.join(FORMATS)})")


def fp8_weights(files: list[str]) -> set[str]:
    """Checkpoint names `X.weight` stored in FP8 with an `X.weight_scale` beside them."""
    found = set()
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as f:
            names = set(f.keys())
            for name in names:
                if name.endswith(SCALE):
                    weight = name[:-len(SCALE)] + ".weight"
                    if weight in names and f.get_slice(weight).get_dtype() == "F8_E4M3":
                        found.add(weight)
    return found


def prepare(model: nn.Module, names: set[str], dtype: torch.dtype) -> int:
    """Give each Linear that `names` (FP8 checkpoint weights) fill an empty fp8
    QuantizedWeight; every shard of a fused layer must be FP8. Returns how many layers."""
    layers: dict[str, set] = {}
    for name in names:
        for pname, shard in model.weight_map(name) or []:
            layers.setdefault(pname, set()).add(shard)
    for pname, shards in layers.items():
        layer = model.get_submodule(pname.rpartition(".")[0])
        if not isinstance(layer, Linear) or not pname.endswith(".weight"):
            raise ValueError(f"checkpoint has an FP8 tensor for {pname!r}, which is not a "
                             f"linear layer's weight")
        wanted = set(range(len(layer.shard_sizes))) if layer.shard_sizes else {None}
        if shards != wanted:
            raise ValueError(f"{pname!r} is fused from checkpoint tensors of which only some "
                             f"are FP8: mixed precision in one fused layer is not supported")
        device = layer.weight.device
        del layer.weight
        layer.weight = QuantizedWeight(layer.out_features, layer.in_features, "fp8", dtype,
                                       layer.shard_sizes, device=device)
    return len(layers)


def targets(model: nn.Module, name: str, params: dict) -> list | None:
    """model.weight_map(name), redirected into QuantizedWeights: `X.weight` to its `qweight`,
    `X.weight_scale` to its `scale`; [] for a dropped activation scale; None if unknown."""
    if name.endswith(DROPPED):
        return []
    suffix = ".scale" if name.endswith(SCALE) else ".qweight"
    base = name[:-len(SCALE)] + ".weight" if suffix == ".scale" else name
    found = model.weight_map(base)
    if found is None:
        return None
    if suffix == ".scale" or any(p + ".qweight" in params for p, _ in found):
        return [(p + suffix, s) for p, s in found]
    return found


def fit_scale(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """A checkpoint's weight scale as one float32 per row: [rows, 1] or [rows] as it is, a
    per-tensor scale ([] or [1]) repeated."""
    t = tensor.float().reshape(-1)
    if t.numel() == 1:
        return t.expand(rows)
    if t.numel() != rows:
        raise ValueError(f"weight scale of shape {tuple(tensor.shape)} for {rows} rows: only "
                         f"per-channel or per-tensor scales are supported (not block-wise)")
    return t


def is_fp8(tensor: torch.Tensor) -> bool:
    return tensor.dtype == FP8_DTYPE
