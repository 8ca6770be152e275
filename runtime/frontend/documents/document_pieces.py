"""A document's pieces: its format's text runs, cut into sentences, and each sentence cut at
clause boundaries when it does not fit the model's input. Each piece's text is what the
model is given (HTML entities decoded); `encoder_of` says how its translation goes back."""

from __future__ import annotations

from collections.abc import Callable

from seq2serve.runtime.frontend.documents.clauses import fitting_spans
from seq2serve.runtime.frontend.documents.html_text import decode_text, encode_text, html_runs
from seq2serve.runtime.frontend.documents.markdown_blocks import markdown_runs
from seq2serve.runtime.frontend.documents.pieces import Piece, Span, has_words
from seq2serve.runtime.frontend.documents.sentences import sentence_spans

FORMATS = ("text", "markdown", "html")


def text_runs(document: str, fmt: str) -> list[Span]:
    """The stretches of `document` that are text in format `fmt` (all of it, for text)."""
    if fmt == "text":
        return [(0, len(document))] if document else []
    if fmt == "markdown":
        return markdown_runs(document)
    if fmt == "html":
        return html_runs(document)
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def encoder_of(fmt: str) -> Callable[[str], str]:
    """How a translation is written into a document of format `fmt`."""
    return encode_text if fmt == "html" else _same


def document_pieces(document: str, fmt: str, language: str,
                    fits: Callable[[str], bool]) -> list[Piece]:
    """The pieces of `document` to translate, in order: sentences (sentencex rules for
    `language`, an ISO 639-1 code) of its text runs, each cut at clause boundaries until
    `fits` its text."""
    decode = decode_text if fmt == "html" else _same
    pieces = []
    for run in text_runs(document, fmt):
        for sentence in sentence_spans(document, run, language):
            for start, end in fitting_spans(document, sentence,
                                            lambda raw: fits(decode(raw))):
                text = decode(document[start:end])
                if has_words(text):
                    pieces.append(Piece(start, end, text))
    return pieces


def _same(text: str) -> str:
    return text
