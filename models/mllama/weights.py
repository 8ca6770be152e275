"""Hugging Face Mllama tensor names -> this model's parameters. Both layouts are accepted: the
Hub's (`language_model.model.*`, `vision_model.*`) and transformers 5's (`model.*`)."""

from __future__ import annotations

import re

from seq2serve.models.llama.weights import _LAYER as _TEXT_LAYER
from seq2serve.models.llama.weights import layer_param

_PREFIXES = (  # (checkpoint prefix, our prefix)
    ("model.language_model.", "text:"), ("language_model.model.", "text:"),
    ("model.vision_model.", "vision_model."), ("vision_model.", "vision_model."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("multi_modal_projector.", "multi_modal_projector."),
    ("language_model.lm_head.", "lm_head."), ("lm_head.", "lm_head."),
)
_VISION_LAYER = re.compile(
    r"(transformer|global_transformer)\.layers\.(\d+)\.(self_attn\.([qkvo])_proj|mlp\.(fc[12])"
    r"|input_layernorm|post_attention_layernorm|gate_attn|gate_ffn)(\.weight|\.bias)?$")
_CROSS = re.compile(r"layers\.(\d+)\.(cross_attn\.([qkvo])_proj\.weight|cross_attn\.([qk])_norm"
                    r"\.weight|cross_attn_attn_gate|cross_attn_mlp_gate)$")
_NORM = re.compile(r"layers\.(\d+)\.(input_layernorm|post_attention_layernorm)\.weight$")


def hf_to_param(name: str) -> list[tuple[str, int | None]] | None:
    for prefix, ours in _PREFIXES:
        if name.startswith(prefix):
            rest = name[len(prefix):]
            if ours == "text:":
                return _text(rest)
            if ours == "vision_model.":
                return _vision(rest)
            return [(ours + rest, None)]
    return None


def _text(rest: str) -> list[tuple[str, int | None]] | None:
    if rest in ("embed_tokens.weight", "norm.weight"):
        return [(rest, None)]
    if rest.endswith("rotary_emb.inv_freq"):
        return []
    m = _TEXT_LAYER.match("model." + rest)
    if m:
        return layer_param("layers", m)
    m = _CROSS.match(rest)
    if m:
        layer, what = m[1], m[2]
        base = f"layers.{layer}.cross_attn"
        if m[3] in ("q", "o"):
            return [(f"{base}.{m[3]}_proj.weight", None)]
        if m[3] in ("k", "v"):
            return [(f"{base}.kv_proj.weight", 0 if m[3] == "k" else 1)]
        if m[4]:
            return [(f"{base}.{m[4]}_norm.weight", None)]
        return [(f"layers.{layer}.{what}", None)]
    m = _NORM.match(rest)
    if m:
        return [(f"layers.{m[1]}.{m[2]}.weight", None)]
    return None


def _vision(rest: str) -> list[tuple[str, int | None]] | None:
    m = _VISION_LAYER.match(rest)
    if not m:
        return [("vision_model." + rest, None)]  # embeddings and norms keep their names
    stack, layer, what, suffix = m[1], m[2], m[3], m[6] or ""
    base = f"vision_model.{stack}.{layer}"
    if m[4]:  # attention projections
        if m[4] == "o":
            return [(f"{base}.self_attn.o_proj.weight", None)]
        return [(f"{base}.self_attn.qkv_proj.weight", "qkv".index(m[4]))]
    if m[5]:
        return [(f"{base}.{m[5]}{suffix}", None)]
    return [(f"{base}.{what}{suffix}", None)]


def checkpoint_names(cfg) -> list[str]:
    """Names of transformers 5's layout, for error messages."""
    names = ["model.language_model.embed_tokens.weight", "model.language_model.norm.weight",
             "model.multi_modal_projector.weight", "model.multi_modal_projector.bias",
             "lm_head.weight"]
    t = cfg.text
    for i in range(t.num_hidden_layers):
        p = f"model.language_model.layers.{i}"
        if i in cfg.cross_attention_layers:
            names += [f"{p}.cross_attn.{n}_proj.weight" for n in "qkvo"]
            names += [f"{p}.cross_attn.q_norm.weight", f"{p}.cross_attn.k_norm.weight",
                      f"{p}.cross_attn_attn_gate", f"{p}.cross_attn_mlp_gate"]
        else:
            names += [f"{p}.self_attn.{n}_proj.weight" for n in "qkvo"]
        names += [f"{p}.mlp.{n}_proj.weight" for n in ("gate", "up", "down")]
        names += [f"{p}.input_layernorm.weight", f"{p}.post_attention_layernorm.weight"]
    return names
