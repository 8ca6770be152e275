"""Hugging Face T5/mT5/UMT5 tensor names -> this model's parameters (and shard of a fused
weight)."""

from __future__ import annotations

import re

IGNORE: list[tuple[str, int | None]] = []

_ATTN = {"q": 0, "k": 1, "v": 2}
_FF = {"wi_0": ("gate_up", 0), "wi_1": ("gate_up", 1), "wi": ("up", None), "wo": ("down", None)}

_RULES: list[tuple[re.Pattern, object]] = []


def _rule(pattern: str):
    def register(fn):
        _RULES.append((re.compile(pattern + r"$"), fn))
        return fn
    return register


@_rule(r"(shared|encoder\.embed_tokens|decoder\.embed_tokens)\.weight")
def _embed(m):
    return [("shared.weight", None)]


@_rule(r"lm_head\.weight")
def _lm_head(m):
    return [("lm_head.weight", None)]


@_rule(r"(encoder|decoder)\.final_layer_norm\.weight")
def _final_norm(m):
    return [(f"{m[1]}_norm.weight", None)]


@_rule(r"(encoder|decoder)\.block\.(\d+)\.layer\.0\.SelfAttention\.relative_attention_bias"
       r"\.weight")
def _bias(m):  # T5's first layer's, shared by the stack; UMT5's every layer's
    return [(f"{m[1]}_bias.{m[2]}.weight", None)]


@_rule(r"decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight")
def _unused_cross_bias(m):
    return IGNORE  # present in some checkpoints, never used (HF ignores it too)


@_rule(r"(encoder|decoder)\.block\.(\d+)\.layer\.0\.SelfAttention\.([qkvo])\.weight")
def _self_attn(m):
    prefix = f"{m[1]}_layers.{m[2]}.self_attn"
    if m[3] == "o":
        return [(f"{prefix}.o.weight", None)]
    return [(f"{prefix}.qkv.weight", _ATTN[m[3]])]


@_rule(r"decoder\.block\.(\d+)\.layer\.1\.EncDecAttention\.([qkvo])\.weight")
def _cross_attn(m):
    prefix = f"decoder_layers.{m[1]}.cross_attn"
    if m[2] in ("q", "o"):
        return [(f"{prefix}.{m[2]}.weight", None)]
    return [(f"{prefix}.kv.weight", _ATTN[m[2]] - 1)]


@_rule(r"encoder\.block\.(\d+)\.layer\.([01])\.layer_norm\.weight")
def _encoder_norm(m):
    name = "attn_norm" if m[2] == "0" else "ff_norm"
    return [(f"encoder_layers.{m[1]}.{name}.weight", None)]


@_rule(r"decoder\.block\.(\d+)\.layer\.([012])\.layer_norm\.weight")
def _decoder_norm(m):
    name = ("self_attn_norm", "cross_attn_norm", "ff_norm")[int(m[2])]
    return [(f"decoder_layers.{m[1]}.{name}.weight", None)]


@_rule(r"(encoder\.block\.(\d+)\.layer\.1|decoder\.block\.(\d+)\.layer\.2)"
       r"\.DenseReluDense\.(wi_0|wi_1|wi|wo)\.weight")
def _feed_forward(m):
    stack, layer = ("encoder", m[2]) if m[2] is not None else ("decoder", m[3])
    target, shard = _FF[m[4]]
    return [(f"{stack}_layers.{layer}.ff.{target}.weight", shard)]


def hf_to_param(name: str) -> list[tuple[str, int | None]] | None:
    """The (parameter, shard) pairs a checkpoint tensor fills; [] to ignore; None if unknown."""
    for pattern, fn in _RULES:
        m = pattern.match(name)
        if m:
            return fn(m)
    return None


def checkpoint_names(cfg) -> list[str]:
    """Every tensor a complete HF checkpoint of this config has (lm_head optional when tied)."""
    names = ["shared.weight", "encoder.final_layer_norm.weight", "decoder.final_layer_norm.weight",
             "lm_head.weight"]
    ff = ("wi_0", "wi_1", "wo") if cfg.is_gated else ("wi", "wo")
    for stack, n, ff_layer in (("encoder", cfg.num_layers, 1),
                               ("decoder", cfg.num_decoder_layers, 2)):
        for i in range(n):
            b = f"{stack}.block.{i}.layer"
            names += [f"{b}.0.SelfAttention.{p}.weight" for p in "qkvo"]
            if i == 0 or cfg.bias_per_layer:
                names.append(f"{b}.0.SelfAttention.relative_attention_bias.weight")
            names += [f"{b}.{j}.layer_norm.weight" for j in range(ff_layer + 1)]
            names += [f"{b}.{ff_layer}.DenseReluDense.{w}.weight" for w in ff]
            if stack == "decoder":
                names += [f"{b}.1.EncDecAttention.{p}.weight" for p in "qkvo"]
    return names
