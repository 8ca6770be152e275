"""Hugging Face Whisper tensor names -> this model's parameters (and shard of a fused weight).
Whisper's k_proj has no bias: the fused biases' k parts are zero (`model.absent_shards`)."""

from __future__ import annotations

import re

_QKV = {"q_proj": 0, "k_proj": 1, "v_proj": 2}
_LINEARS = {"self_attn.out_proj": "self_attn.o", "encoder_attn.q_proj": "cross_attn.q",
            "encoder_attn.out_proj": "cross_attn.o", "fc1": "ff.up", "fc2": "ff.down"}
_NORMS = {"self_attn_layer_norm": "self_attn_norm", "encoder_attn_layer_norm": "cross_attn_norm",
          "final_layer_norm": "ff_norm"}
_STACK = {"model.encoder.conv1.weight": "conv1.weight", "model.encoder.conv1.bias": "conv1.bias",
          "model.encoder.conv2.weight": "conv2.weight", "model.encoder.conv2.bias": "conv2.bias",
          "model.encoder.embed_positions.weight": "encoder_positions",
          "model.encoder.layer_norm.weight": "encoder_norm.weight",
          "model.encoder.layer_norm.bias": "encoder_norm.bias",
          "model.decoder.embed_tokens.weight": "embed_tokens.weight",
          "model.decoder.embed_positions.weight": "decoder_positions",
          "model.decoder.layer_norm.weight": "decoder_norm.weight",
          "model.decoder.layer_norm.bias": "decoder_norm.bias",
          "proj_out.weight": "lm_head.weight"}

_LAYER = re.compile(r"model\.(encoder|decoder)\.layers\.(\d+)\.(.+)\.(weight|bias)$")


def hf_to_param(name: str, cfg) -> list[tuple[str, int | None]] | None:
    """The (parameter, shard) pairs a checkpoint tensor fills; None if unknown."""
    if name in _STACK:
        return [(_STACK[name], None)]
    m = _LAYER.match(name)
    if not m:
        return None
    stack, layer, module, leaf = m[1], m[2], m[3], m[4]
    prefix = f"{stack}_layers.{layer}"
    sub, _, proj = module.rpartition(".")
    if sub in ("self_attn", "encoder_attn") and proj in _QKV:
        if proj == "k_proj" and leaf == "bias":
            return None  # Whisper's keys have no bias
        if sub == "self_attn":
            return [(f"{prefix}.self_attn.qkv.{leaf}", _QKV[proj])]
        if proj != "q_proj":
            return [(f"{prefix}.cross_attn.kv.{leaf}", _QKV[proj] - 1)]
    target = _LINEARS.get(module) or _NORMS.get(module)
    return [(f"{prefix}.{target}.{leaf}", None)] if target else None


def checkpoint_names(cfg) -> list[str]:
    """Every tensor a complete HF checkpoint of this config has (proj_out optional when tied)."""
    names = list(_STACK)
    for stack, n in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        attns = ("self_attn", "encoder_attn") if stack == "decoder" else ("self_attn",)
        for i in range(n):
            b = f"model.{stack}.layers.{i}"
            mods = [f"{a}.{p}_proj" for a in attns for p in ("q", "k", "v", "out")]
            mods += ["fc1", "fc2", "final_layer_norm"] + [f"{a}_layer_norm" for a in attns]
            names += [f"{b}.{m}.{leaf}" for m in mods for leaf in ("weight", "bias")
                      if not (m.endswith("k_proj") and leaf == "bias")]
    return names
