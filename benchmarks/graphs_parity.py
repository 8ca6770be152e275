"""CUDA graphs on == off on a real model shape with random weights (load_format="dummy",
bf16): the same requests through two engines, the second with `disable_cuda_graph`, compared
request by request (issue 44's check of the bart-large-cnn and florence-2-large shapes; the
GPU check's bench part runs it).

The two paths need not agree to the bit: a graph pads its batch to a captured size and splits
its KV reads for the longest lengths, so its matrix products and reductions round otherwise
than the eager pass's. What must hold: greedy outputs are equal, or differ first where the
two best tokens are a near-tie (their log-probs within `--tie`, the other run's token the
second best), after log-probs that agreed within `--tie`; beam outputs are equal, or differ
between hypotheses whose scores are within `--tie`. Exit status 1 where any request breaks
that.

    python3 benchmarks/graphs_parity.py --shape florence-2-large --num-beams 3
    python3 benchmarks/graphs_parity.py --shape whisper-large-v3 --num-beams 2

A speech shape's requests are `bench offline`'s: distinct 30 s clips with Whisper's prompt
(`--input-len` does not apply).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

from seq2serve import Seq2SeqEngine
from seq2serve.runtime.bench.engine_bench import request_inputs
from seq2serve.runtime.bench.shapes import write_shape
from seq2serve.runtime.bench.workload import model_requests
from seq2serve.runtime.config.model_config import ModelConfig


def outputs(model_dir: str, reqs, args, disable_cuda_graph: bool) -> tuple[list, list]:
    """(greedy outputs with their top-2 log-probs, beam outputs or [])."""
    sampling = {"max_new_tokens": args.output_len, "temperature": 0, "ignore_eos": True}
    inputs = request_inputs(reqs)
    prompt_len = len(reqs[0].input_ids) if reqs[0].audio is not None else args.input_len
    with Seq2SeqEngine(model_path=model_dir, load_format="dummy", dtype=args.dtype,
                       max_running_requests=args.requests * args.num_beams,
                       context_length=prompt_len + args.output_len + 8,
                       disable_cuda_graph=disable_cuda_graph) as engine:
        greedy = engine.generate(**inputs, sampling_params=sampling,
                                 return_logprob=True, top_logprobs_num=2)
        beams = [] if args.num_beams == 1 else engine.generate(
            **inputs, sampling_params={**sampling, "num_beams": args.num_beams})
    return greedy, beams


def greedy_agrees(a: dict, b: dict, tie: float) -> tuple[bool, float]:
    """(equal or first differing at a near-tie, the largest log-prob gap before that)."""
    ta, tb = a["output_ids"], b["output_ids"]
    la = [lp for lp, _ in a["meta_info"]["output_token_logprobs"]]
    lb = [lp for lp, _ in b["meta_info"]["output_token_logprobs"]]
    t = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), len(ta))
    gap = max((abs(x - y) for x, y in zip(la[:t], lb[:t])), default=0.0)
    if t == len(ta):
        return gap <= tie, gap
    top = a["meta_info"]["output_top_logprobs"][t]  # [(token, log-prob)] best first
    near_tie = (len(top) == 2 and top[1][0] == tb[t] and top[0][1] - top[1][1] <= tie)
    return near_tie and gap <= tie, gap


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", required=True)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--num-beams", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tie", type=float, default=0.1,
                    help="log-probs (and beam scores) this close count as equal")
    ap.add_argument("--json")
    args = ap.parse_args()
    model_dir = str(write_shape(args.shape, tempfile.mkdtemp(prefix=args.shape)))
    reqs = model_requests(ModelConfig.from_path(model_dir), args.requests, args.input_len,
                          args.output_len)
    graphs, graph_beams = outputs(model_dir, reqs, args, disable_cuda_graph=False)
    eager, eager_beams = outputs(model_dir, reqs, args, disable_cuda_graph=True)
    checks = [greedy_agrees(a, b, args.tie) for a, b in zip(graphs, eager)]
    same = sum(a["output_ids"] == b["output_ids"] for a, b in zip(graphs, eager))
    result = {"shape": args.shape, "requests": len(reqs), "tie": args.tie,
              "greedy_same": same, "greedy_ok": sum(ok for ok, _ in checks),
              "max_logprob_gap": max(g for _, g in checks),
              "distinct_outputs": len({tuple(o["output_ids"]) for o in graphs})}
    print(f"graphs on == off, {args.shape}, greedy: {same}/{len(reqs)} requests' tokens equal, "
          f"{result['greedy_ok']}/{len(reqs)} equal or apart at a near-tie (log-probs within "
          f"{result['max_logprob_gap']:.3f} before; {result['distinct_outputs']} distinct "
          f"outputs)", flush=True)
    ok = result["greedy_ok"] == len(reqs)
    if graph_beams:
        pairs = list(zip(graph_beams, eager_beams))
        scores = [abs(a["meta_info"]["beam_score"] - b["meta_info"]["beam_score"])
                  for a, b in pairs]
        beam_same = sum(a["output_ids"] == b["output_ids"] for a, b in pairs)
        result.update(num_beams=args.num_beams, beams_same=beam_same,
                      max_beam_score_gap=max(scores))
        print(f"graphs on == off, {args.shape}, {args.num_beams} beams: {beam_same}/"
              f"{len(reqs)} requests' tokens equal; beam scores within "
              f"{max(scores):.4f}", flush=True)
        ok = ok and max(scores) <= args.tie
    result["ok"] = ok
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
