"""The text nodes of an HTML document (or of an HTML block inside markdown), found with the
standard library's `html.parser` and located by their offsets: nothing is re-serialised, so
tags, attributes, comments and declarations stay byte for byte. The contents of `<script>`,
`<style>`, `<code>`, `<pre>` (and `<kbd>`, `<samp>`, `<var>`, `<textarea>`, `<svg>`,
`<math>`) and of any element marked `translate="no"` or `class="notranslate"` are left as
they are. Text handed to the model is decoded (`&amp;` is "&") and its translation encoded
back (`encode_text`)."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

from seq2serve.runtime.frontend.documents.pieces import Span

UNTOUCHED = frozenset({"script", "style", "code", "pre", "kbd", "samp", "var", "textarea",
                       "svg", "math"})
VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                  "param", "source", "track", "wbr"})
_TEXT = ("data", "entityref", "charref")
_MARKUP_OPEN = re.compile(r"<[A-Za-z/!?]")


def html_runs(text: str, region: Span | None = None) -> list[Span]:
    """The runs of text-node characters in text[region] (the whole text by default), entity
    references included, outside untouched elements. An unclosed tag at the end (a `<` with
    no `>` after it) and what follows are markup. ValueError for markup the parser
    rejects."""
    start, end = region or (0, len(text))
    end = _before_unclosed_markup(text, start, end)
    parser = _Events()
    try:
        parser.feed(text[start:end])
        parser.close()
    except (AssertionError, ValueError) as e:  # html.parser's rare refusals (marked sections)
        raise ValueError(f"not parseable as HTML: {e}") from None
    lines = [0] + [i + 1 for i, c in enumerate(text[start:end]) if c == "\n"]
    offsets = [start + lines[line - 1] + col for line, col in parser.positions]
    offsets.append(end)
    runs: list[Span] = []
    for i, (kind, untouched) in enumerate(parser.events):
        if kind not in _TEXT or untouched:
            continue
        s, e = offsets[i], offsets[i + 1]
        if runs and runs[-1][1] == s:
            runs[-1] = (runs[-1][0], e)
        elif s < e:
            runs.append((s, e))
    return runs


def _before_unclosed_markup(text: str, start: int, end: int) -> int:
    """Where markup that never closes begins: the first `<` opening a tag, comment or
    declaration after the last `>` (else `end`). html.parser would hand it over as text, and
    re-scan the rest of the document for each such `<`: 33,000 `<a ` took 120 s."""
    last_close = text.rfind(">", start, end)
    m = _MARKUP_OPEN.search(text, max(start, last_close + 1), end)
    return m.start() if m else end


def decode_text(raw: str) -> str:
    return html.unescape(raw)


def encode_text(translation: str) -> str:
    """A translation as text-node characters: &, < and > escaped (quotes need not be)."""
    return html.escape(translation, quote=False)


class _Events(HTMLParser):
    """Every event in order with its (line, column) and whether it lies inside an element
    left untouched."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)  # entity references as their own events
        self.events: list[tuple[str, bool]] = []  # (kind, inside an untouched element)
        self.positions: list[tuple[int, int]] = []
        self.untouched: list[str] = []  # open untouched elements, innermost last

    def _event(self, kind: str) -> None:
        self.events.append((kind, bool(self.untouched)))
        self.positions.append(self.getpos())

    def handle_starttag(self, tag, attrs):
        self._event("starttag")
        if tag not in VOID and (tag in UNTOUCHED or _marked_untouched(attrs)):
            self.untouched.append(tag)

    def handle_startendtag(self, tag, attrs):
        self._event("startendtag")

    def handle_endtag(self, tag):
        self._event("endtag")
        if tag in self.untouched:  # closes it and anything left open inside it
            del self.untouched[len(self.untouched) - 1 - self.untouched[::-1].index(tag):]

    def handle_data(self, data):
        self._event("data")

    def handle_entityref(self, name):
        self._event("entityref")

    def handle_charref(self, name):
        self._event("charref")

    def handle_comment(self, data):
        self._event("comment")

    def handle_decl(self, decl):
        self._event("decl")

    def handle_pi(self, data):
        self._event("pi")

    def unknown_decl(self, data):
        self._event("unknown_decl")


def _marked_untouched(attrs: list[tuple[str, str | None]]) -> bool:
    for name, value in attrs:
        if name == "translate" and (value or "").strip().lower() == "no":
            return True
        if name == "class" and "notranslate" in (value or "").split():
            return True
    return False
