"""Hugging Face Florence-2 tensor names (transformers 5's layout: `model.vision_tower.*`,
`model.multi_modal_projector.*`, `model.language_model.*`, `lm_head.weight`) -> this model's
parameters. The language model's are BART's map under the `language_model.` prefix; the
vision tower's and the projector's keep their names. A checkpoint in the original Hub layout
(`Florence2Config.original_layout`) is renamed first (`original_layout.py`)."""

from __future__ import annotations

from seq2serve.models.bart import weights as bart
from seq2serve.models.florence2 import original_layout

_LM = "model.language_model."
_OWN = ("model.vision_tower.", "model.multi_modal_projector.")
# computed, not read: the projector uses only the cosine table's first row (vision.py)
_COMPUTED = "model.multi_modal_projector.visual_temporal_embed.pos_idx_to_embed"


def hf_to_param(name: str, cfg) -> list[tuple[str, int | None]] | None:
    """The (parameter, shard) pairs a checkpoint tensor fills; [] to ignore; None if unknown."""
    if cfg.original_layout:
        if name in original_layout.IGNORED:
            return []
        name = original_layout.renamed(name)
        if name is None:
            return None
    if name == "lm_head.weight":
        return [("language_model.lm_head.weight", None)]
    if name.startswith(_LM):
        targets = bart.hf_to_param("model." + name[len(_LM):], cfg.text)
        return None if targets is None else [("language_model." + p, s) for p, s in targets]
    if name == _COMPUTED:
        return []
    if name.startswith(_OWN):
        return [(name[len("model."):], None)]
    return None


def load_priority(name: str) -> int:
    """The shared embedding first: the stacks' own embed_tokens, where present, win."""
    return 0 if name == _LM + "shared.weight" else 1


def checkpoint_names(cfg) -> list[str]:
    """Every tensor a complete HF checkpoint of this config has (lm_head optional when tied)."""
    names = [n if n == "lm_head.weight" else _LM + n[len("model."):]
             for n in bart.checkpoint_names(cfg.text)]
    v = cfg.vision
    tower = "model.vision_tower"
    for i in range(len(v.depths)):
        names += [f"{tower}.convs.{i}.{m}.{leaf}" for m in ("conv", "norm")
                  for leaf in ("weight", "bias")]
        for b in range(v.depths[i]):
            for block, attn in (("spatial_block", "window_attn"),
                                ("channel_block", "channel_attn")):
                base = f"{tower}.blocks.{i}.{b}.{block}"
                mods = ("conv1", "conv2", "norm1", "norm2", "ffn.fc1", "ffn.fc2",
                        f"{attn}.proj")
                names += [f"{base}.{m}.{leaf}" for m in mods for leaf in ("weight", "bias")]
                names += [f"{base}.{attn}.qkv.weight"]
                names += [f"{base}.{attn}.qkv.bias"] if v.qkv_bias else []
    proj = "model.multi_modal_projector"
    names += [f"{proj}.image_projection.weight", f"{proj}.image_proj_norm.weight",
              f"{proj}.image_proj_norm.bias", f"{proj}.image_position_embed.row_embeddings.weight",
              f"{proj}.image_position_embed.column_embeddings.weight"]
    return names
