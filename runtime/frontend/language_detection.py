"""Source-language detection (issue 42): `source_lang: "auto"` on /v1/translations and
`Seq2SeqEngine.translate`, and `/v1/detect`.

The identifier is py3langid (langid.py's maintained fork: 140 languages, its model in its 4.4 MB
package), chosen over lingua-language-detector by measurement (docs/translation.md: as accurate
or more on this project's 20-language test set, 40x faster, 1 GB less resident memory). It is
loaded on first use (0.6-1.4 s, +75 MB resident), so a server that never detects pays nothing,
and it judges a text by its first `SAMPLE_CHARS` characters, so one call is bounded (about
1 ms): callers run it on a worker thread, where its Python loop lets the event loop run
between bytecodes. Confidences are percentages (0..100), as LibreTranslate's /detect gives
them.

A detected language becomes the model's source code through `TranslationLanguages.resolve`
(NLLB's `deu_Latn`, M2M100's `de`, mBART's `de_DE`, an OPUS-MT pair's own source); one the
model does not translate from is a ValueError that names it, never a translation from the
wrong language."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from seq2serve.runtime.frontend.language_codes import ISO_639_1
from seq2serve.runtime.frontend.languages import TranslationLanguages

AUTO = "auto"
SAMPLE_CHARS = 2000  # a text is judged by its first characters: 1 ms, and accuracy is flat
MAX_CANDIDATES = 3  # /v1/detect: at most this many languages per text, best first...
MIN_CONFIDENCE = 1.0  # ...those of at least this confidence (%), and the best one always
_NO_LANGUAGE = "zxx"  # py3langid's label for text without linguistic content

# a variety py3langid names, and the language a model lists instead when it lacks the variety
_PARENT = {"yue": "zh", "wuu": "zh", "arz": "ar", "ary": "ar", "uzs": "uz", "gug": "gn",
           "fuv": "ff", "nn": "no", "sdh": "ku", "ltg": "lv"}


def is_auto(lang: Any) -> bool:
    return isinstance(lang, str) and lang.strip().lower() == AUTO


@dataclass(frozen=True)
class Detection:
    language: str  # ISO 639-1, else ISO 639-3 (py3langid's label)
    confidence: float  # 0..100

    def as_dict(self) -> dict[str, Any]:
        return {"language": self.language, "confidence": self.confidence}

    @property
    def described(self) -> str:
        name = ISO_639_1.get(self.language, (None, None))[1]
        what = f"{name} ({self.language}" if name else f"language {self.language!r} ("
        return f"{what}, confidence {self.confidence:.1f} %)"


class LanguageDetector:
    """py3langid's identifier with normalized probabilities, loaded once, on first use (under
    a lock: threads may ask at once). `rank` only reads the model: safe from any thread."""

    def __init__(self) -> None:
        self._identifier = None
        self._lock = threading.Lock()

    def _model(self):
        if self._identifier is None:
            with self._lock:
                if self._identifier is None:
                    from py3langid.langid import MODEL_FILE, LanguageIdentifier

                    self._identifier = LanguageIdentifier.from_model_file(MODEL_FILE,
                                                                          norm_probs=True)
        return self._identifier

    def rank(self, text: str, limit: int = MAX_CANDIDATES) -> list[Detection]:
        """The likeliest languages of `text`'s beginning, best first: at most `limit`, those of
        at least MIN_CONFIDENCE and the best one always; an empty list for a text without a
        letter or without linguistic content (digits, punctuation, a URL)."""
        sample = text[:SAMPLE_CHARS]
        if not any(c.isalpha() for c in sample):
            return []
        ranked = self._model().rank(sample)[:limit]
        if ranked[0][0] == _NO_LANGUAGE:
            return []
        return [Detection(lang, round(100 * p, 2)) for i, (lang, p) in enumerate(ranked)
                if lang != _NO_LANGUAGE and (i == 0 or 100 * p >= MIN_CONFIDENCE)]


DETECTOR = LanguageDetector()  # one per process


def detect_response(q: str | list[str], max_texts: int, max_chars: int) -> list:
    """/v1/detect's answer (LibreTranslate's): for a text, its languages best first
    ([{"confidence", "language"}]); for a list, one such list per text."""
    found = [[d.as_dict() for d in ds]
             for ds in detect_texts(q if isinstance(q, list) else [q], max_texts, max_chars)]
    return found if isinstance(q, list) else found[0]


def detect_texts(texts: list[str], max_texts: int, max_chars: int) -> list[list[Detection]]:
    """Each text's `rank`. ValueError naming what is wrong with the texts: none, more than
    `max_texts` (max_batch_inputs), one empty or over `max_chars` (max_document_chars)."""
    if not texts:
        raise ValueError("q is an empty list")
    if len(texts) > max_texts:
        raise ValueError(f"q has {len(texts)} texts, over this server's limit of {max_texts} "
                         f"(max_batch_inputs)")
    for i, text in enumerate(texts):
        if not text.strip():
            raise ValueError(f"q[{i}] is empty: there is no text to detect a language in")
        if len(text) > max_chars:
            raise ValueError(f"q[{i}] is {len(text)} characters, over this server's limit of "
                             f"{max_chars} characters per text (max_document_chars)")
    return [DETECTOR.rank(t) for t in texts]


def detected_source(langs: TranslationLanguages | None, text: str,
                    where: str) -> tuple[str, dict[str, Any]]:
    """`source_lang: "auto"` for one document: (the model's source code for the language
    `text` is in, the response's `detected_language`: {"language": ISO code, "confidence":
    %, "source_lang": the model's code}). ValueError, starting "source_lang" and naming
    `where` (input[i]), for a model without languages, a text without one, or a language
    the model does not translate from."""
    if langs is None:
        raise ValueError("source_lang 'auto' needs a model whose tokenizer names its "
                         "languages (NLLB-200, M2M100, mBART-50, OPUS-MT); this model takes a "
                         "prompt template and lists no languages: name source_lang")
    ranked = DETECTOR.rank(text, limit=1)
    if not ranked:
        raise ValueError(f"source_lang 'auto': {where} has no words in a language to detect "
                         f"(only digits, symbols or a URL): name source_lang")
    best = ranked[0]
    code = _model_source(langs, best.language)
    if code is None:
        raise ValueError(f"source_lang 'auto': {where} is in {best.described}, a language this "
                         f"model does not translate from (name source_lang if the detection "
                         f"is wrong); it translates from: {_sources(langs)}")
    return code, {**best.as_dict(), "source_lang": code}


def _model_source(langs: TranslationLanguages, iso: str) -> str | None:
    """The model's source code for ISO code `iso` (or for the language it is a variety of),
    None if it has none."""
    if langs.family == "marian":
        if not langs.source_langs:  # a pair that does not name its source: nothing to check
            raise ValueError("source_lang 'auto': this OPUS-MT model does not name the "
                             "language it translates from, so a detected language cannot be "
                             "checked against it: name source_lang")
        if "mul" in langs.source_langs:  # a many-to-one model reads any language
            return "mul"
    for key in (iso, _PARENT.get(iso)):
        if key is None:
            continue
        try:
            return langs.resolve(key, "source_lang")
        except ValueError:
            pass
        scripts = [c for c in langs.codes if c.startswith(f"{key}_")]  # NLLB's ISO 639-3
        if len(scripts) == 1:
            return scripts[0]
    return None


def _sources(langs: TranslationLanguages) -> str:
    if langs.family == "marian":
        return ", ".join(langs.source_langs or [])
    return ", ".join(f"{d['code']} ({d['iso639_1']})" if d["iso639_1"] not in (None, d["code"])
                     else d["code"] for d in langs.describe())
