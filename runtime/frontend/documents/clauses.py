"""A sentence longer than the model's input limit, cut at clause boundaries so that every
piece fits: after semicolons, then commas, then at whitespace, and as a last resort (a run
of text without any of them, such as a long CJK clause) between characters. Never truncated:
the pieces together cover the sentence, and only whitespace between them is left out (it
stays in the document)."""

from __future__ import annotations

import re
from collections.abc import Callable

from seq2serve.runtime.frontend.documents.pieces import Span, has_words, trimmed

# where a piece may end, strongest boundary first; each cut is after the match
_CUTS = (
    re.compile(r"[;\uff1b]\s*|[:\uff1a]\s+"),  # ; (and full-width), a colon before a space
    re.compile(r"[,\uff0c\u3001\u060c]\s*"),  # , (full-width, ideographic, Arabic)
    re.compile(r"\s+"),
)


def fitting_spans(text: str, span: Span, fits: Callable[[str], bool]) -> list[Span]:
    """text[span] as one span if `fits` it, else as consecutive clause-bounded spans that
    each fit (as long as they can be while fitting). ValueError if not even one character
    fits (a limit smaller than the prompt around the text)."""
    start, end = span
    if fits(text[start:end]):
        return [span]
    return _split(text, span, fits, 0)


def _split(text: str, span: Span, fits: Callable[[str], bool], level: int) -> list[Span]:
    if level == len(_CUTS):
        return _by_characters(text, span, fits)
    out: list[Span] = []
    current: Span | None = None
    for part in _parts(text, span, _CUTS[level]):
        if current is not None and fits(text[current[0]:part[1]]):
            current = (current[0], part[1])
            continue
        if current is not None:
            out.append(current)
        if fits(text[part[0]:part[1]]):
            current = part
        else:  # one clause too long on its own: cut it at the next kind of boundary
            out += _split(text, part, fits, level + 1)
            current = None
    if current is not None:
        out.append(current)
    return out


def _parts(text: str, span: Span, cut: re.Pattern) -> list[Span]:
    """text[span] cut after each match of `cut`, each part trimmed (parts of whitespace or
    punctuation alone are glued to the part before, so that no boundary is lost)."""
    start, end = span
    parts, pos = [], start
    for m in cut.finditer(text, start, end):
        if m.end() < end:
            parts.append((pos, m.end()))
            pos = m.end()
    parts.append((pos, end))
    out: list[Span] = []
    for s, e in parts:
        t = trimmed(text, s, e)
        if t is None:
            continue
        if out and not has_words(text[t[0]:t[1]]):
            out[-1] = (out[-1][0], t[1])
        else:
            out.append(t)
    return out


def _by_characters(text: str, span: Span, fits: Callable[[str], bool]) -> list[Span]:
    """The longest prefixes that fit, one after another (binary search on each)."""
    out, (start, end) = [], span
    while start < end:
        lo, hi = start + 1, end  # the longest fitting end is in [lo, hi]
        if not fits(text[start:lo]):
            raise ValueError("the model's input limit leaves no room for even one character "
                             "of text around the translation prompt")
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(text[start:mid]):
                lo = mid
            else:
                hi = mid - 1
        piece = trimmed(text, start, lo)
        if piece is not None:
            out.append(piece)
        nxt = trimmed(text, lo, end)
        start = nxt[0] if nxt else end
    return out
