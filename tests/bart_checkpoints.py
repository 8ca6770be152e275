"""Tiny random BART-family checkpoints (Marian, M2M100, NLLB, mBART-50) with real tokenizers:
a small SentencePiece model trained here, wrapped in each family's HF tokenizer class and
saved next to the weights, as the real checkpoints ship them."""

from __future__ import annotations

import io
import json
from functools import lru_cache
from pathlib import Path

import torch

# random weights' scale: larger ones make these tiny models repeat one token
SCALE = 0.6
BIAS = 0.02
PAD_BIAS = 2.5
CORPUS = [
    "The house is wonderful.", "Where is the train station?",
    "I would like to buy a ticket to Paris, and then find a small hotel near the river.",
    "Das Haus ist wunderbar.", "Wo ist der Bahnhof?", "Ich möchte eine Fahrkarte kaufen.",
    "La maison est magnifique.", "Où est la gare ?", "Je voudrais acheter un billet.",
    "La casa es maravillosa.", "¿Dónde está la estación?", "one two three four five six seven",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z 0 1 2 3 4 5 6 7 8 9",
]

# NLLB's codes in a tiny vocabulary: a few, of which two share ISO 639-1 "zh"
NLLB_CODES = ["eng_Latn", "deu_Latn", "fra_Latn", "spa_Latn", "zho_Hans", "zho_Hant"]

# odd shapes: head sizes that are not powers of two, unequal encoder/decoder head counts and
# layer counts, every family's activation
CONFIGS: dict[str, dict] = {
    "marian": dict(d_model=36, encoder_attention_heads=3, decoder_attention_heads=4,
                   encoder_layers=2, decoder_layers=2, encoder_ffn_dim=52, decoder_ffn_dim=44,
                   activation_function="swish", scale_embedding=True,
                   tie_word_embeddings=False, max_position_embeddings=96),
    "m2m100": dict(d_model=40, encoder_attention_heads=5, decoder_attention_heads=4,
                   encoder_layers=2, decoder_layers=2, encoder_ffn_dim=56, decoder_ffn_dim=72,
                   activation_function="relu", scale_embedding=True,
                   tie_word_embeddings=False, max_position_embeddings=96),
    "nllb": dict(d_model=40, encoder_attention_heads=4, decoder_attention_heads=5,
                 encoder_layers=2, decoder_layers=2, encoder_ffn_dim=48, decoder_ffn_dim=64,
                 activation_function="relu", scale_embedding=False, tie_word_embeddings=True,
                 max_position_embeddings=96),
    "mbart": dict(d_model=32, encoder_attention_heads=4, decoder_attention_heads=2,
                  encoder_layers=2, decoder_layers=2, encoder_ffn_dim=48, decoder_ffn_dim=40,
                  activation_function="gelu", scale_embedding=True, tie_word_embeddings=False,
                  max_position_embeddings=96),
}


def train_spm(model_type: str, vocab_size: int, **kwargs) -> bytes:
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS * 10), model_writer=buf,
                                   vocab_size=vocab_size, model_type=model_type,
                                   character_coverage=1.0, minloglevel=2,
                                   hard_vocab_limit=False, **kwargs)
    return buf.getvalue()


def _marian_tokenizer(out: Path, targets: tuple[str, ...] = ()):
    """An OPUS-MT pair's tokenizer (en -> de); with `targets`, a multi-target model's, whose
    vocabulary has a ">>code<<" token per target language."""

    model = train_spm("unigram", 80, pad_id=-1, bos_id=-1, eos_id=-1, unk_id=0)
    return marian_tokenizer_files(model, out, targets)


def marian_tokenizer_files(model: bytes, out: Path, targets: tuple[str, ...] = ()):
    """OPUS-MT's tokenizer files for a SentencePiece `model` (without pad/bos/eos pieces),
    shared by source and target, written to `out`: source.spm, target.spm, vocab.json
    (</s> 0, <unk> 1, the pieces, a ">>code<<" per target in `targets`, <pad> last: OPUS-MT's
    pad and decoder start). The MarianTokenizer over them (en -> de without `targets`)."""
    import sentencepiece as spm
    from transformers import MarianTokenizer

    out.mkdir(parents=True, exist_ok=True)
    (out / "source.spm").write_bytes(model)
    (out / "target.spm").write_bytes(model)
    sp = spm.SentencePieceProcessor(model_proto=model)
    vocab = {"</s>": 0, "<unk>": 1}
    for i in range(sp.get_piece_size()):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
    for code in targets:
        vocab[f">>{code}<<"] = len(vocab)
    vocab["<pad>"] = len(vocab)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    return MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"),
                           str(out / "vocab.json"), source_lang="en",
                           target_lang=None if targets else "de")


def _m2m100_tokenizer(out: Path):
    import sentencepiece as spm
    from transformers import M2M100Tokenizer

    model = train_spm("unigram", 70)
    (out / "sentencepiece.bpe.model").write_bytes(model)
    sp = spm.SentencePieceProcessor(model_proto=model)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for i in range(sp.get_piece_size()):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
    (out / "vocab.json").write_text(json.dumps(vocab))
    return M2M100Tokenizer(str(out / "vocab.json"), str(out / "sentencepiece.bpe.model"),
                           src_lang="en")


def _spm_tokenizer(cls, model_type: str, out: Path, **kwargs):
    """A tokenizers-backed class (NLLB, mBART-50) converted from a SentencePiece model file,
    as from_pretrained converts a directory holding only the .model."""
    (out / "sentencepiece.bpe.model").write_bytes(train_spm(model_type, 60))
    tok = cls.from_pretrained(str(out), **kwargs)
    (out / "sentencepiece.bpe.model").unlink()
    return tok


def tokenizer_for(family: str, out: Path, nllb_codes: list[str] | None = None):
    """`family`'s tokenizer, saved files in `out`; NLLB's with `nllb_codes` (default
    NLLB_CODES)."""
    from transformers import MBart50Tokenizer, NllbTokenizer

    if family == "marian":
        return _marian_tokenizer(out)
    if family == "m2m100":
        return _m2m100_tokenizer(out)
    if family == "nllb":
        return _spm_tokenizer(NllbTokenizer, "bpe", out, src_lang="eng_Latn",
                              extra_special_tokens=nllb_codes or NLLB_CODES)
    return _spm_tokenizer(MBart50Tokenizer, "unigram", out, src_lang="en_XX")


def _hf_config(family: str, tok, shape: dict):
    from transformers import M2M100Config, MarianConfig, MBartConfig

    vocab = len(tok)
    if family == "m2m100":  # its language ids and 8 "made-up words" follow its vocab.json
        vocab = tok.encoder_size + len(tok.lang_code_to_id) + tok.num_madeup_words
    if family == "marian":
        pad = tok.pad_token_id
        return MarianConfig(vocab_size=vocab, pad_token_id=pad, decoder_start_token_id=pad,
                            eos_token_id=tok.eos_token_id, forced_eos_token_id=None,
                            bos_token_id=None, **shape)
    cls = MBartConfig if family == "mbart" else M2M100Config
    return cls(vocab_size=vocab, pad_token_id=1, bos_token_id=0, eos_token_id=2,
               decoder_start_token_id=2, forced_eos_token_id=None, **shape)


@torch.no_grad()
def _randomize(model, seed: int) -> None:
    """Weights of a scale at which greedy outputs vary (HF's 0.02 init collapses them into
    one repeated token); norms and biases random too, so each is tested."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "layer_norm" in name or "layernorm" in name:
            p.copy_((1.0 if name.endswith("weight") else 0.0)
                    + 0.2 * torch.randn(p.shape, generator=g))
        elif p.dim() == 1:  # linear biases
            p.copy_(BIAS * torch.randn(p.shape, generator=g))
        else:
            p.copy_(torch.randn(p.shape, generator=g) * SCALE / p.shape[-1] ** 0.5)
    if hasattr(model, "final_logits_bias"):
        model.final_logits_bias.copy_(0.5 * torch.randn(model.final_logits_bias.shape, generator=g))


def write_bart_checkpoint(family: str, out: Path, seed: int = 0, **overrides) -> Path:
    """A tiny random checkpoint of `family` ("marian", "m2m100", "nllb", "mbart") with its
    tokenizer and generation_config.json, in `out`; `overrides` set config fields (a pad id
    other than the family's, forced_eos_token_id, ...), except `nllb_codes`: NLLB's
    languages."""
    from transformers import AutoModelForSeq2SeqLM, GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer_for(family, out, overrides.pop("nllb_codes", None))
    tok.save_pretrained(str(out))
    cfg = _hf_config(family, tok, CONFIGS[family])
    forced_eos = overrides.pop("forced_eos_token_id", None)  # a generation setting in HF 5
    for key, value in overrides.items():
        setattr(cfg, key, value)
    torch.manual_seed(seed)
    model = AutoModelForSeq2SeqLM.from_config(cfg).eval()
    _randomize(model, seed)
    if family == "marian":  # pad (the decoder start) would often be the argmax: the trap
        with torch.no_grad():
            model.final_logits_bias[0, cfg.pad_token_id] = PAD_BIAS
    model.save_pretrained(str(out))
    gen = {"decoder_start_token_id": cfg.decoder_start_token_id, "pad_token_id": cfg.pad_token_id,
           "eos_token_id": cfg.eos_token_id, "max_length": 64,
           "forced_eos_token_id": forced_eos}
    if family == "marian":  # as the OPUS-MT checkpoints ship it
        gen["bad_words_ids"] = [[cfg.pad_token_id]]
    if family == "mbart":  # a one-to-many model's default target: German
        gen["forced_bos_token_id"] = tok.convert_tokens_to_ids("de_DE")
    GenerationConfig(**gen).save_pretrained(str(out))
    return out


@lru_cache(maxsize=8)
def cached_checkpoint(family: str, root: str) -> str:
    return str(write_bart_checkpoint(family, Path(root) / family))
