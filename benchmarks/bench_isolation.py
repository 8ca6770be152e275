"""What cache isolation costs in cache hits: a repeated-source workload sent by one user and
by distinct users, under `--cache-isolation none`, `user` (the default) and `shared`.

CPU, the bundled demo model:
    python benchmarks/bench_isolation.py [--sources 40 --repeats 4 --json out.json]
Each of `sources` distinct sources is sent `repeats` times, one request after another (round
r sends every source once, so a repeat finds the earlier ones cached). "same user": every
request from one user; "distinct users": round r's requests from user r. Reported per case:
the share of requests whose encoder input was a cache hit, the encoder inputs encoded, the
decoder tokens served from the radix cache, and the mean latency per request.
"""

from __future__ import annotations

import argparse
import json
import time

from seq2serve import Seq2SeqEngine


def run(mode: str, sources: int, repeats: int, distinct: bool) -> dict:
    greedy = {"max_new_tokens": 16, "temperature": 0}
    with Seq2SeqEngine(device="cpu", cache_isolation=mode, max_total_tokens=16384,
                       max_cross_tokens=16384) as engine:
        engine.generate(prompt="translate digits to English: 1", sampling_params=greedy)
        before = engine.stats()["encoder_inputs"]
        hits = cached = 0
        start = time.perf_counter()
        for r in range(repeats):
            for s in range(sources):
                out = engine.generate(prompt=f"translate digits to English: {1000 + 37 * s}",
                                      sampling_params=greedy,
                                      user=f"user{r}" if distinct else "user0")
                hits += out["meta_info"]["encoder_cache_hit"]
                cached += out["meta_info"]["cached_tokens"]
        seconds = time.perf_counter() - start
        n = sources * repeats
        return {"mode": mode, "users": "distinct" if distinct else "same",
                "encoder_hit_rate": round(hits / n, 3),
                "encoded": engine.stats()["encoder_inputs"] - before,
                "cached_decoder_tokens": cached, "ms_per_request": round(1e3 * seconds / n, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sources", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for mode in ("none", "user", "shared"):
        for distinct in (False, True):
            rows.append(run(mode, args.sources, args.repeats, distinct))
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
