"""A small controlled language, English to German, with its exact translation: the task the
bundled demo Marian (models/assets/demo-marian-en-de, scripts/train_marian_demo.py) was
trained on, and the oracle its tests check it against.

Sentences are drawn from a grammar of noun phrases (numbers in digits, adjectives, the
definite and indefinite articles, plural subjects), verbs, prepositional phrases and
adverbs. The German side follows German grammar where the grammar reaches: gender, case
(nominative, accusative, dative with `im`/`in der`), adjective endings (strong after a
number, weak after `der`, mixed after `ein`), capitalised nouns, the verb in second place
after a fronted adverb ("Today, the team builds 3 bridges." -> "Heute baut das Team 3
Brücken."), questions with the verb first, `nicht` at the end, `gibt es`, `... Stunden lang`.
Names and product codes are copied. Numbers are digits on both sides.

`translate(sentence)` is the reference; `Toy(seed).sentence()` draws one; `is_held_out(s)`
marks the ~2 % of sentences the model never trained on."""

from __future__ import annotations

import hashlib
import random

# (English singular, English plural, German singular, German plural, gender)
NOUNS = [
    ("apple", "apples", "Apfel", "Äpfel", "m"), ("box", "boxes", "Kiste", "Kisten", "f"),
    ("river", "rivers", "Fluss", "Flüsse", "m"), ("engine", "engines", "Motor", "Motoren", "m"),
    ("letter", "letters", "Brief", "Briefe", "m"), ("bridge", "bridges", "Brücke", "Brücken", "f"),
    ("garden", "gardens", "Garten", "Gärten", "m"), ("clock", "clocks", "Uhr", "Uhren", "f"),
    ("stone", "stones", "Stein", "Steine", "m"), ("map", "maps", "Karte", "Karten", "f"),
    ("song", "songs", "Lied", "Lieder", "n"), ("ship", "ships", "Schiff", "Schiffe", "n"),
    ("tower", "towers", "Turm", "Türme", "m"), ("lamp", "lamps", "Lampe", "Lampen", "f"),
    ("road", "roads", "Straße", "Straßen", "f"), ("house", "houses", "Haus", "Häuser", "n"),
    ("book", "books", "Buch", "Bücher", "n"), ("window", "windows", "Fenster", "Fenster", "n"),
    ("table", "tables", "Tisch", "Tische", "m"), ("city", "cities", "Stadt", "Städte", "f"),
    ("machine", "machines", "Maschine", "Maschinen", "f"), ("report", "reports", "Bericht",
                                                             "Berichte", "m"),
    ("page", "pages", "Seite", "Seiten", "f"), ("guide", "guides", "Leitfaden", "Leitfäden", "m"),
    ("child", "children", "Kind", "Kinder", "n"), ("car", "cars", "Auto", "Autos", "n"),
    ("tree", "trees", "Baum", "Bäume", "m"), ("door", "doors", "Tür", "Türen", "f"),
    ("village", "villages", "Dorf", "Dörfer", "n"), ("worker", "workers", "Arbeiter",
                                                      "Arbeiter", "m"),
    ("team", "teams", "Team", "Teams", "n"), ("cup", "cups", "Tasse", "Tassen", "f"),
    ("key", "keys", "Schlüssel", "Schlüssel", "m"), ("chair", "chairs", "Stuhl", "Stühle", "m"),
    ("flower", "flowers", "Blume", "Blumen", "f"), ("bottle", "bottles", "Flasche", "Flaschen",
                                                    "f"),
    ("picture", "pictures", "Bild", "Bilder", "n"), ("horse", "horses", "Pferd", "Pferde", "n"),
    ("teacher", "teachers", "Lehrer", "Lehrer", "m"), ("island", "islands", "Insel", "Inseln",
                                                        "f"),
]
ADJECTIVES = [("red", "rot"), ("small", "klein"), ("large", "groß"), ("old", "alt"),
              ("new", "neu"), ("green", "grün"), ("quiet", "ruhig"), ("bright", "hell"),
              ("heavy", "schwer"), ("cheap", "billig"), ("strong", "stark"), ("white", "weiß")]
# (English third person singular, English base form, German 3rd sg, German 3rd pl)
VERBS = [("sees", "see", "sieht", "sehen"), ("builds", "build", "baut", "bauen"),
         ("needs", "need", "braucht", "brauchen"), ("finds", "find", "findet", "finden"),
         ("counts", "count", "zählt", "zählen"), ("sells", "sell", "verkauft", "verkaufen"),
         ("repairs", "repair", "repariert", "reparieren"), ("holds", "hold", "hält", "halten"),
         ("paints", "paint", "malt", "malen"), ("buys", "buy", "kauft", "kaufen"),
         ("carries", "carry", "trägt", "tragen"), ("likes", "like", "mag", "mögen"),
         ("opens", "open", "öffnet", "öffnen"), ("checks", "check", "prüft", "prüfen")]
NAMES = ["Anna", "Tom", "Maria", "Paul", "Jerry", "Lena", "Omar", "Sofia", "Ivan", "Chen",
         "Fatima", "Lukas", "Nora", "Diego", "Emma", "Kofi"]
DIRECTIONS = [("north", "Norden"), ("south", "Süden"), ("east", "Osten"), ("west", "Westen")]
ADVERBS = [("Today", "Heute"), ("Tomorrow", "Morgen"), ("Now", "Jetzt"), ("Often", "Oft"),
           ("On Monday", "Am Montag"), ("On Friday", "Am Freitag"), ("Every day", "Jeden Tag")]
TITLES = [("Section", "Abschnitt"), ("Item", "Posten"), ("Chapter", "Kapitel"),
          ("Part", "Teil"), ("Table", "Tabelle"), ("Figure", "Abbildung")]


_DEF = {"nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
        "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
        "dat": {"m": "dem", "f": "der", "n": "dem", "pl": "den"}}
_INDEF = {"nom": {"m": "ein", "f": "eine", "n": "ein"},
          "acc": {"m": "einen", "f": "eine", "n": "ein"}}
_MIXED = {"nom": {"m": "er", "f": "e", "n": "es"}, "acc": {"m": "en", "f": "e", "n": "es"}}


def is_held_out(english: str) -> bool:
    """About 2 % of sentences, by a hash of the English text: never trained on."""
    return int(hashlib.sha1(english.encode()).hexdigest()[:8], 16) % 50 == 0


def _cap(word: str) -> str:
    return word[:1].upper() + word[1:]


def _dative_plural(noun_pl: str) -> str:
    return noun_pl if noun_pl.endswith(("n", "s")) else noun_pl + "n"


class Toy:
    """Draws (English, German) sentence pairs of the controlled language, deterministic per
    seed: `pair()` a sentence, `heading()` a title-like fragment."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    # --- parts ------------------------------------------------------------------------------
    def number(self) -> str:
        r = self.rng
        return str(r.choice([r.randrange(2, 10), r.randrange(10, 100), r.randrange(100, 10000)]))

    def _adj(self, p: float = 0.35) -> tuple[str, str] | None:
        return self.rng.choice(ADJECTIVES) if self.rng.random() < p else None

    def definite(self, case: str, plural: bool | None = None) -> tuple[str, str, bool]:
        """`the [adj] noun(s)`: English, German, plural."""
        noun, adj = self.rng.choice(NOUNS), self._adj()
        if plural is None:
            plural = self.rng.random() < 0.35
        g = "pl" if plural else noun[4]
        weak = "en" if plural or case == "dat" or (case == "acc" and g == "m") else "e"
        de_noun = noun[3] if plural else noun[2]
        if plural and case == "dat":
            de_noun = _dative_plural(de_noun)
        en = " ".join(["the"] + ([adj[0]] if adj else []) + [noun[1] if plural else noun[0]])
        de = " ".join([_DEF[case][g]] + ([adj[1] + weak] if adj else []) + [de_noun])
        return en, de, plural

    def indefinite(self, case: str) -> tuple[str, str, bool]:
        noun, adj = self.rng.choice(NOUNS), self._adj()
        first = adj[0] if adj else noun[0]
        en = " ".join(["an" if first[0] in "aeiou" else "a"] + ([adj[0]] if adj else [])
                      + [noun[0]])
        g = noun[4]
        de = " ".join([_INDEF[case][g]] + ([adj[1] + _MIXED[case][g]] if adj else [])
                      + [noun[2]])
        return en, de, False

    def counted(self, case: str) -> tuple[str, str, bool]:
        """`N [adj] nouns`: strong endings."""
        noun, adj, n = self.rng.choice(NOUNS), self._adj(), self.number()
        de_noun = _dative_plural(noun[3]) if case == "dat" else noun[3]
        ending = "en" if case == "dat" else "e"
        en = " ".join([n] + ([adj[0]] if adj else []) + [noun[1]])
        de = " ".join([n] + ([adj[1] + ending] if adj else []) + [de_noun])
        return en, de, True

    def team(self, case: str) -> tuple[str, str, bool]:
        d = self.rng.choice(DIRECTIONS)
        return f"the {d[0]} team", f"{_DEF[case]['n']} Team im {d[1]}", False

    def subject(self) -> tuple[str, str, bool]:
        r, k = self.rng, self.rng.random()
        if k < 0.2:
            name = r.choice(NAMES)
            return name, name, False
        if k < 0.3:
            t, n = r.choice(TITLES), self.number()
            return f"{t[0]} {n}", f"{t[1]} {n}", False
        if k < 0.4:
            return self.team("nom")
        return self.definite("nom")

    def obj(self) -> tuple[str, str, bool]:
        k = self.rng.random()
        if k < 0.35:
            return self.definite("acc")
        if k < 0.55:
            return self.indefinite("acc")
        return self.counted("acc")

    def pp(self) -> tuple[str, str]:
        r, k = self.rng, self.rng.random()
        if k < 0.3:
            en, de, _ = self.definite("dat", plural=False)
            de = de.replace("dem ", "im ", 1) if de.startswith("dem ") else "in " + de
            return "in " + en, de
        if k < 0.5:
            en, de, _ = self.counted("dat")
            return "with " + en, "mit " + de
        if k < 0.65:
            n = self.number()
            return f"for {n} hours", f"{n} Stunden lang"
        if k < 0.8:
            h = str(r.randrange(1, 13))
            return f"at {h} o'clock", f"um {h} Uhr"
        en, de, _ = self.team("acc")
        return "for " + en, "für " + de

    # --- sentences ----------------------------------------------------------------------------
    def pair(self) -> tuple[str, str]:
        r, k = self.rng, self.rng.random()
        if k < 0.1:
            return self.heading()
        verb = r.choice(VERBS)
        if k < 0.18:  # there are ... in the ...
            what_en, what_de, _ = self.counted("acc")
            where_en, where_de, _ = self.definite("dat", plural=False)
            where_de = ("Im " + where_de[4:]) if where_de.startswith("dem ") else "In " + where_de
            return f"There are {what_en} in {where_en}.", f"{where_de} gibt es {what_de}."
        s_en, s_de, s_pl = self.subject()
        v_de = verb[3] if s_pl else verb[2]
        if k < 0.28:  # a question
            o_en, o_de, _ = self.obj()
            aux = "Do" if s_pl else "Does"
            return f"{aux} {s_en} {verb[1]} {o_en}?", f"{_cap(v_de)} {s_de} {o_de}?"
        if k < 0.36:  # negation, a definite object
            o_en, o_de, _ = self.definite("acc")
            aux = "do" if s_pl else "does"
            return (f"{_cap(s_en)} {aux} not {verb[1]} {o_en}.",
                    f"{_cap(s_de)} {v_de} {o_de} nicht.")
        o_en, o_de, _ = self.obj()
        v_en = verb[1] if s_pl else verb[0]
        tail_en, tail_de = "", ""
        if r.random() < 0.5:
            p_en, p_de = self.pp()
            tail_en, tail_de = " " + p_en, " " + p_de
        end = r.choice([".", ".", ".", "!"])
        if k < 0.52:  # a fronted adverb: the verb comes second
            a = r.choice(ADVERBS)
            return (f"{a[0]}, {s_en} {v_en} {o_en}{tail_en}{end}",
                    f"{a[1]} {v_de} {s_de} {o_de}{tail_de}{end}")
        return (f"{_cap(s_en)} {v_en} {o_en}{tail_en}{end}",
                f"{_cap(s_de)} {v_de} {o_de}{tail_de}{end}")

    def heading(self) -> tuple[str, str]:
        r, k = self.rng, self.rng.random()
        t = r.choice(TITLES)
        if k < 0.4:
            noun = r.choice(NOUNS)
            n = self.number()
            return f"{t[0]} {n}: {_cap(noun[1])}", f"{t[1]} {n}: {noun[3]}"
        if k < 0.7:
            a, b = r.randrange(1, 20), r.randrange(20, 99)
            return f"{t[0]} {a} of {b}", f"{t[1]} {a} von {b}"
        noun, n = r.choice(NOUNS), r.randrange(1, 400)
        of = "vom" if noun[4] != "f" else "von der"
        return f"Page {n} of the {noun[0]}.", f"Seite {n} {of} {noun[2]}."

    def training_pair(self) -> tuple[str, str]:
        """A pair that is not held out."""
        while True:
            en, de = self.pair()
            if not is_held_out(en):
                return en, de

    def held_out_pairs(self, count: int) -> list[tuple[str, str]]:
        """`count` distinct held-out pairs."""
        out: dict[str, str] = {}
        while len(out) < count:
            en, de = self.pair()
            if is_held_out(en):
                out[en] = de
        return list(out.items())


# --- documents --------------------------------------------------------------------------------
def toy_markdown(sections: int = 10, seed: int = 3):
    """A markdown document whose text parts are sentences and headings of the grammar: headings,
    paragraphs of several sentences, lists, a block quote, a table cell, emphasis, links,
    code spans and fenced code, an HTML comment. -> (Sample, {English: German})."""
    from seq2serve.tests.document_samples import Sample

    g, d, ref = Toy(seed), Sample(), {}

    def t(pair=None) -> str:
        en, de = pair or g.pair()
        ref[en] = de
        return en

    def sentence() -> str:  # a full sentence (not a heading): text that ends one
        while True:
            en, de = g.pair()
            if en[-1] in ".!?" and not en.startswith("Page"):
                return t((en, de))

    d.s("---\ntitle: toy report\n---\n\n")
    for k in range(1, sections + 1):
        d.s("# ").t(t(g.heading())).s("\n\n")
        d.t(sentence()).s(" ").t(sentence()).s("\n").t(sentence()).s("\n\n")
        d.t(sentence()).s(f" `make test-{k}` ").t(sentence()).s("\n\n")
        d.s("- ").t(sentence()).s("\n- [x] ").t(sentence()).s("\n  - ").t(sentence()).s("\n\n")
        d.s("> ").t(sentence()).s(" ").t(sentence()).s("\n\n")
        d.s(f"```python\nprint('code {k}. Not text.')\n```\n\n")
        d.s("**").t(sentence()).s("** ").t(sentence()).s(" [").t(sentence())
        d.s(f"](https://example.com/p_{k}.html)\n\n")
        d.s("| ").t(t(g.heading())).s(" |\n|---|\n| ").t(sentence()).s(" |\n\n")
        d.s(f"<!-- comment {k}. Not text. -->\n\n")
    return d, ref


def toy_html(sections: int = 8, seed: int = 4):
    """An HTML page with nested tags whose text nodes are sentences of the grammar.
    -> (Sample, {English: German})."""
    from seq2serve.tests.document_samples import Sample

    g, d, ref = Toy(seed), Sample(), {}

    def t(pair=None) -> str:
        en, de = pair or g.pair()
        ref[en] = de
        return en

    def sentence() -> str:
        while True:
            en, de = g.pair()
            if en[-1] in ".!?" and not en.startswith("Page"):
                return t((en, de))

    d.s('<!DOCTYPE html>\n<html lang="en">\n<head>\n<title>').t(t(g.heading()))
    d.s("</title>\n<style>p { color: red; } /* Not text. */</style>\n</head>\n<body>\n")
    for k in range(1, sections + 1):
        d.s(f'<section id="s{k}" data-title="Not text {k}.">\n<h2>').t(t(g.heading()))
        d.s("</h2>\n<p>").t(sentence()).s(" ").t(sentence()).s(" <em>").t(sentence())
        d.s('</em> <a href="/page?x=1&amp;y=2" title="Not text.">').t(sentence())
        d.s("</a></p>\n<ul>\n  <li>").t(sentence()).s("</li>\n  <li><strong>").t(sentence())
        d.s("</strong></li>\n</ul>\n")
        d.s(f"<pre><code>code {k}. Not text\n  indented</code></pre>\n")
        d.s(f"<!-- comment {k}. Not text. -->\n<script>var s = 'Not text {k}.';</script>\n")
        d.s("<p>").t(sentence()).s(f" <code>f_{k}()</code> ").t(sentence()).s("<br>\n")
        d.t(sentence()).s("</p>\n</section>\n")
    d.s("</body>\n</html>\n")
    return d, ref
