"""Glossary terms with and without the constraint, and what the constraint costs (issue 42),
on a bundled trained model: `--task numbers` (the default) the demo T5 (numbers in digits to
words), `--task marian` the demo Marian (controlled English to German).

The inputs are the 200 years 1900-2099; the glossary maps each to its year reading
("1984": "nineteen eighty-four", "1905": "nineteen oh five", "2026": "twenty twenty-six"),
which the model never learnt: it writes "one thousand nine hundred eighty-four" (a year whose
reading were the model's own words would be left out; none is). Three ways, greedy and with
4 beams, up to 24 new tokens (64 for `--task marian`):

- none: the translation without a glossary;
- grammar only: each input under an xgrammar EBNF `any* "term" any*` (the end of sequence
  allowed only once the term is there; the grammar path of issue 41);
- glossary: `translate(..., glossary=...)`, the forced-position search
  (`runtime/frontend/glossary_search.py`).

For each: how many outputs hold their term (exactly, as a whole word), how many are exactly
the year reading, how many stopped at the token limit, and sentences per second (the 200
inputs in one call, caches flushed; the median of the rounds after a warm-up).

    .venv/bin/python benchmarks/bench_glossary.py [--rounds 3] [--beams 1,4] [--count 200]
        [--json out.json]

(`--count N`: every (200 / N)-th year only.)

`--task marian`: 200 sentences of tests/toy_translation.py, each holding one of four plural
nouns, with a glossary that maps each to another German plural the model knows ("engines":
"Maschinen" where the model writes "Motoren"; "ships": "Autos", "lamps": "Uhren",
"towers": "Häuser"); `--task marian-unseen`: the same sentences with German words the model
never saw ("Triebwerke", "Boote", "Leuchten", "Masten"). "exact" counts outputs equal to the
grammar's German with the model's word replaced by the term: the term in its place and the
rest of the sentence right.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from seq2serve import Seq2SeqEngine
from seq2serve.runtime.frontend.glossary import holds
from seq2serve.runtime.tools.demo_checkpoint import default_demo_path, demo_translation_path
from seq2serve.tests.number_words import number_to_words
from seq2serve.tests.toy_translation import Toy

MAX_NEW = 24
LANGS = {"source_lang": "digits", "target_lang": "English"}
TEMPLATE = "translate digits to English: {}"


def year_reading(year: int) -> str:
    century, rest = divmod(year, 100)
    head = number_to_words(century)
    if rest == 0:
        return f"{head} hundred"
    return f"{head} {'oh ' if rest < 10 else ''}{number_to_words(rest)}"


def glossary() -> dict[str, str]:
    terms = {str(y): year_reading(y) for y in range(1900, 2100)}
    return {y: t for y, t in terms.items() if t != number_to_words(int(y))}


# (English plural, the model's German, a German plural it knows, one it never saw)
MARIAN_TERMS = [("engines", "Motoren", "Maschinen", "Triebwerke"),
                ("ships", "Schiffe", "Autos", "Boote"), ("lamps", "Lampen", "Uhren", "Leuchten"),
                ("towers", "Türme", "Häuser", "Masten")]


def numbers_task(count: int):
    """(model path, languages, inputs, each input's term, each input's exact answer, the
    glossary, the prompt of an input)."""
    terms = glossary()
    inputs = list(terms)[::max(1, len(terms) // count)][:count]
    return (default_demo_path(), LANGS, inputs, [terms[x] for x in inputs],
            [terms[x] for x in inputs], terms, TEMPLATE.format)


def marian_task(count: int, unseen: bool = False):
    col = 3 if unseen else 2
    g, inputs, want, exact = Toy(40_004), [], [], []
    while len(inputs) < count:
        en, de = g.pair()
        words = set(en.rstrip(".!?").split())
        found = [t for t in MARIAN_TERMS if t[0] in words]
        # one term, in a case whose German is the plural's own form (not a dative -n)
        if len(found) == 1 and f" {found[0][1]}" in de and en not in inputs:
            inputs.append(en)
            want.append(found[0][col])
            exact.append(de.replace(found[0][1], found[0][col]))
    terms = {t[0]: t[col] for t in MARIAN_TERMS}
    return (demo_translation_path(), {"source_lang": "en", "target_lang": "de"}, inputs, want,
            exact, terms, str)


def _lit(term: str) -> str:
    return '"' + term.replace("\\", "\\\\").replace('"', '\\"') + '"'


def run(engine: Seq2SeqEngine, mode: str, beams: int, task,
        max_new: int) -> tuple[list[str], list[str], float]:
    _, langs, inputs, want, _, terms, prompt = task
    engine.flush_cache()
    sp = {"max_new_tokens": max_new, "temperature": 0, "num_beams": beams}
    start = time.perf_counter()
    if mode == "grammar only":
        params = [{**sp, "ebnf": f"root ::= any* {_lit(w)} any*\nany ::= [^\\x00]"}
                  for w in want]
        out = engine.generate(prompt=[prompt(x) for x in inputs], sampling_params=params)
    else:
        out = engine.translate(inputs, **langs, sampling_params=sp,
                               glossary=terms if mode == "glossary" else None)
    seconds = time.perf_counter() - start
    return ([o["text"] for o in out], [o["meta_info"]["finish_reason"]["type"] for o in out],
            seconds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--beams", default="1,4")
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--json", default=None)
    ap.add_argument("--task", choices=("numbers", "marian", "marian-unseen"), default="numbers")
    args = ap.parse_args()
    task = (numbers_task(args.count) if args.task == "numbers" else
            marian_task(args.count, unseen=args.task == "marian-unseen"))
    path, _, inputs, want, answers, _, _ = task
    max_new = MAX_NEW if args.task == "numbers" else 64
    rows = []
    with Seq2SeqEngine(model_path=str(path), device=args.device) as engine:
        for beams in (int(b) for b in args.beams.split(",")):
            for mode in ("none", "grammar only", "glossary"):
                texts, reasons, _ = run(engine, mode, beams, task, max_new)  # warm-up
                times = [run(engine, mode, beams, task, max_new)[2]
                         for _ in range(args.rounds)]
                held = sum(holds(t, w) for t, w in zip(texts, want))
                exact = sum(t == a for t, a in zip(texts, answers))
                row = {"beams": beams, "mode": mode, "inputs": len(inputs), "term_held": held,
                       "exact_reading": exact, "length_stops": reasons.count("length"),
                       "median_s": statistics.median(times), "rounds_s": times,
                       "sentences_per_s": len(inputs) / statistics.median(times),
                       "samples": dict(list(zip(inputs, texts))[::40])}
                rows.append(row)
                print(f"beams {beams} {mode:12s} term {held}/{len(inputs)} "
                      f"({100 * held / len(inputs):.1f} %) exact {exact} length "
                      f"{row['length_stops']} {row['median_s']:.2f} s "
                      f"{row['sentences_per_s']:.1f} sent/s  {row['samples']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"task": args.task, "max_new_tokens": max_new, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
