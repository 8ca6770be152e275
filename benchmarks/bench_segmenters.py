"""Which sentence segmenter documents are split with (issue 42): pysbd or sentencex, by accuracy
on the hand-made multilingual cases of segmenter_cases.py and by speed on real text.

    .venv/bin/python benchmarks/bench_segmenters.py [--json out.json]

Accuracy: a case is right when the segmenter returns exactly its sentences (leading and
trailing whitespace aside); boundary precision / recall count the cuts between sentences.
Speed: sentences per second, one call per paragraph as the runtime calls it, on (a) the
English prose of this repository's README and docs (paragraphs between blank lines, code
blocks and tables left out) and (b) the multilingual cases repeated to about 3,000 sentences;
each timed 5 times, the best run reported (the machine is shared)."""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import time

import pysbd
import sentencex

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from segmenter_cases import CASES  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


def pysbd_segmenter():
    cache: dict[str, pysbd.Segmenter] = {}

    def segment(lang: str, text: str) -> list[str]:
        if lang not in cache:
            cache[lang] = pysbd.Segmenter(language=lang, clean=False)
        return cache[lang].segment(text)

    return segment


def sentencex_segmenter():
    def segment(lang: str, text: str) -> list[str]:
        return list(sentencex.segment(lang, text))

    return segment


def cuts(text: str, sentences: list[str]) -> set[int]:
    """Where each sentence but the last ends in `text` (sentences found in order)."""
    out, pos = set(), 0
    for s in sentences:
        s = s.strip()
        if not s:
            continue
        start = text.find(s, pos)
        if start < 0:
            raise ValueError(f"segment {s!r} is not in the text")
        pos = start + len(s)
        out.add(pos)
    out.discard(len(text.rstrip()))
    return out


def accuracy(segment) -> dict:
    right, tp, fp, fn, wrong, by_lang = 0, 0, 0, 0, [], {}
    for lang, text, gold in CASES:
        got = [s.strip() for s in segment(lang, text) if s.strip()]
        ok = got == [g.strip() for g in gold]
        right += ok
        seen = by_lang.setdefault(lang, [0, 0])
        seen[0] += ok
        seen[1] += 1
        if not ok:
            wrong.append({"lang": lang, "text": text, "got": got})
        g, p = cuts(text, gold), cuts(text, got)
        tp, fp, fn = tp + len(g & p), fp + len(p - g), fn + len(g - p)
    return {"cases": len(CASES), "right": right, "exact": right / len(CASES),
            "boundary_precision": tp / max(tp + fp, 1), "boundary_recall": tp / max(tp + fn, 1),
            "by_language": {k: f"{a}/{b}" for k, (a, b) in by_lang.items()}, "wrong": wrong}


def prose_paragraphs() -> list[str]:
    """The README's and docs' paragraphs of prose: blank-line separated blocks, without code
    blocks, tables, headings or list markers' blocks of commands."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
        for block in re.split(r"\n\s*\n", text):
            block = block.strip()
            if block and not block.startswith(("#", "|", "    ", "!", "<")):
                out.append(block)
    return out


def speed(segment, paragraphs: list[tuple[str, str]], gold: int | None = None,
          repeats: int = 5) -> dict:
    """Sentences per second: of `gold` sentences where they are known (the cases), else of
    those the segmenter found (pysbd cuts at every line break, so it finds more in wrapped
    prose: compare the prose by characters per second)."""
    best, count = float("inf"), 0
    for _ in range(repeats):
        start = time.perf_counter()
        count = sum(len(segment(lang, text)) for lang, text in paragraphs)
        best = min(best, time.perf_counter() - start)
    chars = sum(len(t) for _, t in paragraphs)
    sentences = gold or count
    return {"paragraphs": len(paragraphs), "chars": chars, "sentences": sentences,
            "found": count, "seconds": best, "sentences_per_s": sentences / best,
            "chars_per_s": chars / best}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    prose = [("en", p) for p in prose_paragraphs()]
    gold_sentences = sum(len(g) for _, _, g in CASES)
    times = 3000 // gold_sentences + 1
    cases = [(lang, text) for lang, text, _ in CASES] * times
    report = {"versions": {"pysbd": pysbd.__version__,
                           "sentencex": _version("sentencex")}}
    for name, make in (("pysbd", pysbd_segmenter), ("sentencex", sentencex_segmenter)):
        segment = make()
        report[name] = {"accuracy": accuracy(segment),
                        "speed_prose_en": speed(segment, prose),
                        "speed_cases": speed(segment, cases, gold_sentences * times)}
    for name in ("pysbd", "sentencex"):
        r = report[name]
        a = r["accuracy"]
        print(f"{name:9s} {a['right']}/{a['cases']} cases exact ({a['exact']:.0%}), boundary "
              f"P {a['boundary_precision']:.3f} R {a['boundary_recall']:.3f} | "
              f"prose {r['speed_prose_en']['chars_per_s'] / 1e6:.2f} M chars/s "
              f"({r['speed_prose_en']['chars']:,} chars, {r['speed_prose_en']['found']} "
              f"sentences found) | multilingual "
              f"{r['speed_cases']['sentences_per_s']:,.0f} sent/s "
              f"({r['speed_cases']['sentences']} sentences)")
        print(f"          by language: {a['by_language']}")
        for w in a["wrong"]:
            print(f"          wrong [{w['lang']}] {w['text']!r} -> {w['got']!r}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1, ensure_ascii=False))


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    main()
