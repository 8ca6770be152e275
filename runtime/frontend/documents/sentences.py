"""Sentences of a text run, by sentencex (Wikimedia's rule-based segmenter, ~300 languages
through fallback chains). Chosen over pysbd by measurement: 50 of 56 hand-made multilingual
cases right against 44, boundary precision 0.92 against 0.84, and 100-300x the speed
(docs/translation.md, `benchmarks/bench_segmenters.py`)."""

from __future__ import annotations

import logging
import re

import sentencex

from seq2serve.runtime.frontend.documents.pieces import Span, has_words, trimmed
from seq2serve.runtime.frontend.language_codes import BY_NAME, ISO_639_1

logger = logging.getLogger(__name__)

_ISO3_TO_1 = {iso3: iso1 for iso1, (iso3, _) in ISO_639_1.items()}
# the language part of a model's own code: NLLB "deu_Latn", mBART "de_DE", M2M100 "__de__",
# Marian ">>deu<<"
_MODEL_CODE = re.compile(r"^(?:__|>>)?([A-Za-z]{2,3})(?:[_-][A-Za-z]+)?(?:__|<<)?$")
DEFAULT_LANGUAGE = "en"
WINDOW = 4000  # characters given to sentencex at once
_SENTENCE_END = re.compile(r"[.!?\u3002\uff01\uff1f]\s+|[\u3002\uff01\uff1f]")
_SPACE = re.compile(r"\s+")


def segmenter_language(source_lang: str) -> str:
    """The ISO 639-1 code sentencex takes for a request's source language (an ISO 639-1 or
    639-3 code, an English name, or a model's own code); English rules for anything else
    (the demo model's "digits"), which suit most Latin-script text."""
    key = source_lang.strip().lower()
    if key in BY_NAME:
        return BY_NAME[key]
    m = _MODEL_CODE.match(key)
    if m:
        base = m[1].lower()
        if base in ISO_639_1:
            return base
        if base in _ISO3_TO_1:
            return _ISO3_TO_1[base]
    return DEFAULT_LANGUAGE


def sentence_spans(text: str, run: Span, language: str) -> list[Span]:
    """The sentences of text[run], as absolute spans without their surrounding whitespace;
    stretches without a letter or digit are left out (they stay as they are)."""
    out = []
    for window in _windows(text, run):
        for s, e in _boundaries(text, window, language):
            span = trimmed(text, s, e)
            if span is not None and has_words(text[span[0]:span[1]]):
                out.append(span)
    return out


def _boundaries(text: str, window: Span, language: str) -> list[Span]:
    start, end = window
    try:
        found = sentencex.get_sentence_boundaries(language, text[start:end])
    except Exception:  # noqa: BLE001 - a segmenter bug must not fail the translation
        logger.warning("sentencex failed on a %d-character run; it is one sentence",
                       end - start, exc_info=True)
        return [window]
    return [(max(start, start + b["start_index"]), min(end, start + b["end_index"]))
            for b in found]


def _windows(text: str, run: Span) -> list[Span]:
    """text[run] in windows of at most WINDOW characters, each cut after the last sentence
    end (else whitespace) that its second half has: sentencex takes time quadratic in the
    length of some runs (a 100,000-character run of backticks: 3.3 s; 25,000: 0.3 s), and a
    paragraph longer than a window is rare outside such input."""
    start, end = run
    out = []
    while end - start > WINDOW:
        cut = _last_match(_SENTENCE_END, text, start + WINDOW // 2, start + WINDOW) or \
            _last_match(_SPACE, text, start + WINDOW // 2, start + WINDOW) or start + WINDOW
        out.append((start, cut))
        start = cut
    out.append((start, end))
    return out


def _last_match(pattern: re.Pattern, text: str, lo: int, hi: int) -> int | None:
    last = None
    for m in pattern.finditer(text, lo, hi):
        last = m.end()
    return last
