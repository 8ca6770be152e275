"""Tiny random BART summarization checkpoints (`BartForConditionalGeneration`) with a tiny
byte-level BART tokenizer and bart-large-cnn's generation settings, scaled to their size.

Two shapes: bart-large-cnn's (unscaled embeddings, the head tied to the shared embedding)
and one with `scale_embedding` and an untied head; both have BART's post-LayerNorm blocks,
`layernorm_embedding` and `final_logits_bias`. The EOS logit is raised so that an output
would often end early: `min_length` and the forced EOS at the length limit both decide."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from seq2serve.runtime.tools.demo_checkpoint import vary_weights
from seq2serve.runtime.tools.whisper_tokenizer import MERGES, bytes_to_unicode

SHAPES: dict[str, dict] = {
    "cnn": dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=48,
                scale_embedding=False, tie_word_embeddings=True),
    "scaled_untied": dict(d_model=48, encoder_layers=1, decoder_layers=3,
                          encoder_attention_heads=3, decoder_attention_heads=4,
                          encoder_ffn_dim=40, decoder_ffn_dim=96, scale_embedding=True,
                          tie_word_embeddings=False),
}
# bart-large-cnn's generation_config.json, its lengths scaled down (min 56, max 142 there)
GENERATION = {"bos_token_id": 0, "decoder_start_token_id": 2, "early_stopping": True,
              "eos_token_id": 2, "forced_bos_token_id": 0, "forced_eos_token_id": 2,
              "length_penalty": 2.0, "max_length": 20, "min_length": 9,
              "no_repeat_ngram_size": 3, "num_beams": 4, "pad_token_id": 1}
SOURCES = ["The cat sat on the mat and the dog sat on the log.",
           "A short one.",
           "The train to the sea was late; nobody said a word.",
           "the the the the the the"]


def _tokenizer(out: Path):
    from transformers import BartTokenizer

    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>"])}
    for ch in bytes_to_unicode().values():
        vocab[ch] = len(vocab)
    for merge in MERGES:
        vocab["".join(merge.split())] = len(vocab)
    vocab["<mask>"] = len(vocab)
    (out / "vocab.json").write_text(json.dumps(vocab))
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(MERGES) + "\n")
    return BartTokenizer(str(out / "vocab.json"), str(out / "merges.txt"))


@torch.no_grad()
def write_bart_cnn_checkpoint(shape: str, out: Path, seed: int = 0,
                              eos_bias: float = 4.5) -> Path:
    from transformers import BartConfig, BartForConditionalGeneration, GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(out)
    tok.save_pretrained(str(out))
    cfg = BartConfig(vocab_size=len(tok), max_position_embeddings=128, pad_token_id=1,
                     bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                     forced_bos_token_id=0, **SHAPES[shape])
    torch.manual_seed(seed)
    model = BartForConditionalGeneration(cfg).eval()
    g = vary_weights(model, seed)  # a scale at which outputs vary with the input
    model.final_logits_bias.copy_(0.5 * torch.randn(model.final_logits_bias.shape, generator=g))
    model.final_logits_bias[0, cfg.eos_token_id] += eos_bias
    model.save_pretrained(str(out))
    GenerationConfig(**GENERATION).save_pretrained(str(out))
    return out
