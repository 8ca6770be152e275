"""Which language identifier `source_lang: "auto"` uses (issue 42): py3langid or
lingua-language-detector, by accuracy on short text, speed, and what it costs the HTTP process
(import and load time, memory, installed size).

    .venv/bin/python benchmarks/bench_language_id.py [--json out.json]

Test set: tests/language_samples.py, 100 paragraphs of 1-3 sentences written for this
project, 5 in each of 20 languages, and two shorter cuts of them: each paragraph's first
sentence, and its first five and first three words (ten and six characters in Chinese and
Japanese). Every
identifier answers over all of its languages (no restriction to the 20). A text is right when
the best language's ISO 639-1 code is the paragraph's.

Each identifier runs in a fresh process (`--one NAME`), so import time, load time and resident
memory are its own: import is `import` of the package; load is building the detector and its
first answer (lingua loads its models lazily: the first pass over the paragraphs, all 20
languages' models, is timed as "first pass"); memory is the process's resident set after
everything ran, less its resident set before the import. Speed: texts per second over the
paragraphs and per 1,000-character text, best of 5 rounds (the machine is shared)."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = ("py3langid", "lingua", "lingua-low")  # lingua-low: lingua's low accuracy mode
KINDS = ("paragraph", "sentence", "words", "3 words")


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def make_detector(name: str):
    """(detect: text -> ISO 639-1 code, package directory)"""
    if name == "py3langid":
        import py3langid
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        ident = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        return (lambda text: ident.classify(text)[0]), py3langid.__file__
    import lingua
    from lingua import LanguageDetectorBuilder

    builder = LanguageDetectorBuilder.from_all_languages()
    if name == "lingua-low":
        builder = builder.with_low_accuracy_mode()
    detector = builder.build()

    def detect(text: str) -> str | None:
        lang = detector.detect_language_of(text)
        return None if lang is None else lang.iso_code_639_1.name.lower()

    return detect, lingua.__file__


def run_one(name: str) -> dict:
    from seq2serve.tests.language_samples import cases

    base = rss_mb()
    t0 = time.perf_counter()
    __import__("py3langid" if name == "py3langid" else "lingua")
    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    detect, package_file = make_detector(name)
    detect("Hello, world.")
    load_s = time.perf_counter() - t0
    paragraphs = cases("paragraph")
    t0 = time.perf_counter()
    for _, text in paragraphs:
        detect(text)
    first_pass_s = time.perf_counter() - t0
    out = {"name": name, "import_s": import_s, "load_s": load_s, "first_pass_s": first_pass_s}
    for kind in KINDS:
        got = [(lang, detect(text), text) for lang, text in cases(kind)]
        wrong = [{"lang": lang, "got": g, "text": text} for lang, g, text in got if g != lang]
        out[kind] = {"right": len(got) - len(wrong), "total": len(got), "wrong": wrong}
    texts = [t for _, t in paragraphs]
    long = []
    for lang in sorted({lang for lang, _ in paragraphs}):
        joined = " ".join(t for g, t in paragraphs if g == lang)
        while len(joined) < 1000:
            joined += " " + joined
        long.append(joined[:1000])
    out["paragraphs_per_s"] = len(texts) / _best(lambda: [detect(t) for t in texts])
    out["ms_per_1000_chars"] = 1e3 * _best(lambda: [detect(t) for t in long]) / len(long)
    big = (long[0] + " ") * 100  # 100,000 characters: one call's longest hold of the GIL
    out["ms_per_100000_chars"] = 1e3 * _best(lambda: detect(big), rounds=2)
    out["rss_mb"] = rss_mb() - base
    pkg = pathlib.Path(package_file).parent
    out["installed_mb"] = sum(p.stat().st_size for p in pkg.rglob("*") if p.is_file()) / 2**20
    return out


def _best(fn, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def versions() -> dict:
    from importlib.metadata import version

    return {"py3langid": version("py3langid"), "lingua": version("lingua-language-detector")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--one", choices=CONFIGS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one)))
        return
    results = []
    for name in CONFIGS:
        proc = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True,
                              text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"{'':12} {'paragraphs':>10} {'sentences':>10} {'5 words':>8} {'3 words':>8} "
          f"{'import s':>9} "
          f"{'load s':>7} {'1st pass s':>10} {'para/s':>8} {'ms/1k ch':>9} {'ms/100k':>8} "
          f"{'RSS MB':>7} {'disk MB':>8}")
    for r in results:
        acc = [f"{r[k]['right']}/{r[k]['total']}" for k in KINDS]
        print(f"{r['name']:12} {acc[0]:>10} {acc[1]:>10} {acc[2]:>8} {acc[3]:>8} "
              f"{r['import_s']:9.3f} "
              f"{r['load_s']:7.3f} {r['first_pass_s']:10.3f} {r['paragraphs_per_s']:8.0f} "
              f"{r['ms_per_1000_chars']:9.3f} {r['ms_per_100000_chars']:8.1f} "
              f"{r['rss_mb']:7.0f} {r['installed_mb']:8.1f}")
    for r in results:
        for kind in KINDS:
            for w in r[kind]["wrong"]:
                print(f"  {r['name']} {kind}: {w['lang']} -> {w['got']}: {w['text'][:70]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"versions": versions(), "load_average": os.getloadavg(),
                       "results": results}, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
