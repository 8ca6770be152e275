"""The BART-family tests' oracle: HF's tokenizer and `generate` with the target language forced,
shared by the CPU tests (tests/test_bart_models.py) and the GPU test (tests/test_gpu.py), and
free of the API client's imports so the GPU machine needs nothing more."""

from __future__ import annotations

import torch

from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.tests.bart_checkpoints import CORPUS
from seq2serve.tests.helpers import hf_model

FAMILIES = ["marian", "m2m100", "nllb", "mbart"]
SOURCES = CORPUS[:3] + ["Hi", CORPUS[6]]
# (source, target) as each family names them in HF (Marian: its one pair)
LANGS = {"marian": ("en", "de"), "m2m100": ("en", "de"), "nllb": ("eng_Latn", "fra_Latn"),
         "mbart": ("en_XX", "de_DE")}
MAX_NEW = 10


def hf_source_and_forced(path: str, family: str, text: str, source: str, target: str):
    """The oracle's inputs: HF's tokenizer set to the source language, HF's own target token."""
    tok = load_tokenizer(path)
    if family == "marian":
        return tok(text).input_ids, None
    tok.src_lang = source
    forced = tok.get_lang_id(target) if family == "m2m100" else tok.convert_tokens_to_ids(target)
    return tok(text).input_ids, forced


def hf_generate(path: str, ids: list[int], forced: int | None, max_new: int, **gen):
    """HF generate (with its KV cache, as deployed: M2M100's positions depend on it) from the
    checkpoint's generation_config.json (OPUS-MT's: pad in bad_words_ids); the forced token
    is one of HF's new tokens, not of ours."""
    extra = 0 if forced is None else 1
    with torch.no_grad():
        return hf_model(path).generate(torch.tensor([ids]), max_new_tokens=max_new + extra,
                                       forced_bos_token_id=forced, forced_eos_token_id=None,
                                       do_sample=False, **gen), 1 + extra
