"""CUDA graphs on == off on a real model shape with random weights (load_format="dummy",
bf16): the same requests through two engines, the second with `disable_cuda_graph`, and
their tokens compared request by request (issue 44's check of the bart-large-cnn and
florence-2-large shapes; the GPU check's bench part runs it). Exit status 1 where any
request's tokens differ.

    python3 benchmarks/graphs_parity.py --shape florence-2-large --num-beams 3
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

from seq2serve import Seq2SeqEngine
from seq2serve.runtime.bench.shapes import write_shape
from seq2serve.runtime.bench.workload import Workload, make_requests
from seq2serve.runtime.config.model_config import ModelConfig


def outputs(model_dir: str, reqs, args, disable_cuda_graph: bool) -> list[list[int]]:
    sampling = {"max_new_tokens": args.output_len, "temperature": 0, "ignore_eos": True,
                "num_beams": args.num_beams}
    images = [[r.image] for r in reqs] if reqs[0].image is not None else None
    with Seq2SeqEngine(model_path=model_dir, load_format="dummy", dtype=args.dtype,
                       max_running_requests=args.requests,
                       context_length=args.input_len + args.output_len + 8,
                       disable_cuda_graph=disable_cuda_graph) as engine:
        outs = engine.generate(input_ids=[r.input_ids for r in reqs], image_data=images,
                               sampling_params=sampling)
    return [o["output_ids"] for o in outs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", required=True)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--num-beams", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--json")
    args = ap.parse_args()
    model_dir = str(write_shape(args.shape, tempfile.mkdtemp(prefix=args.shape)))
    mc = ModelConfig.from_path(model_dir)
    info = mc.arch.frontend_info()
    image_token = info.get("image_token_id")
    size = 1120 if info.get("tokens_per_tile") else 768
    wl = Workload(args.requests, args.input_len, args.output_len,
                  image_size=size if image_token is not None else 0)
    eos = mc.eos_token_ids[0] if mc.eos_token_ids else 1
    reqs = make_requests(wl, mc.vocab_size, mc.is_encoder_decoder, image_token, eos=eos)
    graphs = outputs(model_dir, reqs, args, disable_cuda_graph=False)
    eager = outputs(model_dir, reqs, args, disable_cuda_graph=True)
    same = sum(a == b for a, b in zip(graphs, eager))
    lengths = sorted({len(t) for t in graphs})
    result = {"shape": args.shape, "num_beams": args.num_beams, "requests": len(reqs),
              "same": same, "output_lengths": lengths,
              "distinct_outputs": len({tuple(t) for t in graphs})}
    print(f"graphs on == off, {args.shape}, {args.num_beams} beam(s): {same}/{len(reqs)} "
          f"requests' tokens equal ({result['distinct_outputs']} distinct outputs, lengths "
          f"{lengths})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if same == len(reqs) else 1


if __name__ == "__main__":
    sys.exit(main())
