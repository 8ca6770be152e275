"""Target-language routing for the translation models whose tokenizer names its languages:
NLLB-200 ("deu_Latn"), M2M100 ("__de__"), mBART-50 ("de_DE") and OPUS-MT (a fixed pair, or
">>deu<<" target tokens for multi-target models).

A request names languages as ISO 639-1 codes ("de"), ISO 639-3 codes ("deu"), English names
("German") or the model's own codes; `resolve` turns each into the model's code, or raises a
ValueError naming every language the model supports. As the model cards prescribe, the source
language is the tokenizer's source prefix (NLLB, M2M100, mBART-50) and the target language is
the first decoder token after the start token (HF's forced_bos_token_id), except for OPUS-MT,
whose multi-target models read a ">>code<<" token at the start of the source. Only there does
the target change the encoder input; elsewhere the encoder cache keys on the source alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from seq2serve.runtime.frontend.language_codes import BY_NAME, ISO_639_1, NLLB_PREFERRED

_ISO3_TO_1 = {iso3: iso1 for iso1, (iso3, _) in ISO_639_1.items()}
_NLLB_CODE = re.compile(r"^([a-z]{3})_[A-Z][a-z]{3}$")
_MBART_CODE = re.compile(r"^([a-z]{2})_[A-Z]{2}$")
_MARIAN_CODE = re.compile(r"^>>([a-z]{2,3}(?:_[A-Za-z]+)?)<<$")


@dataclass
class TranslationLanguages:
    """A model's languages and how a request's languages become its inputs."""

    family: str  # "nllb" | "m2m100" | "mbart50" | "marian"
    tokenizer: Any
    codes: list[str]  # the model's own codes, as its tokenizer names them
    target_token: dict[str, int]  # code -> the forced first decoder token (not Marian)
    source_langs: list[str] | None = None  # Marian: its source language(s), if known
    _aliases: dict[str, str] = field(default_factory=dict)  # ISO 639-1 -> code
    _specials: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)

    @classmethod
    def of(cls, tokenizer) -> TranslationLanguages | None:
        """The tokenizer's languages; None for a model without any (T5: a prompt template)."""
        name = type(tokenizer).__name__
        if name.startswith("Nllb"):
            vocab = tokenizer.get_vocab()
            codes = sorted(t for t in tokenizer.all_special_tokens if _NLLB_CODE.match(t))
            return cls("nllb", tokenizer, codes, {c: vocab[c] for c in codes})
        if name.startswith("M2M100"):
            codes = sorted(tokenizer.lang_code_to_id)
            return cls("m2m100", tokenizer, codes, dict(tokenizer.lang_code_to_id))
        if name.startswith("MBart50"):
            codes = sorted(tokenizer.lang_code_to_id)
            return cls("mbart50", tokenizer, codes, dict(tokenizer.lang_code_to_id))
        if name.startswith("Marian"):
            codes = sorted(getattr(tokenizer, "supported_language_codes", []) or [])
            sources = [tokenizer.source_lang] if getattr(tokenizer, "source_lang", None) else None
            if not codes and getattr(tokenizer, "target_lang", None):
                codes = [tokenizer.target_lang]  # a pair: its one target
            return cls("marian", tokenizer, codes, {}, source_langs=sources)
        return None

    def __post_init__(self) -> None:
        for code in self.codes:
            iso1 = self._iso1_of(code)
            if iso1 is not None:
                self._aliases.setdefault(iso1, code)
        if self.family == "nllb":  # macrolanguages and scripts: NLLB's own choice
            self._aliases.update({k: v for k, v in NLLB_PREFERRED.items() if v in self.codes})
        if self.family != "marian":
            self._read_source_specials()

    @property
    def target_multi(self) -> bool:
        """Marian's ">>code<<" target tokens (the target goes into the source)."""
        return self.family == "marian" and any(_MARIAN_CODE.match(c) for c in self.codes)

    # --- names -------------------------------------------------------------------------------
    def _iso1_of(self, code: str) -> str | None:
        m = (_NLLB_CODE.match(code) if self.family == "nllb" else
             _MBART_CODE.match(code) if self.family == "mbart50" else
             _MARIAN_CODE.match(code) if self.family == "marian" and code.startswith(">>")
             else None)
        base = m[1] if m else code
        base = base.split("_")[0]
        return base if base in ISO_639_1 else _ISO3_TO_1.get(base)

    def describe(self) -> list[dict[str, str | None]]:
        """Every supported language: the model's code, its ISO 639-1 code and English name."""
        out = []
        for code in self.codes:
            iso1 = self._iso1_of(code)
            out.append({"code": code, "iso639_1": iso1,
                        "name": ISO_639_1[iso1][1] if iso1 else None})
        return out

    def _choices(self) -> str:
        return ", ".join(f"{d['code']} ({d['iso639_1']})"
                         if d["iso639_1"] not in (None, d["code"]) else d["code"]
                         for d in self.describe())

    def resolve(self, lang: str, field_name: str = "target_lang") -> str:
        """The model's code for a request's language; ValueError naming the choices."""
        if not isinstance(lang, str) or not lang.strip():
            raise ValueError(f"{field_name} must be a non-empty string")
        key = lang.strip()
        if field_name.startswith("source") and self.family == "marian":
            return self._marian_source(key, lang, field_name)
        if key in self.codes:
            return key
        if self.family == "m2m100" and key.startswith("__") and key[2:-2] in self.codes:
            return key[2:-2]
        if self.family == "marian" and f">>{key}<<" in self.codes:
            return f">>{key}<<"
        iso1 = self._iso1(key)
        if iso1 in self._aliases:
            return self._aliases[iso1]
        if not self.codes:  # a Marian pair that does not name its languages
            return key
        raise ValueError(f"{field_name} {lang!r} is not a language this model translates "
                         f"{'into' if field_name.startswith('target') else 'from'}; it "
                         f"supports: {self._choices()}")

    def _marian_source(self, key: str, lang: str, field_name: str) -> str:
        if not self.source_langs or key in self.source_langs:
            return key
        wanted = {self._iso1(s) for s in self.source_langs}
        if self._iso1(key) in wanted:
            return self.source_langs[0]
        raise ValueError(f"{field_name} {lang!r} is not a language this model translates "
                         f"from; it supports: {', '.join(self.source_langs)}")

    @staticmethod
    def _iso1(key: str) -> str | None:
        low = key.lower()
        if low in ISO_639_1:
            return low
        return _ISO3_TO_1.get(low) or BY_NAME.get(low)

    # --- inputs ------------------------------------------------------------------------------
    def source_ids(self, text: str, source: str, target: str) -> list[int]:
        """The encoder input for `text` (resolved codes): the tokenizer's own source prefix
        and suffix for `source`; Marian's ">>code<<" target token first, for multi-target."""
        return self.source_ids_many([text], source, target)[0]

    def source_ids_many(self, texts: list[str], source: str, target: str) -> list[list[int]]:
        """`source_ids` of each text, tokenized in one call."""
        if not texts:
            return []
        if self.family == "marian":
            if self.target_multi:
                texts = [f"{target} {t}" for t in texts]
            return self.tokenizer(list(texts)).input_ids
        prefix, suffix = self._specials[source]
        return [prefix + ids + suffix
                for ids in self.tokenizer(list(texts), add_special_tokens=False).input_ids]

    def forced_tokens(self, target: str) -> list[int]:
        """The decoder prompt after the start token: the target language's token (none for
        Marian)."""
        return [] if self.family == "marian" else [self.target_token[target]]

    def target_ids_many(self, texts: list[str]) -> list[list[int]]:
        """Each text's tokens as the tokenizer writes target text (HF's `text_target`), without
        special tokens, and without switching the shared tokenizer to its target mode (which
        another thread may be tokenizing sources with): the same pieces as a source for
        NLLB, M2M100 and mBART-50; OPUS-MT's target SentencePiece model and vocabulary."""
        if not texts:
            return []
        tok = self.tokenizer
        if self.family != "marian":
            return tok(list(texts), add_special_tokens=False).input_ids
        vocab = tok.target_encoder if tok.separate_vocabs else tok.encoder
        unk = vocab[tok.unk_token]  # as MarianTokenizer maps a piece its vocabulary lacks
        return [[vocab.get(p, unk) for p in tok.spm_target.encode(t, out_type=str)]
                for t in texts]

    def _read_source_specials(self) -> None:
        """(prefix, suffix) the tokenizer adds for each source language, read once here (the
        tokenizer switched to each and back), so that no request ever switches the shared
        tokenizer while another tokenizes."""
        tok = self.tokenizer
        old = tok.src_lang
        try:
            for code in self.codes:
                tok.src_lang = code
                self._specials[code] = (list(tok.prefix_tokens), list(tok.suffix_tokens))
        finally:
            tok.src_lang = old
