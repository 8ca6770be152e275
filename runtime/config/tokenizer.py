"""Loading the tokenizer that ships with a model directory."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "spiece.model", "tokenizer.model")


def load_tokenizer(path: str):
    """The Hugging Face tokenizer in `path`; a ValueError naming the path if there is none."""
    from transformers import AutoTokenizer

    if not any(os.path.isfile(os.path.join(path, f)) for f in _TOKENIZER_FILES):
        raise ValueError(f"no tokenizer in {path!r} (expected tokenizer.json or spiece.model)")
    return AutoTokenizer.from_pretrained(path)
