"""Decode step time with grammars against without, at the same batch (issue 41's GPU check).

GPU (Llama-3.2-1B shape, random weights, bf16, 64 concurrent JSON-schema requests):
    python benchmarks/bench_grammar.py --shape llama-3.2-1b --requests 64
CPU (tiny random Llama with the real Llama 3 tokenizer):
    python benchmarks/bench_grammar.py --requests 16

The constrained run sends each request a JSON Schema of `tests/json_schemas.py` (every string
and array bounded); the free run sends the same prompts with `ignore_eos`, each as many tokens
as its constrained output had, so both runs have the same batch at every step. Reported per
run: wall seconds per decode forward (the step time), the device's busy share of the wall time
(`device_busy_seconds`, CUDA events; a step whose grammar masks are filled late leaves
out the device's wait for its sampler, docs/grammar.md), the host's wait for the device,
decode forwards, and tokens/s; then the ratio of the step times.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from seq2serve import Seq2SeqEngine
from seq2serve.tests.json_schemas import schemas


def _run(engine: Seq2SeqEngine, prompts: list[str], params: list[dict]
         ) -> tuple[dict, list[int]]:
    before = engine.stats()
    start = time.perf_counter()
    outs = engine.generate(prompt=prompts, sampling_params=params)
    wall = time.perf_counter() - start
    after = engine.stats()

    def delta(key: str) -> float:
        return after.get(key, 0) - before.get(key, 0)

    decodes = (after["forwards_by_mode"].get("decode", 0)
               - before["forwards_by_mode"].get("decode", 0))
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {"wall_s": wall, "decode_forwards": decodes, "tokens": tokens,
            "step_ms": 1e3 * wall / max(decodes, 1), "tokens_per_s": tokens / wall,
            "device_busy_share": delta("device_busy_seconds") / wall,
            "host_wait_s": delta("host_wait_seconds"),
            "finish": sorted({o["meta_info"]["finish_reason"]["type"] for o in outs})}, [
        o["meta_info"]["completion_tokens"] for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default=None, help="a real shape (llama-3.2-1b), random weights")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--device", default=None)
    ap.add_argument("--grammar-backend", default=None, help="xgrammar or llguidance "
                    "(unset: the engine's default)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    if args.shape:
        from seq2serve.runtime.bench.shapes import write_shape

        path = write_shape(args.shape, tmp)
        kwargs = dict(load_format="dummy", dtype="bfloat16", context_length=4096)
    else:
        from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint

        path, kwargs = write_llama_checkpoint(tmp, init_scale=10.0, seed=1), {}
    if args.grammar_backend:
        kwargs["grammar_backend"] = args.grammar_backend
    n = args.requests
    prompts = [f"Write record {i} as JSON:" for i in range(n)]
    constrained = [{"max_new_tokens": args.max_tokens, "temperature": 0,
                    "json_schema": json.dumps(s)} for s in schemas(n)]
    with Seq2SeqEngine(model_path=str(path), device=args.device, **kwargs) as engine:
        _run(engine, prompts[:4], constrained[:4])  # warm-up: compile paths, the vocabulary
        # the first run compiles each schema (on the scheduler's compile thread, while the
        # batch decodes); the timed run takes them from the cache, as repeated schemas are
        cold, _ = _run(engine, prompts, constrained)
        grammar, lengths = _run(engine, prompts, constrained)
        # each request as many tokens as under its grammar: the same batch at every step
        free = [{"max_new_tokens": max(1, k), "temperature": 0, "ignore_eos": True}
                for k in lengths]
        _run(engine, prompts[:4], free[:4])
        plain, _ = _run(engine, prompts, free)
    result = {"requests": n, "shape": args.shape or "tiny",
              "grammar_backend": args.grammar_backend or "default",
              "grammar_first_compiles": cold,
              "grammar": grammar, "free": plain,
              "step_ratio": grammar["step_ms"] / plain["step_ms"]}
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
