"""The text runs of one markdown paragraph (or heading, list item, table cell): what lies
between its inline structure. Structure, left as it is: code spans, autolinks and bare
URLs, inline HTML (tags and comments; `<code>`, `<kbd>`... elements whole), images whole,
link and footnote-reference brackets with their targets (`](url "title")`, `][ref]`; the
link text between them is text), and emphasis delimiters (`*`, `_`, `~~` runs that open or
close, as CommonMark's flanking rules say; an intraword `snake_case` is text).

Every lookup is precomputed in one pass over the paragraph (code spans by pairing backtick
runs, brackets and parentheses by stacks, comment and element ends by position), so a
paragraph of unmatched `[`, backticks or `<!--` costs linear time, not quadratic."""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterator

from seq2serve.runtime.frontend.documents.pieces import Span

_ESCAPABLE = set("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_RAW_ELEMENTS = ("code", "pre", "script", "style", "kbd", "samp", "var", "math", "svg",
                 "textarea")
_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9-]*(?:\s+[A-Za-z_:][\w.:-]*(?:\s*=\s*(?:[^\s\"'=<>`]+"
                  r"|'[^']*'|\"[^\"]*\"))?)*\s*/?>")
_AUTOLINK = re.compile(r"<(?:[A-Za-z][A-Za-z0-9+.-]{1,31}:[^\s<>]*|[\w.!#$%&'*+/=?^`{|}~-]+@"
                       r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)*)>")
_URL = re.compile(r"(?:https?://|ftp://|www\.)[^\s<>\"`]+", re.I)
_COMMENT_END = re.compile("-->")
_RAW_CLOSE = re.compile(r"</(" + "|".join(_RAW_ELEMENTS) + r")\s*>", re.I)
_TAG_WINDOW = 1024  # the longest inline tag looked for (bounds a lookahead)
_MAX_DEPTH = 16  # link text inside link text, deeper than this, is text


def inline_runs(text: str, region: Span) -> list[Span]:
    """The stretches of text[region] outside inline structure, in order."""
    runs, pos = [], region[0]
    for s, e in _Scanner(text, region).structure(region, 0):
        if s > pos:
            runs.append((pos, s))
        pos = max(pos, e)
    if pos < region[1]:
        runs.append((pos, region[1]))
    return runs


class _Scanner:
    def __init__(self, text: str, region: Span) -> None:
        self.text = text
        self.code = _code_spans(text, region)  # start -> end
        skip = dict(self.code)
        self.brackets = _pairs(text, region, "[", "]", skip)
        self.parens = _pairs(text, region, "(", ")", skip)
        self.comment_ends = [m.end() for m in _COMMENT_END.finditer(text, *region)]
        self.raw_closes: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for m in _RAW_CLOSE.finditer(text, region[0], region[1]):
            self.raw_closes[m[1].lower()].append((m.start(), m.end()))

    def structure(self, region: Span, depth: int) -> Iterator[Span]:
        """Structure spans in text[region], in order (link text scanned in turn)."""
        text, (i, end) = self.text, region
        while i < end:
            c = text[i]
            if c == "\\" and i + 1 < end and text[i + 1] in _ESCAPABLE:
                i += 2
            elif c == "`":
                stop = self.code.get(i) or _run_end(text, i, end, "`")
                yield i, min(stop, end)
                i = min(stop, end)
            elif c == "<" and (stop := self._markup_end(i, end)):
                yield i, stop
                i = stop
            elif c == "!" and text.startswith("[", i + 1) and (stop := self._link_end(i + 1,
                                                                                       end)):
                yield i, stop  # an image: alt text, source and title alike
                i = stop
            elif c == "[" and i in self.brackets and self.brackets[i] < end:
                close = self.brackets[i]
                stop = self._link_end(i, end) or close + 1
                if text.startswith("^", i + 1):  # a footnote reference
                    yield i, stop
                elif depth >= _MAX_DEPTH:
                    yield i, i + 1
                    yield close, stop
                else:
                    yield i, i + 1
                    yield from self.structure((i + 1, close), depth + 1)
                    yield close, stop
                i = stop
            elif c in "hHfFwW" and (i == 0 or not text[i - 1].isalnum()) and (
                    stop := _url_end(text, i, end)):
                yield i, stop
                i = stop
            elif c in "*_~":
                stop = _run_end(text, i, end, c)
                if _is_delimiter(text, i, stop, region):
                    yield i, stop
                i = stop
            else:
                i += 1

    def _markup_end(self, i: int, end: int) -> int | None:
        text = self.text
        if text.startswith("<!--", i):
            k = bisect_left(self.comment_ends, i + 7)  # "<!---->" is the shortest comment
            stop = self.comment_ends[k] if k < len(self.comment_ends) else None
            return stop if stop is not None and stop <= end else None
        m = _AUTOLINK.match(text, i, min(end, i + _TAG_WINDOW))
        if m:
            return m.end()
        m = _TAG.match(text, i, min(end, i + _TAG_WINDOW))
        if not m:
            return None
        name = re.match(r"</?([A-Za-z][A-Za-z0-9-]*)", m[0])[1].lower()
        if name in _RAW_ELEMENTS and not m[0].startswith("</") and not m[0].endswith("/>"):
            closes = self.raw_closes.get(name, [])
            k = bisect_left(closes, (m.end(), 0))
            if k < len(closes) and closes[k][1] <= end:
                return closes[k][1]  # the element whole: its contents are not text
        return m.end()

    def _link_end(self, open_at: int, end: int) -> int | None:
        """Where a link (or image) that opens at `open_at` ends: after `](destination)` or
        `][label]`; None if its bracket is not closed."""
        close = self.brackets.get(open_at)
        if close is None or close >= end:
            return None
        after = close + 1
        if self.text.startswith("(", after) and self.parens.get(after, end) < end:
            return self.parens[after] + 1
        if self.text.startswith("[", after) and self.brackets.get(after, end) < end:
            return self.brackets[after] + 1
        return after


def _code_spans(text: str, region: Span) -> dict[int, int]:
    """Code spans by CommonMark's rule: a backtick run pairs with the next run of the same
    length (runs inside a span are its content); backslashes do not escape inside."""
    runs = []
    i, end = region
    while i < end:
        if text[i] == "\\" and i + 1 < end and text[i + 1] == "`":
            i += 2
            continue
        if text[i] == "`":
            stop = _run_end(text, i, end, "`")
            runs.append((i, stop - i))
            i = stop
        else:
            i += 1
    by_length: dict[int, list[int]] = defaultdict(list)
    for k, (_, n) in enumerate(runs):
        by_length[n].append(k)
    spans, covered = {}, region[0]
    for k, (start, n) in enumerate(runs):
        if start < covered:
            continue
        same = by_length[n]
        j = bisect_left(same, k + 1)
        if j < len(same):
            close_start, _ = runs[same[j]]
            spans[start] = covered = close_start + n
    return spans


def _pairs(text: str, region: Span, opener: str, closer: str,
           skip: dict[int, int]) -> dict[int, int]:
    """Each opener's matching closer (nesting counted; escapes and code spans skipped)."""
    pairs, stack = {}, []
    i, end = region
    while i < end:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if i in skip:
            i = skip[i]
            continue
        if c == opener:
            stack.append(i)
        elif c == closer and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def _run_end(text: str, i: int, end: int, c: str) -> int:
    while i < end and text[i] == c:
        i += 1
    return i


def _url_end(text: str, i: int, end: int) -> int | None:
    """A bare URL's end, without trailing punctuation (and an unbalanced closing parenthesis)
    that belongs to the sentence."""
    m = _URL.match(text, i, end)
    if not m:
        return None
    stop = m.end()
    while stop > i:
        last = text[stop - 1]
        if last in ".,:;!?'\"*_~":
            stop -= 1
        elif last == ")" and text.count("(", i, stop) < text.count(")", i, stop):
            stop -= 1
        else:
            break
    return stop if stop - i > 4 else None


def _is_delimiter(text: str, i: int, stop: int, region: Span) -> bool:
    """An emphasis run that can open or close (CommonMark's left- and right-flanking), but not
    both: a run inside a word is text (`snake_case`, `2*3*4`). `~` needs two."""
    if text[i] == "~" and stop - i < 2:
        return False
    before = text[i - 1] if i > region[0] else " "
    after = text[stop] if stop < region[1] else " "
    left = not after.isspace() and (not _punct(after) or before.isspace() or _punct(before))
    right = not before.isspace() and (not _punct(before) or after.isspace() or _punct(after))
    return left != right


def _punct(c: str) -> bool:
    return unicodedata.category(c)[0] in "PS"
