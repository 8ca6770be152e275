"""Hugging Face Marian / M2M100 / mBART tensor names -> this model's parameters (and shard of a
fused weight)."""

from __future__ import annotations

import re

IGNORE: list[tuple[str, int | None]] = []

_QKV = {"q_proj": 0, "k_proj": 1, "v_proj": 2}
_LINEARS = {"self_attn.out_proj": "self_attn.o", "encoder_attn.q_proj": "cross_attn.q",
            "encoder_attn.out_proj": "cross_attn.o", "fc1": "ff.up", "fc2": "ff.down"}
_NORMS = {"self_attn_layer_norm": "self_attn_norm", "encoder_attn_layer_norm": "cross_attn_norm",
          "final_layer_norm": "ff_norm"}

LAYER = re.compile(r"model\.(encoder|decoder)\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_STACK = re.compile(r"model\.(encoder|decoder)\.(embed_tokens|embed_positions|layernorm_embedding"
                    r"|layer_norm)\.(weight|bias|weights|_float_tensor)$")


def layer_targets(m: re.Match) -> list[tuple[str, int | None]] | None:
    """A block's tensor (`LAYER`'s match: stack, layer, module, leaf) -> its parameters: HF's
    q/k/v projections fused (self-attention's q/k/v, cross-attention's k/v), the rest 1:1.
    Whisper's blocks are these."""
    stack, layer, module, leaf = m[1], m[2], m[3], m[4]
    prefix = f"{stack}_layers.{layer}"
    sub, _, proj = module.rpartition(".")
    if sub in ("self_attn", "encoder_attn") and proj in _QKV:
        if sub == "self_attn":
            return [(f"{prefix}.self_attn.qkv.{leaf}", _QKV[proj])]
        if proj != "q_proj":
            return [(f"{prefix}.cross_attn.kv.{leaf}", _QKV[proj] - 1)]
    target = _LINEARS.get(module) or _NORMS.get(module)
    return [(f"{prefix}.{target}.{leaf}", None)] if target else None


def block_names(stack: str, layers: int) -> list[str]:
    """Every tensor of a stack's blocks in an HF checkpoint (with k_proj's bias)."""
    attns = ("self_attn", "encoder_attn") if stack == "decoder" else ("self_attn",)
    mods = [f"{a}.{p}_proj" for a in attns for p in ("q", "k", "v", "out")]
    mods += ["fc1", "fc2", "final_layer_norm"] + [f"{a}_layer_norm" for a in attns]
    return [f"model.{stack}.layers.{i}.{m}.{leaf}" for i in range(layers) for m in mods
            for leaf in ("weight", "bias")]


def load_priority(name: str) -> int:
    """model.shared.weight loads first: where the checkpoint also has the stacks' own
    embed_tokens (untied in transformers 5, equal copies in older checkpoints), they win."""
    return 0 if name == "model.shared.weight" else 1


def hf_to_param(name: str, cfg) -> list[tuple[str, int | None]] | None:
    """The (parameter, shard) pairs a checkpoint tensor fills; [] to ignore; None if unknown."""
    if name == "model.shared.weight":
        return [("shared.weight", None)] + ([] if cfg.decoder_shares_embedding
                                             else [("decoder_embed.weight", None)])
    if name in ("lm_head.weight", "final_logits_bias"):
        return [(name, None)]
    m = LAYER.match(name)
    if m:
        return layer_targets(m)
    m = _STACK.match(name)
    if not m:
        return None
    stack, part, leaf = m[1], m[2], m[3]
    if part == "embed_tokens":
        shared = stack == "encoder" or cfg.decoder_shares_embedding
        return [("shared.weight" if shared else "decoder_embed.weight", None)]
    if part == "embed_positions":
        if cfg.family.positions == "learned" and leaf == "weight":
            return [(f"{stack}_positions.weight", None)]
        return IGNORE  # sinusoids: computed (older checkpoints carry a copy)
    norm = f"{stack}_embed_norm" if part == "layernorm_embedding" else f"{stack}_norm"
    return [(f"{norm}.{leaf}", None)]


def checkpoint_names(cfg) -> list[str]:
    """Every tensor a complete HF checkpoint of this config has (lm_head optional when tied)."""
    fam = cfg.family
    names = ["model.shared.weight", "lm_head.weight"]
    if not cfg.decoder_shares_embedding:
        names.append("model.decoder.embed_tokens.weight")
    if fam.logits_bias:
        names.append("final_logits_bias")
    for stack, n in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        s = f"model.{stack}"
        if fam.positions == "learned":
            names.append(f"{s}.embed_positions.weight")
        for part, on in (("layernorm_embedding", fam.embed_norm), ("layer_norm", fam.final_norm)):
            if on:
                names += [f"{s}.{part}.weight", f"{s}.{part}.bias"]
        names += block_names(stack, n)
    return names
