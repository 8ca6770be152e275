"""Tiny random Whisper checkpoints with real (tiny) Whisper tokenizers, and test audio.

Two shapes: a multilingual one (128 mel bins as large-v3, three languages, unequal head
counts) and an English-only one (80 mel bins, `.en`'s prompt of start and no-timestamps
only). Each vocabulary is the 256 byte-level symbols and a few merges, then Whisper's special
tokens in Whisper's order (runtime/tools/whisper_tokenizer.py); generation_config.json
carries what HF's Whisper generate reads (lang_to_id, task_to_id, suppress_tokens,
begin_suppress_tokens, ...), as the released checkpoints ship it. The encoder keeps
Whisper's fixed 1,500 positions (30 s windows)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import torch

from seq2serve.runtime.tools.whisper_tokenizer import STAMPS, write_whisper_tokenizer

LANGUAGES = ("en", "de", "fr")
CONFIGS: dict[str, dict] = {
    "multilingual": {"d_model": 64, "encoder_attention_heads": 4, "decoder_attention_heads": 2,
                     "encoder_layers": 2, "decoder_layers": 2, "encoder_ffn_dim": 96,
                     "decoder_ffn_dim": 80, "num_mel_bins": 128, "max_target_positions": 64},
    "english": {"d_model": 48, "encoder_attention_heads": 3, "decoder_attention_heads": 4,
                "encoder_layers": 2, "decoder_layers": 1, "encoder_ffn_dim": 64,
                "decoder_ffn_dim": 96, "num_mel_bins": 80, "max_target_positions": 48},
}


def write_whisper_checkpoint(kind: str, out: Path, seed: int = 0,
                             timestamps: bool = False) -> Path:
    """With `timestamps`, the vocabulary ends with Whisper's 1,501 timestamp tokens
    (`<|0.00|>` to `<|30.00|>`, ordinary added tokens after the specials, as the released
    tokenizers have them); the multilingual one's generation_config.json caps the first
    timestamp (`max_initial_timestamp_index`), the English-only one's does not."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    multilingual = kind == "multilingual"
    specials = write_whisper_tokenizer(out, LANGUAGES if multilingual else (), timestamps)
    vocab = json.loads((out / "vocab.json").read_text())
    stamps = STAMPS if timestamps else 0
    eot, sot = specials["<|endoftext|>"], specials["<|startoftranscript|>"]
    space = vocab["Ġ"]
    # suppressed: a few ordinary tokens too, so that the ban is visible in the outputs
    suppress = [vocab["!"], vocab["a"], specials["<|startofprev|>"], specials["<|nospeech|>"]]
    cfg = WhisperConfig(vocab_size=len(vocab) + len(specials) + stamps,
                        max_source_positions=1500,
                        pad_token_id=eot, bos_token_id=eot, eos_token_id=eot,
                        decoder_start_token_id=sot, suppress_tokens=suppress,
                        begin_suppress_tokens=[space, eot], tie_word_embeddings=True,
                        **CONFIGS[kind])
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # larger than HF's init: outputs that vary with the audio
        for name, p in model.named_parameters():
            if "embed_tokens" in name:
                p.normal_(0.0, 0.5)
            elif p.dim() > 1 and "embed_positions" not in name:
                p.normal_(0.0, 2.0 / p.shape[-1] ** 0.5)
            elif name.endswith("bias") and "layer_norm" not in name:
                p.normal_(0.0, 0.02)
    model.save_pretrained(out)
    gen = model.generation_config
    gen.decoder_start_token_id = sot
    gen.is_multilingual = multilingual
    gen.no_timestamps_token_id = specials["<|notimestamps|>"]
    gen.suppress_tokens, gen.begin_suppress_tokens = suppress, [space, eot]
    if multilingual:  # an English-only checkpoint has neither key (HF: no language then)
        gen.task_to_id = {"translate": specials["<|translate|>"],
                          "transcribe": specials["<|transcribe|>"]}
        gen.lang_to_id = {f"<|{c}|>": specials[f"<|{c}|>"] for c in LANGUAGES}
    if stamps and multilingual:
        gen.max_initial_timestamp_index = 5
    gen.max_length = cfg.max_target_positions
    gen._from_model_config = False  # else from_pretrained rebuilds it from config.json
    gen.save_pretrained(out)
    return out


def tiny_checkpoints(root: Path, timestamps: bool = False) -> dict[str, str]:
    """The two checkpoints the Whisper tests run on: a multilingual one and an English-only
    one, by kind (`timestamps`: with the timestamp tokens)."""
    return {"multilingual": str(write_whisper_checkpoint("multilingual", root / "m", seed=5,
                                                         timestamps=timestamps)),
            "english": str(write_whisper_checkpoint("english", root / "e", seed=1,
                                                    timestamps=timestamps))}


def hf_models(ckpt: dict[str, str]) -> dict:
    """HF's model (eval) and feature extractor of each checkpoint, by kind."""
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    out = {}
    for kind, path in ckpt.items():
        model = WhisperForConditionalGeneration.from_pretrained(path).eval()
        out[kind] = (model, WhisperFeatureExtractor(feature_size=model.config.num_mel_bins))
    return out


def clip(seed: int, seconds: float = 20.0, rate: int = 16_000) -> np.ndarray:
    """A few tones and noise: different per seed, in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    freqs = rng.uniform(100, 3000, size=3)
    x = sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 6)) for f in freqs) / 4
    return (x + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)


def encoded(samples: np.ndarray, rate: int, fmt: str, subtype: str | None = None) -> bytes:
    """`samples` as a file of `fmt` (WAV, FLAC, OGG, MP3), through libsndfile."""
    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def long_clip(segments: int = 5, seconds: float = 19.0) -> np.ndarray:
    """Long audio of `segments` different clips back to back (5 x 19 s = 95 s: five 30 s
    windows, whose contents differ and whose 10 s overlaps cross the clips' joins)."""
    return np.concatenate([clip(100 + s, seconds) for s in range(segments)])
