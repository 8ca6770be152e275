"""Glossary terms with and without the constraint, and what the constraint costs (issue 42),
on the demo model (numbers in digits to words, a trained model).

The inputs are the 200 years 1900-2099; the glossary maps each to its year reading
("1984": "nineteen eighty-four", "1905": "nineteen oh five", "2026": "twenty twenty-six"),
which the model never learnt: it writes "one thousand nine hundred eighty-four" (a year whose
reading were the model's own words would be left out; none is). Three ways, greedy and with
4 beams, up to 24 new tokens:

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
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from seq2serve import Seq2SeqEngine
from seq2serve.runtime.frontend.glossary import holds
from seq2serve.tests.number_words import number_to_words

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


def _lit(term: str) -> str:
    return '"' + term.replace("\\", "\\\\").replace('"', '\\"') + '"'


def run(engine: Seq2SeqEngine, mode: str, beams: int, inputs: list[str],
        terms: dict[str, str]) -> tuple[list[str], list[str], float]:
    engine.flush_cache()
    sp = {"max_new_tokens": MAX_NEW, "temperature": 0, "num_beams": beams}
    start = time.perf_counter()
    if mode == "grammar only":
        params = [{**sp, "ebnf": f"root ::= any* {_lit(terms[x])} any*\nany ::= [^\\x00]"}
                  for x in inputs]
        out = engine.generate(prompt=[TEMPLATE.format(x) for x in inputs], sampling_params=params)
    else:
        out = engine.translate(inputs, **LANGS, sampling_params=sp,
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
    args = ap.parse_args()
    terms = glossary()
    inputs = list(terms)[::max(1, len(terms) // args.count)][:args.count]
    rows = []
    with Seq2SeqEngine(device=args.device) as engine:
        for beams in (int(b) for b in args.beams.split(",")):
            for mode in ("none", "grammar only", "glossary"):
                texts, reasons, _ = run(engine, mode, beams, inputs, terms)  # warm-up
                times = [run(engine, mode, beams, inputs, terms)[2] for _ in range(args.rounds)]
                held = sum(holds(t, terms[x]) for t, x in zip(texts, inputs))
                exact = sum(t == terms[x] for t, x in zip(texts, inputs))
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
            json.dump({"max_new_tokens": MAX_NEW, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
