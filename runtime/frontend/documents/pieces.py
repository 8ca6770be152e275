"""`Piece`: a stretch of a document that is translated, and `reassemble`: a document with its
pieces replaced by their translations and every other character kept as it was."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

Span = tuple[int, int]  # [start, end) character offsets into a document


@dataclass(frozen=True)
class Piece:
    """The document's characters [start, end) are replaced by the translation of `text`
    (the same characters, but for HTML, where entities are decoded first)."""

    start: int
    end: int
    text: str

    def __post_init__(self) -> None:
        assert 0 <= self.start < self.end, (self.start, self.end)


def reassemble(document: str, pieces: Sequence[Piece], translations: Sequence[str],
               encode: Callable[[str], str] = str) -> str:
    """`document` with each piece (in order, not overlapping) replaced by `encode` of its
    translation: outside the pieces the result is the document, byte for byte."""
    assert len(pieces) == len(translations), (len(pieces), len(translations))
    out, pos = [], 0
    for piece, translation in zip(pieces, translations):
        assert piece.start >= pos, "pieces overlap or are out of order"
        out.append(document[pos:piece.start])
        out.append(encode(translation))
        pos = piece.end
    out.append(document[pos:])
    return "".join(out)


def has_words(text: str) -> bool:
    """Worth translating: a letter or a digit (of any script). Runs of punctuation, symbols
    and whitespace between structure stay as they are."""
    return any(c.isalnum() for c in text)


def trimmed(text: str, start: int, end: int) -> Span | None:
    """[start, end) without its leading and trailing whitespace; None when nothing is left."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None
