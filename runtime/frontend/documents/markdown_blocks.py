"""The text runs of a markdown document, by a hand-written line scanner (a CommonMark + GFM
subset; no parser that re-serialises, so every character outside the runs stays as it is).

Blocks left whole: fenced and indented code, front matter (`---` ... `---` at the top),
thematic breaks and setext underlines, link reference definitions, table delimiter rows,
and HTML blocks (whose text nodes are translated as in an HTML document: `html_text.py`).
Block markers are structure: `#` of headings (and their closing `#`s), `>` of block quotes,
list markers and task boxes, table pipes. What is left (paragraphs, whose wrapped lines
are one region; headings; list items; table cells) goes through `markdown_inline.py`."""

from __future__ import annotations

import re

from seq2serve.runtime.frontend.documents.html_text import html_runs
from seq2serve.runtime.frontend.documents.markdown_inline import inline_runs
from seq2serve.runtime.frontend.documents.pieces import Span

_QUOTE = re.compile(r" {0,3}> ?")
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")
_THEMATIC = re.compile(r" {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_SETEXT = re.compile(r" {0,3}(?:=+|-+)[ \t]*$")
_ATX = re.compile(r" {0,3}#{1,6}(?:[ \t]+|$)")
_ATX_CLOSE = re.compile(r"(?:^|[ \t]+)#+[ \t]*$")
_LIST = re.compile(r" {0,3}(?:[-+*]|\d{1,9}[.)])(?:[ \t]+|$)")
_TASK = re.compile(r"\[[ xX]\](?:[ \t]+|$)")
_LINK_DEF = re.compile(r" {0,3}\[(?!\^)(?:\\.|[^\\\]])+\]:[ \t]*\S")
_FOOTNOTE_DEF = re.compile(r" {0,3}\[\^[^\]]+\]:[ \t]*")
_TABLE_DELIM = re.compile(r" {0,3}\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$")
_FRONT_MATTER = re.compile(r"---[ \t]*$")
_FRONT_MATTER_END = re.compile(r"(?:---|\.\.\.)[ \t]*$")
_HTML_RAW = re.compile(r" {0,3}<(script|pre|style|textarea)(?:[\s>]|$)", re.I)
_HTML_COMMENT = re.compile(r" {0,3}<!--")
_HTML_OTHER = re.compile(r" {0,3}<(?:\?|![A-Za-z]|!\[CDATA\[|/?[A-Za-z][A-Za-z0-9-]*(?:[\s/>]|$))")


def markdown_runs(text: str) -> list[Span]:
    """The runs of translatable text of a markdown document, in order."""
    return _Blocks(text).scan()


class _Blocks:
    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = _lines(text)
        self.runs: list[Span] = []
        self.para: Span | None = None  # the paragraph being gathered (wrapped lines joined)

    def scan(self) -> list[Span]:
        text, lines = self.text, self.lines
        i = self._front_matter()
        list_indent: int | None = None  # content column of the list being read
        prev_blank = True
        while i < len(lines):
            start, end = lines[i]
            c = self._after_quotes(start, end)
            if not text[c:end].strip():
                self._flush()
                prev_blank, i = True, i + 1
                continue
            indent = _indent(text, c, end)
            if list_indent is not None and prev_blank and indent < list_indent \
                    and not _LIST.match(text, c, end):
                list_indent = None  # a line left of the list's content ends it
            base = list_indent or 0
            c = c + min(indent, base, _spaces(text, c, end))  # the list's indent stripped
            prev_blank = False
            if indent >= base + 4 and self.para is None:  # indented code
                i += 1
                continue
            if m := _FENCE.match(text, c, end):
                if not (m[1][0] == "`" and "`" in m[2]):
                    self._flush()
                    i = self._fence_end(i, m[1], base)
                    continue
            if self.para is None and (stop := self._html_block(i, c, end)) is not None:
                i = stop
                continue
            if _THEMATIC.match(text, c, end) or (self.para is not None
                                                 and _SETEXT.match(text, c, end)):
                self._flush()
                i += 1
                continue
            if m := _ATX.match(text, c, end):
                self._flush()
                self._heading(m.end(), end)
                i += 1
                continue
            if self.para is None and _LINK_DEF.match(text, c, end):
                i += 1
                continue
            if m := _FOOTNOTE_DEF.match(text, c, end):
                self._flush()
                self._paragraph(m.end(), end)
                i += 1
                continue
            if "|" in text[c:end] and self._table_follows(i):
                self._flush()
                i = self._table(i)
                continue
            if m := _LIST.match(text, c, end):
                self._flush()
                list_indent = m.end() - self._after_quotes(start, end)
                content = m.end()
                if t := _TASK.match(text, content, end):
                    content = t.end()
                self._paragraph(content, end)
                i += 1
                continue
            self._paragraph(c + _spaces(text, c, end), end)
            i += 1
        self._flush()
        return self.runs

    # --- blocks ------------------------------------------------------------------------------
    def _front_matter(self) -> int:
        """The first line after a YAML front matter block (0 without one)."""
        text, lines = self.text, self.lines
        if not lines or not _FRONT_MATTER.match(text, *lines[0]):
            return 0
        for j in range(1, len(lines)):
            if _FRONT_MATTER_END.match(text, *lines[j]):
                return j + 1
        return 0

    def _fence_end(self, i: int, fence: str, base: int) -> int:
        """The line after the fence that closes the one opening at line i (the end of the
        document if none does)."""
        close = re.compile(r" {0,3}" + re.escape(fence[0]) + "{" + str(len(fence)) +
                           r",}[ \t]*$")
        for j in range(i + 1, len(self.lines)):
            start, end = self.lines[j]
            c = self._after_quotes(start, end)
            c += min(base, _spaces(self.text, c, end))
            if close.match(self.text, c, end):
                return j + 1
        return len(self.lines)

    def _html_block(self, i: int, c: int, end: int) -> int | None:
        """An HTML block starting at line i: its text nodes as runs; the line after it."""
        text, lines = self.text, self.lines
        if m := _HTML_RAW.match(text, c, end):
            closing = re.compile(f"</{m[1]}>", re.I)
            last = next((j for j in range(i, len(lines)) if closing.search(text, *lines[j])),
                        len(lines) - 1)
        elif _HTML_COMMENT.match(text, c, end):
            last = next((j for j in range(i, len(lines)) if "-->" in text[slice(*lines[j])]),
                        len(lines) - 1)
        elif _HTML_OTHER.match(text, c, end):
            last = next((j - 1 for j in range(i + 1, len(lines))
                         if not text[slice(*lines[j])].strip()), len(lines) - 1)
        else:
            return None
        try:
            self.runs += html_runs(text, (c, lines[last][1]))
        except ValueError:  # markup html.parser refuses: left whole
            pass
        return last + 1

    def _heading(self, content: int, end: int) -> None:
        m = _ATX_CLOSE.search(self.text, content, end)
        self._region(content, m.start() if m else end)

    def _table_follows(self, i: int) -> bool:
        if i + 1 >= len(self.lines):
            return False
        start, end = self.lines[i + 1]
        c = self._after_quotes(start, end)
        return "|" in self.text[c:end] and bool(_TABLE_DELIM.match(self.text, c, end))

    def _table(self, i: int) -> int:
        """A table's header row, delimiter row and body rows (up to a blank line or a line
        without a pipe): each cell's content is a region. The line after the table."""
        text, lines = self.text, self.lines
        self._cells(*lines[i])
        j = i + 2
        while j < len(lines):
            start, end = lines[j]
            if not text[start:end].strip() or "|" not in text[start:end]:
                break
            self._cells(start, end)
            j += 1
        return j

    def _cells(self, start: int, end: int) -> None:
        pos = k = self._after_quotes(start, end)
        while k < end:
            if self.text[k] == "\\":
                k += 2
                continue
            if self.text[k] == "|":
                self._region(pos, k)
                pos = k + 1
            k += 1
        self._region(pos, end)

    # --- regions -----------------------------------------------------------------------------
    def _paragraph(self, start: int, end: int) -> None:
        """A paragraph line: joined to the paragraph being gathered when only whitespace (a
        line break, indentation) lies between them."""
        if self.para is not None and not self.text[self.para[1]:start].strip():
            self.para = (self.para[0], end)
            return
        self._flush()
        self.para = (start, end)

    def _flush(self) -> None:
        if self.para is not None:
            self._region(*self.para)
            self.para = None

    def _region(self, start: int, end: int) -> None:
        while start < end and self.text[start].isspace():
            start += 1
        while end > start and self.text[end - 1].isspace():
            end -= 1
        if start < end:
            self.runs += inline_runs(self.text, (start, end))

    def _after_quotes(self, start: int, end: int) -> int:
        c = start
        while m := _QUOTE.match(self.text, c, end):
            c = m.end()
        return c


def _lines(text: str) -> list[Span]:
    """Each line's [start, end) without its line break ("\n" or "\r\n")."""
    out, pos = [], 0
    while pos < len(text):
        nl = text.find("\n", pos)
        stop = len(text) if nl < 0 else nl
        out.append((pos, stop - 1 if stop > pos and text[stop - 1] == "\r" else stop))
        pos = stop + 1
    return out


def _spaces(text: str, c: int, end: int) -> int:
    k = c
    while k < end and text[k] in " \t":
        k += 1
    return k - c


def _indent(text: str, c: int, end: int) -> int:
    """The columns of leading whitespace (a tab to the next multiple of 4)."""
    col = 0
    for ch in text[c:end]:
        if ch == " ":
            col += 1
        elif ch == "\t":
            col += 4 - col % 4
        else:
            break
    return col
