"""Documents for the document-translation tests, built from parts whose kind is known: each
part is structure (markup, code, URLs, whitespace between sentences) or one sentence of text.
The parts are the tests' oracle: a scanner must find exactly the text parts, and a
translated document must be the structure parts, unchanged and in order, around each text
part's own translation.

The sentences hold digits, so that the demo model (numbers in digits to English words) gives
each its own translation, and no markup characters."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

WORDS = ["apples", "boxes", "rivers", "engines", "letters", "bridges", "gardens", "clocks",
         "stones", "maps", "songs", "ships", "towers", "lamps", "roads", "cards"]


@dataclass
class Sample:
    parts: list[tuple[str, str]] = field(default_factory=list)  # ("text" | "structure", str)

    def add(self, kind: str, value: str) -> None:
        if value:
            self.parts.append((kind, value))

    def s(self, value: str) -> Sample:
        self.add("structure", value)
        return self

    def t(self, value: str) -> Sample:
        self.add("text", value)
        return self

    @property
    def document(self) -> str:
        return "".join(v for _, v in self.parts)

    @property
    def texts(self) -> list[str]:
        return [v for k, v in self.parts if k == "text"]

    def spans(self) -> list[tuple[int, int]]:
        out, pos = [], 0
        for kind, value in self.parts:
            if kind == "text":
                out.append((pos, pos + len(value)))
            pos += len(value)
        return out

    def translated(self, translate) -> str:
        """The document with each text part replaced by `translate(part)`."""
        return "".join(translate(v) if k == "text" else v for k, v in self.parts)

    def words(self) -> int:
        return len(self.document.split())


class _Sentences:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def one(self, end: str = ".") -> str:
        r = self.rng
        n, m = r.randrange(2, 9999), r.randrange(2, 999)
        a, b = r.sample(WORDS, 2)
        return (f"Section {n} lists {m} {a} and {r.randrange(2, 99)} {b} for the "
                f"{r.choice(['north', 'south', 'east', 'west'])} team{end}")

    def short(self) -> str:
        r = self.rng
        return f"Item {r.randrange(2, 999)} holds {r.randrange(2, 99)} {r.choice(WORDS)}"


def markdown_sample(min_words: int = 5000, seed: int = 0) -> Sample:
    """A markdown document of at least `min_words` words with every construct the scanner
    knows: front matter, headings, wrapped paragraphs, code spans, links, emphasis, URLs,
    fenced and indented code, lists (tasks, nesting), block quotes, tables, HTML comments
    and blocks, images, reference definitions."""
    g, d = _Sentences(seed), Sample()
    d.s("---\ntitle: Report 12. Not text\nowner: team 7\n---\n\n")
    k = 0
    while d.words() < min_words:
        k += 1
        d.s("# ").t(f"Chapter {k} covers {g.rng.randrange(2, 99)} topics").s("\n\n")
        d.t(g.one()).s(" ").t(g.one()).s("\n").t(g.one()).s("\n\n")  # a wrapped paragraph
        d.t(g.short() + " and uses").s(" `make test-" + str(k) + "` ").t("on 12 machines.")
        d.s(" ").t("Read").s(" [").t(f"the guide {k}")
        d.s(f'](https://example.com/guide_{k}.html "Guide {k}") ').t("for 3 hours.").s("\n\n")
        d.t("This is").s(" **").t(f"very {k}").s("** ").t("important.").s(" ")
        d.t("Visit").s(f" https://example.com/a_{k}/b?c=1&d=2 ").t(f"today at {k}.").s("\n\n")
        d.s(f"```python\nprint('code {k}. Not text.')\nx = [1, 2]  # comment {k}\n```\n\n")
        d.t(g.one(end=":")).s("\n\n")
        d.s(f"    indented code {k}. Not text.\n    more code\n\n")
        d.s("- ").t(g.short()).s("\n- [x] ").t(g.short()).s("\n  - ").t(g.one()).s("\n")
        d.s("1. ").t(g.one()).s("\n2) ").t(g.short()).s("\n\n")
        d.s("> ").t(g.one()).s(" ").t(g.one()).s("\n> ").t(g.short()).s("\n\n")
        d.s("| ").t(f"Name {k}").s(" | ").t("Count").s(" |\n|---|:---:|\n| ").t(g.short())
        d.s(" | `n_" + str(k) + "` |\n\n")
        d.s(f"<!-- comment {k}. Not text. -->\n\n")
        d.s('<div class="note">\n').t(g.one()).s(" <b>").t(f"Bold {k}").s("</b>\n</div>\n\n")
        d.s(f"![figure {k}. Not text](img/figure_{k}.png) ").t(g.one()).s("\n\n")
        d.s("## ").t(f"Summary {k}").s(" ##\n\n")
        d.t(g.one()).s(f" <https://example.com/auto_{k}> ").t(g.one()).s("\n\n")
        d.t(f"Term_{k}_name appears").s(" ~~").t(f"twice {k}").s("~~\n\n")
        d.s("***\n\n")
    d.s(f"[guide]: https://example.com/ref_{k}\n")
    return d


def html_sample(sections: int = 12, seed: int = 1) -> Sample:
    """An HTML page with nested tags, attributes holding text-like values, entities,
    comments, scripts, styles, code and pre blocks, and a translate="no" element."""
    g, d = _Sentences(seed), Sample()
    d.s('<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>')
    d.t("Report 2024").s("</title>\n<style>p.note { color: red; } /* Not text. */</style>\n")
    d.s('<script>var s = "Not text 5."; if (a < b) { x(); }</script>\n</head>\n<body>\n')
    for k in range(1, sections + 1):
        d.s(f'<section id="s{k}" data-title="Section {k}. Not text">\n<h2>')
        d.t(f"Part {k} of {sections}").s("</h2>\n<p>").t(g.one()).s(" ").t(g.one())
        d.s(" <em>").t(f"Note {k}").s("</em> ").t("and").s(" <a href=\"/page?x=1&amp;y=2\" "
                                                         "title=\"Not text\">")
        d.t(f"link {k}").s("</a> ").t("today.").s("</p>\n")
        d.s("<ul>\n  <li>").t(g.short()).s("</li>\n  <li><strong>").t(f"Bold {k}")
        d.s("</strong> ").t(f"and {k} more").s("</li>\n</ul>\n")
        d.s("<p>").t(f"Tom &amp; Jerry ran {k} laps &lt;fast&gt;.").s("</p>\n")
        d.s(f"<pre><code>code {k}. Not text &amp; more\n  indented</code></pre>\n")
        d.s(f"<!-- comment {k}. Not text. -->\n")
        d.s(f'<p translate="no">Brand {k}. Not text.</p>\n')
        d.s("<p>").t(g.one()).s(f" <code>inline_{k}()</code> ").t(g.one()).s("<br>\n")
        d.t(g.one()).s("</p>\n</section>\n")
    d.s("</body>\n</html>\n")
    return d


def repeated_documents(count: int = 200, repeat_share: float = 0.3, seed: int = 2,
                       sentences_per_doc: tuple[int, int] = (3, 5),
                       ) -> tuple[list[str], list[list[str]]]:
    """`count` plain-text documents of 3 to 5 sentences (`sentences_per_doc`, both ends
    included), `repeat_share` of all sentences drawn from a small pool of common ones
    (headers, boilerplate) and the rest unique. The documents and each one's sentences."""
    g = _Sentences(seed)
    common = [f"Page {i} of the manual." for i in range(1, 13)]
    docs, sentences = [], []
    low, high = sentences_per_doc
    for _ in range(count):
        mine = [g.rng.choice(common) if g.rng.random() < repeat_share else g.one()
                for _ in range(g.rng.randrange(low, high + 1))]
        sentences.append(mine)
        docs.append(join_sentences(mine))
    return docs, sentences


def join_sentences(sentences: list[str]) -> str:
    """A plain-text document of these sentences: two in a first paragraph, then the rest."""
    return " ".join(sentences[:2]) + "\n\n" + " ".join(sentences[2:])
