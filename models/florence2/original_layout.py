"""Florence-2's original Hub layout (microsoft/Florence-2-base, -large and their fine-tunes: the
remote-code checkpoints) read as the transformers-5 layout this family loads, as HF's
`convert_florence2_original_pytorch_to_hf.py` converts one into the other.

- config.json: `text_config` is a BART config under `model_type` "florence2_language"; the
  `vision_config` ("davit") names its stage widths `dim_embed`, nests the 2-D position table's
  size (`image_pos_embed.max_pos_embeddings`) and the temporal table's
  (`visual_temporal_embedding.max_temporal_embeddings`), and lists the projector's
  `image_feature_source`; the original DaViT has GELU, biased q/k/v and an MLP ratio of 4
  whatever the config says.
- tensors: the tower's modules are wrapped (`conv1.fn.dw`, `window_attn.fn.qkv`,
  `ffn.fn.net.fc1`; a block's norms inside its attention and MLP wrappers), the projector's
  live at the top level (`image_projection` is a bare [in, out] matrix, transposed here into
  the Linear's [out, in]), the language model is `language_model.model.*` and
  `language_model.lm_head`; `language_model.final_logits_bias` is not read (HF's conversion
  drops it too).
"""

from __future__ import annotations

import re
from typing import Any

import torch

_FEATURE_SOURCE = ["spatial_avg_pool", "temporal_avg_pool"]  # the pooled token, then the grid
_STAGE_FIELDS = ("depths", "patch_size", "patch_stride", "patch_padding", "patch_prenorm",
                 "num_heads", "num_groups")
# the original Florence2VisionConfig's defaults (Florence-2-large's tower)
_VISION_DEFAULTS = dict(depths=[1, 1, 9, 1], patch_size=[7, 3, 3, 3], patch_stride=[4, 2, 2, 2],
                        patch_padding=[3, 1, 1, 1], patch_prenorm=[False, True, True, True],
                        dim_embed=[256, 512, 1024, 2048], num_heads=[8, 16, 32, 64],
                        num_groups=[8, 16, 32, 64], window_size=12, projection_dim=1024)
_ORIGINAL_VOCAB = 51289  # the original Florence2LanguageConfig's vocab_size default

PROJECTION = "image_projection"  # stored [in, out]: the Linear's weight transposed
IGNORED = frozenset({"language_model.final_logits_bias"})

# whole-name prefixes: original -> transformers 5 (the first that matches)
_PREFIXES = [
    (re.compile(r"language_model\.model\."), "model.language_model."),
    (re.compile(r"language_model\.lm_head\.weight$"), "lm_head.weight"),
    (re.compile(r"image_projection$"), "model.multi_modal_projector.image_projection.weight"),
    (re.compile(r"image_proj_norm\."), "model.multi_modal_projector.image_proj_norm."),
    (re.compile(r"image_pos_embed\."), "model.multi_modal_projector.image_position_embed."),
    (re.compile(r"visual_temporal_embed\."), "model.multi_modal_projector.visual_temporal_embed."),
    (re.compile(r"vision_tower\.convs\.(\d+)\.proj\."), r"model.vision_tower.convs.\1.conv."),
    (re.compile(r"vision_tower\.convs\.(\d+)\.norm\."), r"model.vision_tower.convs.\1.norm."),
]
_BLOCK = re.compile(r"vision_tower\.blocks\.(\d+)\.(\d+)\.(spatial_block|channel_block)\.(.+)$")
# inside a block: the wrappers unwrapped, each norm named by its place
_BLOCK_PARTS = [
    (re.compile(r"conv([12])\.fn\.dw\."), r"conv\1."),
    (re.compile(r"(window_attn|channel_attn)\.norm\."), "norm1."),
    (re.compile(r"(window_attn|channel_attn)\.fn\.(qkv|proj)\."), r"\1.\2."),
    (re.compile(r"ffn\.norm\."), "norm2."),
    (re.compile(r"ffn\.fn\.net\.(fc[12])\."), r"ffn.\1."),
]


def is_original(cfg: dict[str, Any]) -> bool:
    """A config.json of the original layout (its sub-configs' model types, or the tower's
    `dim_embed`)."""
    text, vision = cfg.get("text_config") or {}, cfg.get("vision_config") or {}
    return (text.get("model_type") == "florence2_language"
            or vision.get("model_type") == "davit" or "dim_embed" in vision)


def convert_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """An original config.json as transformers 5 writes it (what `Florence2Config.from_hf`
    reads); a tower the family cannot build is a ValueError naming the field."""
    v = {**_VISION_DEFAULTS, **cfg["vision_config"]}
    positions = v.get("image_pos_embed") or {"type": "learned_abs_2d", "max_pos_embeddings": 50}
    temporal = v.get("visual_temporal_embedding") or {"type": "COSINE",
                                                      "max_temporal_embeddings": 100}
    for field, value, want in (("image_pos_embed.type", positions.get("type"), "learned_abs_2d"),
                               ("visual_temporal_embedding.type", temporal.get("type"), "COSINE"),
                               ("image_feature_source", list(v.get("image_feature_source",
                                                                   _FEATURE_SOURCE)),
                                _FEATURE_SOURCE)):
        if value != want:
            raise ValueError(f"config.json: vision_config.{field} {value!r} is not supported "
                             f"(Florence-2's is {want!r})")
    vision = {k: v[k] for k in _STAGE_FIELDS}
    vision.update(embed_dim=v["dim_embed"], window_size=v["window_size"],
                  projection_dim=v["projection_dim"],
                  max_position_embeddings=positions["max_pos_embeddings"],
                  max_temporal_embeddings=temporal["max_temporal_embeddings"],
                  activation_function="gelu", qkv_bias=True, mlp_ratio=4.0)
    text = {"vocab_size": _ORIGINAL_VOCAB, **cfg["text_config"], "model_type": "bart"}
    return {**cfg, "vision_config": vision, "text_config": text}


def renamed(name: str) -> str | None:
    """The transformers-5 name of an original tensor; None for a name of neither layout."""
    block = _BLOCK.match(name)
    if block:
        stage, index, kind, rest = block.groups()
        for pattern, repl in _BLOCK_PARTS:
            if pattern.match(rest):
                rest = pattern.sub(repl, rest, count=1)
                return f"model.vision_tower.blocks.{stage}.{index}.{kind}.{rest}"
        return None
    for pattern, repl in _PREFIXES:
        if pattern.match(name):
            return pattern.sub(repl, name, count=1)
    return None


def as_stored(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """An original tensor as its transformers-5 parameter holds it."""
    return tensor.t() if name == PROJECTION else tensor
