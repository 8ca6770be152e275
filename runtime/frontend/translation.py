"""Translations: the beam count (CTranslate2's `beam_size` or HF's `num_beams`, one option with
two names, by default the model directory's generation_config.json `num_beams`) and a
translation's input to generate (the model's languages or its prompt template:
`SourceEncoder`, `translation_request`)."""

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


class SourceEncoder:
    """A translation's sources as encoder inputs, for one (source, target) language pair,
    exactly as generate would tokenize them: a model whose tokenizer names its languages
    (NLLB, M2M100, mBART-50, OPUS-MT) gets its source prefix and its target-language token
    (`languages.py`; a ValueError naming the supported languages for one it lacks); any other
    model gets the prompt template (`prompts.py`). Many sources are tokenized in one call."""

    _MARK = "\x00seq2serve-source\x00"

    def __init__(self, tm: TokenizerManager, model_path: str, source_lang: str,
                 target_lang: str) -> None:
        self.tm, self.model_path = tm, model_path
        self.source_lang, self.target_lang = source_lang, target_lang
        self.langs = tm.languages
        if self.langs is None:
            parts = translation_prompt(model_path, self._MARK, source_lang,
                                       target_lang).split(self._MARK)
            self.around = (parts[0], parts[1]) if len(parts) == 2 else None
            self.decoder_prompt: list[int] | None = None
        else:
            self.source = self.langs.resolve(source_lang, "source_lang")
            self.target = self.langs.resolve(target_lang, "target_lang")
            self.decoder_prompt = self.langs.forced_tokens(self.target)

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Each source's encoder input (a decoder-only model's prompt)."""
        if self.langs is not None:
            return self.langs.source_ids_many(texts, self.source, self.target)
        return self.tm.prompt_ids_many([self._prompt(t) for t in texts])

    def _prompt(self, text: str) -> str:
        if self.around is None:  # a template that uses the text twice, or formats it
            return translation_prompt(self.model_path, text, self.source_lang,
                                      self.target_lang)
        return self.around[0] + text + self.around[1]


def translation_request(encoded: list[list[int]], decoder_prompts: list[list[int] | None],
                        sampling_params: dict[str, Any], stream: bool = False,
                        user: str | None = None, forced: list[int] | None = None,
                        return_logprob: bool = False) -> GenerateReqInput:
    """Encoded sources (`SourceEncoder.encode`) and their decoder prompts (each target's
    forced language token, then any target prefix's tokens; None for a prompt template) as
    one batch for generate. `forced`: each prompt's tokens that stand for generated ones (a
    beam search counts them in its length penalty, as HF counts its forced first token);
    unset: all of the first prompt's."""
    common = {"sampling_params": sampling_params, "stream": stream, "user": user,
              "return_logprob": return_logprob}
    if all(d is None for d in decoder_prompts):
        return GenerateReqInput(input_ids=encoded, **common)
    return GenerateReqInput(input_ids=encoded, decoder_input_ids=decoder_prompts,
                            decoder_forced=len(decoder_prompts[0] or []) if forced is None
                            else forced, **common)
