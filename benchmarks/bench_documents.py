"""Repeated sentences of documents: sent once and fanned out, or all sent and left to the
encoder cache? (issue 42). The same 200 plain-text documents (3-5 sentences each, 30 % of
the sentences drawn from 12 common ones) translated greedily on one engine three ways:

- documents: `translate(docs)`, the document path (each distinct sentence sent once);
- flat, every sentence: `translate(sentences)` with every occurrence as its own input (the
  encoder cache runs the encoder once per distinct source, but every occurrence decodes);
- flat, distinct sentences: the lower bound of the work.

Each run flushes the caches first; after a warm-up round, rounds interleave the three and
the median is reported.

    .venv/bin/python benchmarks/bench_documents.py [--device cpu] [--rounds 5] [--json out]

On the GPU, a model shape with random weights (`--shape`, `runtime/bench/shapes.py`), longer
documents and no repeats measure what the document path itself costs (issue 42's target:
documents of 50 sentences at >= 0.9x the sentences/s of the same sentences as a flat list):

    python3 benchmarks/bench_documents.py --device cuda --shape nllb-200-distilled-600m \
        --documents 64 --sentences 50 --repeat-share 0 --max-new-tokens 48
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

from seq2serve import Seq2SeqEngine
from seq2serve.runtime.bench.shapes import write_shape
from seq2serve.tests.document_samples import repeated_documents

GREEDY = {"max_new_tokens": 32, "temperature": 0}
LANGS = {"source_lang": "digits", "target_lang": "English"}


def run(engine: Seq2SeqEngine, inputs: list[str], greedy: dict) -> dict:
    engine.flush_cache()
    before = engine.stats()
    start = time.perf_counter()
    engine.translate(inputs, **LANGS, sampling_params=greedy)
    seconds = time.perf_counter() - start
    after = engine.stats()
    fwd = {k: after["forwards_by_mode"].get(k, 0) - before["forwards_by_mode"].get(k, 0)
           for k in after["forwards_by_mode"]}
    return {"seconds": seconds, "encoder_inputs": after["encoder_inputs"]
            - before["encoder_inputs"], "forwards_by_mode": fwd,
            "max_decode_batch": after["max_batch_by_mode"].get("decode", 0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", default=None, help="unset: the demo model")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shape", default=None,
                    help="a model shape with random weights instead of --model-path")
    ap.add_argument("--dtype", default=None, help="unset: the model's (bfloat16 with --shape)")
    ap.add_argument("--documents", type=int, default=200)
    ap.add_argument("--sentences", type=int, default=None,
                    help="sentences per document (unset: 3 to 5)")
    ap.add_argument("--repeat-share", type=float, default=0.3)
    ap.add_argument("--max-new-tokens", type=int, default=GREEDY["max_new_tokens"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    greedy = {**GREEDY, "max_new_tokens": args.max_new_tokens}
    engine_args: dict = {"device": args.device}
    model_path = args.model_path
    if args.shape:
        model_path = str(write_shape(args.shape, tempfile.mkdtemp()))
        engine_args.update(load_format="dummy", dtype=args.dtype or "bfloat16")
    elif args.dtype:
        engine_args["dtype"] = args.dtype
    per_doc = (args.sentences, args.sentences) if args.sentences else (3, 5)
    docs, sentences = repeated_documents(args.documents, repeat_share=args.repeat_share,
                                         sentences_per_doc=per_doc)
    every = [s for ss in sentences for s in ss]
    distinct = list(dict.fromkeys(every))
    ways = {"documents": docs, "flat, every sentence": every, "flat, distinct sentences":
            distinct}
    runs: dict[str, list[dict]] = {k: [] for k in ways}
    if len(distinct) == len(every):  # (no repeats: the two flat ways are the same)
        del ways["flat, distinct sentences"]
        runs.pop("flat, distinct sentences")
    with Seq2SeqEngine(model_path=model_path, **engine_args) as engine:
        for inputs in ways.values():  # a warm-up round, not counted
            run(engine, inputs, greedy)
        for _ in range(args.rounds):
            for name, inputs in ways.items():
                runs[name].append(run(engine, inputs, greedy))
    report = {"documents": len(docs), "sentences": len(every), "distinct": len(distinct),
              "rounds": args.rounds, "shape": args.shape, "device": args.device,
              "max_new_tokens": args.max_new_tokens, "ways": {}}
    print(f"{len(docs)} documents, {len(every)} sentences, {len(distinct)} distinct "
          f"({1 - len(distinct) / len(every):.0%} repeats); median of {args.rounds} rounds")
    for name, rs in runs.items():
        median = statistics.median(r["seconds"] for r in rs)
        last = rs[-1]
        report["ways"][name] = {"median_seconds": median, "all_seconds": [r["seconds"] for r in rs],
                                "sentences_per_s": len(every) / median, **last}
        print(f"  {name:26s} {median:6.2f} s  {len(every) / median:7.1f} sentences/s  "
              f"encoder inputs {last['encoder_inputs']:4d}  decode steps "
              f"{last['forwards_by_mode'].get('decode', 0):3d}  largest decode batch "
              f"{last['max_decode_batch']}")
    ways_done = report["ways"]
    flat, doc = ways_done["flat, every sentence"], ways_done["documents"]
    report["documents_vs_flat"] = flat["median_seconds"] / doc["median_seconds"]
    report["documents_vs_flat_mean"] = (statistics.mean(flat["all_seconds"])
                                        / statistics.mean(doc["all_seconds"]))
    print(f"  documents / flat list, sentences/s: {report['documents_vs_flat']:.2f}x "
          f"(medians), {report['documents_vs_flat_mean']:.2f}x (means)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
