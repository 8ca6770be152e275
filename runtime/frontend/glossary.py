"""Glossaries of a translation (issue 42): `{"source term": "target term", ...}` given with a
request, or the name of one the server loaded at start (`--glossary NAME=path.json`).

A source term occurs in a text where it matches case-insensitively (Python's `re.IGNORECASE`)
and is not part of a longer word: no letter, digit or underscore right before or after it
(for a term that begins or ends with a letter of a script written without spaces, CJK, kana,
Thai, Lao, Khmer, Myanmar, that end has no such condition). Occurrences are found
leftmost-longest without overlap ("New York" wins over "York" in "New York"). The target
term is required exactly as given (its case included), as a whole word by the same rule;
inflection is not handled: the glossary must hold each form it wants.
Every check is a ValueError that starts with the field's name, `glossary` (the 400's param).
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_TERMS = 10_000  # entries in one glossary
MAX_TERM_CHARS = 200  # characters in one term, source or target


@dataclass(frozen=True)
class Glossary:
    """Source term -> target term, with the source terms compiled into one matcher."""

    terms: dict[str, str]  # as given
    pattern: re.Pattern | None  # every source term, longest first, on word boundaries

    @classmethod
    def of(cls, value: Any, where: str = "glossary") -> Glossary:
        """Check a glossary (a JSON object of non-empty strings) and compile it."""
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be an object of source term -> target term "
                             f"(strings), or the name of a server glossary; got "
                             f"{type(value).__name__}")
        if len(value) > MAX_TERMS:
            raise ValueError(f"{where} has {len(value)} terms, over the limit of {MAX_TERMS}")
        folded: dict[str, str] = {}
        for source, target in value.items():
            for kind, term in (("source", source), ("target", target)):
                if not isinstance(term, str):
                    raise ValueError(f"{where}: the {kind} term of {source!r} must be a "
                                     f"string, got {type(term).__name__}")
                if not term.strip():
                    raise ValueError(f"{where}: an empty {kind} term ({source!r}: {target!r})")
                if len(term) > MAX_TERM_CHARS:
                    raise ValueError(f"{where}: the {kind} term {term[:40]!r}... is "
                                     f"{len(term)} characters, over {MAX_TERM_CHARS}")
            key = source.strip().casefold()
            if key in folded and folded[key] != target.strip():
                raise ValueError(f"{where}: {source!r} is given twice (in another case) with "
                                 f"different target terms")
            folded[key] = target.strip()
        terms = {s.strip(): t.strip() for s, t in value.items()}
        return cls(terms, _pattern(list(terms)))

    def found(self, text: str) -> list[str]:
        """The target terms whose source terms occur in `text`, in source order, each once."""
        if self.pattern is None:
            return []
        lookup = {s.casefold(): t for s, t in self.terms.items()}
        return list(dict.fromkeys(lookup[m.group(0).casefold()]
                                  for m in self.pattern.finditer(text)))


def term_regex(term: str) -> str:
    """`term` as a regex that matches it as a whole word (see the module's docstring)."""
    head = r"(?<!\w)" if _word_edge(term[0]) else ""
    tail = r"(?!\w)" if _word_edge(term[-1]) else ""
    return head + re.escape(term) + tail


def holds(text: str, term: str) -> bool:
    """`text` has `term`, exactly (case included), as a whole word: a target term is there."""
    return re.search(term_regex(term), text) is not None


_NO_SPACES = ("CJK", "HIRAGANA", "KATAKANA", "THAI", "LAO", "KHMER", "MYANMAR", "IDEOGRAPHIC")


def _word_edge(c: str) -> bool:
    return (c.isalnum() or c == "_") and not unicodedata.name(c, "").startswith(_NO_SPACES)


def _pattern(sources: list[str]) -> re.Pattern | None:
    if not sources:
        return None
    ordered = sorted(sources, key=len, reverse=True)  # leftmost-longest
    return re.compile("|".join(term_regex(s) for s in ordered), re.IGNORECASE)


def request_glossary(value: Any, named: dict[str, Glossary]) -> Glossary | None:
    """A request's `glossary`: None (none), an object of terms, or a server glossary's name."""
    if value is None:
        return None
    if isinstance(value, str):
        if value not in named:
            have = ", ".join(sorted(named)) or "none (start it with --glossary NAME=path.json)"
            raise ValueError(f"glossary {value!r} is not one of this server's glossaries: "
                             f"{have}")
        return named[value]
    return Glossary.of(value)


def load_named(spec: str | None) -> dict[str, Glossary]:
    """`--glossary NAME=path.json[,NAME2=path2.json]`: each file a JSON object of source term
    -> target term. A ValueError naming the flag, the name or the file for what is wrong."""
    out: dict[str, Glossary] = {}
    for item in filter(None, (part.strip() for part in (spec or "").split(","))):
        name, sep, path = item.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or not path:
            raise ValueError(f"--glossary takes NAME=path.json (NAME of letters, digits, _ . -), "
                             f"comma-separated; got {item!r}")
        if name in out:
            raise ValueError(f"--glossary names {name!r} twice")
        try:
            value = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"--glossary {name}: cannot read {path} as JSON: {e}") from None
        out[name] = Glossary.of(value, f"--glossary {name} ({path})")
    return out
