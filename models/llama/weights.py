"""Hugging Face Llama tensor names -> this model's parameters (and shard of a fused weight)."""

from __future__ import annotations

import re

_QKV = {"q_proj": 0, "k_proj": 1, "v_proj": 2}
_MLP = {"gate_proj": ("gate_up", 0), "up_proj": ("gate_up", 1), "down_proj": ("down", None)}
_LAYER = re.compile(r"model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.weight$")
_NORM = re.compile(r"model\.layers\.(\d+)\.(input_layernorm|post_attention_layernorm)\.weight$")


def layer_param(prefix: str, m: re.Match) -> list[tuple[str, int | None]]:
    """Map a decoder layer's tensor (matched by _LAYER) under our module `prefix`."""
    layer, block, name = m[1], m[2], m[3]
    if block == "self_attn":
        if name == "o_proj":
            return [(f"{prefix}.{layer}.self_attn.o_proj.weight", None)]
        if name in _QKV:
            return [(f"{prefix}.{layer}.self_attn.qkv_proj.weight", _QKV[name])]
    elif name in _MLP:
        target, shard = _MLP[name]
        return [(f"{prefix}.{layer}.mlp.{target}.weight", shard)]
    return None


def hf_to_param(name: str) -> list[tuple[str, int | None]] | None:
    """The (parameter, shard) pairs a checkpoint tensor fills; [] to ignore; None if unknown."""
    if name == "model.embed_tokens.weight":
        return [("embed_tokens.weight", None)]
    if name == "model.norm.weight":
        return [("norm.weight", None)]
    if name == "lm_head.weight":
        return [("lm_head.weight", None)]
    if name.endswith("rotary_emb.inv_freq"):
        return []  # recomputed from the config
    m = _LAYER.match(name)
    if m:
        return layer_param("layers", m)
    m = _NORM.match(name)
    if m:
        return [(f"layers.{m[1]}.{m[2]}.weight", None)]
    return None


def checkpoint_names(cfg) -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        names += [f"{p}.self_attn.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        names += [f"{p}.mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")]
        names += [f"{p}.input_layernorm.weight", f"{p}.post_attention_layernorm.weight"]
    return names
