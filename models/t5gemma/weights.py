"""Hugging Face T5Gemma tensor names -> this model's parameters (and shard of a fused weight).
The module names follow HF's, so most names map to themselves without the `model.` prefix;
q/k/v (and the cross-attention's k/v) fill shards of one fused projection."""

from __future__ import annotations

import re

_QKV = {"q_proj": 0, "k_proj": 1, "v_proj": 2}
_CROSS = {"q_proj": ("q_proj", None), "k_proj": ("kv_proj", 0), "v_proj": ("kv_proj", 1),
          "o_proj": ("o_proj", None)}
_MLP = {"gate_proj": ("gate_up", 0), "up_proj": ("gate_up", 1), "down_proj": ("down", None)}
_LAYER = re.compile(r"model\.(encoder|decoder)\.layers\.(\d+)\.(self_attn|cross_attn|mlp)"
                    r"\.(\w+)\.weight$")
_PLAIN = re.compile(r"model\.((?:encoder|decoder)\.(?:embed_tokens|norm|layers\.\d+\.\w+_layernorm)"
                    r"\.weight)$")


def hf_to_param(name: str) -> list[tuple[str, int | None]] | None:
    """The (parameter, shard) pairs a checkpoint tensor fills; [] to ignore; None if unknown."""
    if name == "lm_head.out_proj.weight":
        return [("lm_head.weight", None)]
    m = _PLAIN.match(name)
    if m:
        return [(m[1], None)]
    m = _LAYER.match(name)
    if not m:
        return None
    prefix = f"{m[1]}.layers.{m[2]}.{m[3]}"
    block, proj = m[3], m[4]
    if block == "mlp" and proj in _MLP:
        target, shard = _MLP[proj]
        return [(f"{prefix}.{target}.weight", shard)]
    if block == "self_attn" and proj in _QKV:
        return [(f"{prefix}.qkv_proj.weight", _QKV[proj])]
    if block == "self_attn" and proj == "o_proj":
        return [(f"{prefix}.o_proj.weight", None)]
    if block == "cross_attn" and proj in _CROSS:
        target, shard = _CROSS[proj]
        return [(f"{prefix}.{target}.weight", shard)]
    return None
