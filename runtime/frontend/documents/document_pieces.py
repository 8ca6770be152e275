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


def document_sentences(document: str, fmt: str, language: str) -> list[Piece]:
    """The sentences of `document`'s text runs (sentencex rules for `language`, an ISO 639-1
    code), in order, as pieces."""
    decode = decode_text if fmt == "html" else _same
    out = []
    for run in text_runs(document, fmt):
        for start, end in sentence_spans(document, run, language):
            text = decode(document[start:end])
            if has_words(text):
                out.append(Piece(start, end, text))
    return out


def document_text(document: str, fmt: str, limit: int) -> str:
    """The first `limit` characters of `document`'s text (its text runs, decoded, one per
    line): what its language is detected from, without markup."""
    decode = decode_text if fmt == "html" else _same
    out, size = [], 0
    for start, end in text_runs(document, fmt):
        out.append(decode(document[start:min(end, start + limit - size)]))
        size += len(out[-1]) + 1
        if size >= limit:
            break
    return "\n".join(out)


def cut_to_fit(document: str, sentence: Piece, fmt: str,
               fits: Callable[[str], bool]) -> list[Piece]:
    """A sentence that does not fit the model's input, as clause-bounded pieces that each
    `fits` (their text, as the model gets it)."""
    decode = decode_text if fmt == "html" else _same
    out = []
    for start, end in fitting_spans(document, (sentence.start, sentence.end),
                                    lambda raw: fits(decode(raw))):
        text = decode(document[start:end])
        if has_words(text):
            out.append(Piece(start, end, text))
    return out


def document_pieces(document: str, fmt: str, language: str,
                    fits: Callable[[str], bool]) -> list[Piece]:
    """The pieces of `document` to translate, in order: its sentences, each cut at clause
    boundaries when it does not `fits` (one call of `fits` per sentence that does)."""
    return [p for s in document_sentences(document, fmt, language)
            for p in ([s] if fits(s.text) else cut_to_fit(document, s, fmt, fits))]


def _same(text: str) -> str:
    return text
