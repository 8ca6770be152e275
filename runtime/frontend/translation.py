"""Translations: the beam count (CTranslate2's `beam_size` or HF's `num_beams`, one option with
two names, by default the model directory's generation_config.json `num_beams`) and a
translation's input to generate (the model's languages or its prompt template)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from seq2serve.runtime.config.sampling_params import MAX_BEAMS
from seq2serve.runtime.frontend.generate_request import GenerateReqInput
from seq2serve.runtime.frontend.prompts import translation_prompt
from seq2serve.runtime.frontend.tokenizer_manager import TokenizerManager

logger = logging.getLogger(__name__)

GENERATION_CONFIG = "generation_config.json"


def default_num_beams(model_path: str) -> int:
    """generation_config.json's `num_beams`, else 1. Read once at start-up: a malformed file
    or value is logged and ignored."""
    path = os.path.join(model_path, GENERATION_CONFIG)
    if not os.path.isfile(path):
        return 1
    try:
        with open(path) as f:
            beams = json.load(f).get("num_beams", 1)
    except (OSError, ValueError, AttributeError) as e:  # unreadable, not JSON, not an object
        logger.warning("%s is unreadable (%s); translations default to 1 beam", path, e)
        return 1
    if isinstance(beams, bool) or not isinstance(beams, int) or not 1 <= beams <= MAX_BEAMS:
        logger.warning("%s: num_beams %r is not an integer in [1, %d]; translations default "
                       "to 1 beam", path, beams, MAX_BEAMS)
        return 1
    return beams


def with_beams(params: dict[str, Any] | None, beam_size: int | None, default: int,
               stream: bool = False) -> dict[str, Any]:
    """A translation's sampling params with `num_beams` settled: `beam_size` or the params'
    own `num_beams` (both given: equal), else `default`. A stream cannot wait for a beam
    search's end, so it does not take the default: it decodes greedily unless told."""
    if params is not None and not isinstance(params, dict):
        raise ValueError(f"sampling_params must be a dict (one for every text), got "
                         f"{type(params).__name__}")
    params = dict(params or {})
    given = params.get("num_beams")
    if beam_size is not None and given is not None and beam_size != given:
        raise ValueError(f"beam_size ({beam_size}) and num_beams ({given}) differ: they are "
                         f"the same option, give one")
    beams = beam_size if beam_size is not None else given
    if beams is None and not stream:
        beams = default
    if stream and isinstance(beams, int) and beams > 1:
        raise ValueError("stream cannot be combined with beam_size (num_beams) > 1: a beam "
                         "search result is known only when it ends")
    if beams is not None:
        params["num_beams"] = beams
    return params


def translation_input(tm: TokenizerManager, model_path: str, text: str | list[str],
                      source_lang: str, target_lang: str | list[str],
                      sampling_params: dict[str, Any], stream: bool = False,
                      user: str | None = None) -> GenerateReqInput:
    """A translation as generate's input. `target_lang` is one language for every text or
    one per text. A model whose tokenizer names its languages (NLLB, M2M100, mBART-50,
    OPUS-MT) gets its source prefix and its target-language token (`languages.py`; a
    ValueError naming the supported languages for one it lacks); any other model gets the
    prompt template (`prompts.py`)."""
    texts = text if isinstance(text, list) else [text]
    targets = target_lang if isinstance(target_lang, list) else [target_lang] * len(texts)
    if len(targets) != len(texts):
        raise ValueError(f"target_lang has {len(targets)} entries for {len(texts)} inputs")
    langs = tm.languages
    if langs is None:
        prompts = [translation_prompt(model_path, t, source_lang, tl)
                   for t, tl in zip(texts, targets)]
        return GenerateReqInput(text=prompts if isinstance(text, list) else prompts[0],
                                sampling_params=sampling_params, stream=stream, user=user)
    source = langs.resolve(source_lang, "source_lang")
    enc, dec = [], []
    for i, (t, tl) in enumerate(zip(texts, targets)):
        if not isinstance(t, str) or not t:
            raise ValueError(f"input[{i}] must be a non-empty string")
        tm.check_text(t, f"input[{i}]")
        code = langs.resolve(tl, "target_lang")
        enc.append(langs.source_ids(t, source, code))
        dec.append(langs.forced_tokens(code))
    one = not isinstance(text, list)
    return GenerateReqInput(input_ids=enc[0] if one else enc,
                            decoder_input_ids=dec[0] if one else dec,
                            decoder_forced=len(dec[0]), sampling_params=sampling_params,
                            stream=stream, user=user)
