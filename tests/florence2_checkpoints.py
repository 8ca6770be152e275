"""Tiny random Florence-2 checkpoints (`Florence2ForConditionalGeneration`, saved by HF) with
the processor files the engine and HF's `Florence2Processor` read: a tiny byte-level BART
tokenizer with the `<image>` token (and, if asked, the answers' `<loc_*>` tokens), a CLIP image
processor of a small size, and the post-processor's settings (`post_process_generation`).

Two shapes: a two-stage tower (GELU, square images, the head tied to the shared embedding,
unscaled embeddings) and a three-stage one (ReLU, deeper stages, no q/k/v bias, non-square
images, an untied head, scaled embeddings); both tile their grids with a window that does not
divide them, so that window attention pads."""

from __future__ import annotations

from pathlib import Path

import torch

from seq2serve.tests.bart_cnn_checkpoints import _tokenizer

SHAPES: dict[str, dict] = {
    "tied": dict(
        vision=dict(depths=[1, 1], patch_size=[7, 3], patch_stride=[4, 2], patch_padding=[3, 1],
                    patch_prenorm=[False, True], embed_dim=[16, 32], num_heads=[2, 4],
                    num_groups=[2, 4], window_size=3, projection_dim=24,
                    max_position_embeddings=12),
        text=dict(d_model=24, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                  decoder_attention_heads=3, encoder_ffn_dim=40, decoder_ffn_dim=48,
                  scale_embedding=False),
        tie=True, size=dict(height=64, width=64)),
    "untied": dict(
        vision=dict(depths=[2, 1, 1], patch_size=[7, 3, 3], patch_stride=[4, 2, 2],
                    patch_padding=[3, 1, 1], patch_prenorm=[False, True, True],
                    embed_dim=[8, 16, 24], num_heads=[1, 2, 3], num_groups=[2, 2, 4],
                    window_size=2, projection_dim=32, qkv_bias=False,
                    activation_function="relu", max_position_embeddings=8),
        text=dict(d_model=32, encoder_layers=1, decoder_layers=3, encoder_attention_heads=4,
                  decoder_attention_heads=2, encoder_ffn_dim=48, decoder_ffn_dim=40,
                  activation_function="relu", scale_embedding=True),
        tie=False, size=dict(height=48, width=40)),
}
EMBED_NORM = 1.5
GENERATION = {"bos_token_id": 0, "decoder_start_token_id": 2, "eos_token_id": 2,
              "forced_eos_token_id": 2, "pad_token_id": 1}


# the tokens Florence-2's answers are made of, which its original processor added to the BART
# tokenizer as special tokens (microsoft/Florence-2-base, processing_florence2.py; the
# florence-community checkpoints' tokenizers have them): `<loc_0>`..`<loc_999>` quantize a
# coordinate to 1000 bins
ANSWER_TOKENS = (["<od>", "</od>", "<ocr>", "</ocr>"] + [f"<loc_{x}>" for x in range(1000)]
                 + ["<cap>", "</cap>", "<ncap>", "</ncap>", "<grounding>", "</grounding>",
                    "<seg>", "</seg>", "<sep>", "<region_cap>", "</region_cap>",
                    "<region_to_desciption>", "</region_to_desciption>", "<proposal>",
                    "</proposal>", "<poly>", "</poly>", "<and>"])
# what HF's Florence2PostProcessor parses (its parse tasks; HF's processor test's settings)
POST_PROCESSOR_CONFIG = {
    "ocr": {"pattern": r"(.+?)<loc_(\d+)><loc_(\d+)><loc_(\d+)><loc_(\d+)><loc_(\d+)>"
                       r"<loc_(\d+)><loc_(\d+)><loc_(\d+)>",
            "area_threshold": 0.0},
    "phrase_grounding": {"banned_grounding_tokens": ["the image"]},
    "pure_text": {}, "description_with_bboxes": {}, "description_with_polygons": {},
    "polygons": {}, "bboxes": {}, "description_with_bboxes_or_polygons": {},
}


def tokenizer(out: Path, answer_tokens: bool = False):
    """The tiny BART tokenizer with Florence-2's `<image>` token (its image_token); with
    `answer_tokens`, its answers' special tokens too (`ANSWER_TOKENS`, after `<image>`: its id
    stays 269)."""
    from transformers import BartTokenizer

    _tokenizer(out)  # writes vocab.json and merges.txt
    tok = BartTokenizer(str(out / "vocab.json"), str(out / "merges.txt"),
                        extra_special_tokens={"image_token": "<image>"})
    if answer_tokens:
        tok.add_tokens(ANSWER_TOKENS, special_tokens=True)
    return tok


def image_processor(size: dict, tokens: int):
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(size=size, crop_size=size, do_center_crop=False,
                              image_seq_length=tokens)


@torch.no_grad()
def _randomize(model, seed: int, eos: int, eos_boost: float) -> None:
    """A scale at which outputs vary with the image and the prompt: norms near 1, biases
    small, matrices and convolutions of unit output scale."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "norm" in name:
            p.copy_((1.0 if name.endswith("weight") else 0.0)
                    + 0.2 * torch.randn(p.shape, generator=g))
        elif p.dim() == 1:
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
        else:
            p.copy_(torch.randn(p.shape, generator=g) * 1.5 / p[0].numel() ** 0.5)
    # small token embeddings of one norm: over large ones the decoder repeats its previous
    # token, and a tied head favours the longest rows
    shared = model.model.language_model.shared.weight
    shared.copy_(torch.nn.functional.normalize(shared, dim=-1) * EMBED_NORM)
    # the decoder's last LayerNorm bias is in every output: the EOS row along it raises EOS
    last = model.model.language_model.decoder.layers[-1].final_layer_norm.bias
    model.lm_head.weight[eos] += eos_boost * torch.nn.functional.normalize(last, dim=0)


def write_florence2_checkpoint(shape: str, out: Path, seed: int = 0,
                               eos_boost: float = 0.0, answer_tokens: bool = False) -> Path:
    """`eos_boost`: how far the head's EOS row moves towards every output (outputs end
    earlier as it grows). `answer_tokens`: the tokenizer (and the vocabulary) has Florence-2's
    `<loc_*>` tokens, which random weights then generate often."""
    from transformers import (
        Florence2Config,
        Florence2ForConditionalGeneration,
        Florence2Processor,
        GenerationConfig,
    )

    out.mkdir(parents=True, exist_ok=True)
    s = SHAPES[shape]
    tok = tokenizer(out, answer_tokens)
    cfg = Florence2Config(
        vision_config=s["vision"], image_token_id=tok.image_token_id,
        tie_word_embeddings=s["tie"],
        text_config=dict(vocab_size=len(tok), max_position_embeddings=160, pad_token_id=1,
                         bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                         **s["text"]))
    torch.manual_seed(seed)
    model = Florence2ForConditionalGeneration(cfg).eval()
    _randomize(model, seed, cfg.text_config.eos_token_id, eos_boost)
    model.save_pretrained(str(out))
    GenerationConfig(**GENERATION).save_pretrained(str(out))
    tokens = _image_tokens(model, s["size"])
    Florence2Processor(image_processor(s["size"], tokens), tok,
                       post_processor_config=POST_PROCESSOR_CONFIG).save_pretrained(str(out))
    return out


@torch.no_grad()
def _image_tokens(model, size: dict) -> int:
    """The projector's tokens for an image of `size` (HF's processor places as many)."""
    pixels = torch.zeros(1, 3, size["height"], size["width"])
    return model.get_image_features(pixels).pooler_output.shape[1]
