"""Florence-2's original Hub layout (models/florence2/original_layout.py): the tiny checkpoint's
weights written under the original names, with an original-style config.json (as
microsoft/Florence-2-large ships them: `florence2_language` / `davit` sub-configs), are served
with the tokens HF's generate gives on the transformers-5 checkpoint of the same weights. The
renaming here is the inverse of the table in HF's `convert_florence2_original_pytorch_to_hf.py`,
written out on its own (not seq2serve's)."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from seq2serve import Seq2SeqEngine
from seq2serve.tests.florence2_checkpoints import write_florence2_checkpoint

MAX_NEW = 12
TASKS = ["<CAPTION>", "<OD>", "<OCR>"]
IMAGES = [Image.fromarray((np.random.RandomState(s).rand(40, 50, 3) * 255).astype("uint8"))
          for s in range(3)]
SAMPLING = {"max_new_tokens": MAX_NEW, "temperature": 0, "no_repeat_ngram_size": 3,
            "min_new_tokens": 2}

# transformers 5 -> original, inside a DaViT block (HF's conversion table read backwards)
_BLOCK = {"conv1.": "conv1.fn.dw.", "conv2.": "conv2.fn.dw.", "norm2.": "ffn.norm.",
          "ffn.fc1.": "ffn.fn.net.fc1.", "ffn.fc2.": "ffn.fn.net.fc2.",
          "window_attn.qkv.": "window_attn.fn.qkv.", "window_attn.proj.": "window_attn.fn.proj.",
          "channel_attn.qkv.": "channel_attn.fn.qkv.",
          "channel_attn.proj.": "channel_attn.fn.proj."}
_PROJ = "model.multi_modal_projector."


def original_name(name: str) -> str:
    if name == "lm_head.weight":
        return "language_model.lm_head.weight"
    if name.startswith("model.language_model."):
        return "language_model.model." + name[len("model.language_model."):]
    if name == _PROJ + "image_projection.weight":
        return "image_projection"
    if name.startswith(_PROJ):
        rest = name[len(_PROJ):]
        return rest.replace("image_position_embed.", "image_pos_embed.")
    m = re.match(r"model\.vision_tower\.convs\.(\d+)\.(conv|norm)\.(\w+)$", name)
    if m:
        return f"vision_tower.convs.{m[1]}.{'proj' if m[2] == 'conv' else 'norm'}.{m[3]}"
    m = re.match(r"model\.vision_tower\.blocks\.(\d+\.\d+)\.(spatial|channel)_block\.(.+)$", name)
    assert m, name
    rest = m[3]
    if rest.startswith("norm1."):
        attn = "window_attn" if m[2] == "spatial" else "channel_attn"
        rest = f"{attn}.norm." + rest[len("norm1."):]
    else:
        prefix = next(p for p in _BLOCK if rest.startswith(p))
        rest = _BLOCK[prefix] + rest[len(prefix):]
    return f"vision_tower.blocks.{m[1]}.{m[2]}_block.{rest}"


def original_config(cfg: dict) -> dict:
    """config.json as the original remote-code Florence2Config writes it."""
    v = cfg["vision_config"]
    vision = {"model_type": "davit", "drop_path_rate": 0.1, "enable_checkpoint": False,
              "dim_embed": v["embed_dim"], "window_size": v["window_size"],
              "projection_dim": v["projection_dim"],
              "image_pos_embed": {"type": "learned_abs_2d",
                                  "max_pos_embeddings": v["max_position_embeddings"]},
              "visual_temporal_embedding": {"type": "COSINE",
                                            "max_temporal_embeddings":
                                                v["max_temporal_embeddings"]},
              "image_feature_source": ["spatial_avg_pool", "temporal_avg_pool"],
              **{k: v[k] for k in ("depths", "patch_size", "patch_stride", "patch_padding",
                                   "patch_prenorm", "num_heads", "num_groups")}}
    text = {**cfg["text_config"], "model_type": "florence2_language"}
    return {"architectures": ["Florence2ForConditionalGeneration"], "model_type": "florence2",
            "auto_map": {"AutoConfig": "configuration_florence2.Florence2Config"},
            "vision_config": vision, "text_config": text, "vocab_size": text["vocab_size"],
            "projection_dim": v["projection_dim"], "ignore_index": -100, "bos_token_id": 0,
            "eos_token_id": 2, "pad_token_id": 1, "is_encoder_decoder": True}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(the transformers-5 checkpoint, the same in the original layout)."""
    root = tmp_path_factory.mktemp("florence_layouts")
    hf = write_florence2_checkpoint("tied", root / "hf", eos_boost=2.5)
    orig = root / "original"
    shutil.copytree(hf, orig, ignore=shutil.ignore_patterns("model.safetensors", "config.json"))
    weights = load_file(str(hf / "model.safetensors"))
    renamed = {original_name(k): (t.t().contiguous() if k.endswith("image_projection.weight")
                                  else t) for k, t in weights.items()}
    vocab = weights["model.language_model.shared.weight"].shape[0]
    renamed["language_model.final_logits_bias"] = torch.zeros(1, vocab)  # the original has it
    assert not set(renamed) & set(weights)  # no name kept its transformers-5 spelling
    save_file(renamed, str(orig / "model.safetensors"))
    cfg = json.loads((hf / "config.json").read_text())
    (orig / "config.json").write_text(json.dumps(original_config(cfg)))
    return hf, orig


@torch.no_grad()
def test_original_layout_generates_as_hf(checkpoints):
    from transformers import AutoProcessor, Florence2ForConditionalGeneration

    hf, orig = checkpoints
    processor = AutoProcessor.from_pretrained(str(hf))
    model = Florence2ForConditionalGeneration.from_pretrained(str(hf), dtype=torch.float32)
    want = []
    for task, image in zip(TASKS, IMAGES):
        out = model.eval().generate(**processor(text=task, images=image, return_tensors="pt"),
                                    max_new_tokens=MAX_NEW, do_sample=False,
                                    no_repeat_ngram_size=3, min_new_tokens=2)
        seq = out[0, 1:].tolist()
        want.append(seq[: seq.index(2) + 1] if 2 in seq else seq)
    with Seq2SeqEngine(model_path=str(orig), device="cpu", dtype="float32") as engine:
        got = engine.generate(prompt=TASKS, image_data=[[im] for im in IMAGES],
                              sampling_params=SAMPLING)
    assert [g["output_ids"] for g in got] == want
    assert len({tuple(w) for w in want}) > 1  # the images and tasks matter


@pytest.mark.parametrize("field, value, message", [
    ("image_feature_source", ["last_frame"], "image_feature_source"),
    ("image_pos_embed", {"type": "sine", "max_pos_embeddings": 12}, "image_pos_embed.type"),
])
def test_an_original_tower_it_cannot_build_is_refused(checkpoints, field, value, message):
    from seq2serve.models.florence2.config import Florence2Config

    _, orig = checkpoints
    cfg = json.loads((orig / "config.json").read_text())
    assert Florence2Config.from_hf(cfg).original_layout
    cfg["vision_config"][field] = value
    with pytest.raises(ValueError, match=message):
        Florence2Config.from_hf(cfg)
