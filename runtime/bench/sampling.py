"""`seq2serve bench sampling`: does a sampled step scale with the batch? One request alone,
then N together, sampled (seeded or not) and greedy, on a tiny random Llama with the real
128k vocabulary (or --model-path), through the engine's processes."""

from __future__ import annotations

import tempfile
import time


def add_sampling_parser(sub) -> None:
    p = sub.add_parser("sampling", help="N sampled requests together against one alone")
    p.add_argument("--model-path", help="default: a tiny random Llama, 128k vocabulary")
    p.add_argument("--num-requests", type=int, default=8)
    p.add_argument("--output-len", type=int, default=400)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--unseeded", action="store_true", help="no seed (torch's generator)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None)
    p.set_defaults(fn=_sampling)


def _params(args, i: int, greedy: bool) -> dict:
    sp = {"max_new_tokens": args.output_len, "ignore_eos": True}
    if greedy:
        return sp | {"temperature": 0}
    sp |= {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k}
    return sp if args.unseeded else sp | {"seed": 1000 + i}


def _timed(engine, args, n: int, greedy: bool) -> float:
    ids = [[128000, 9906, 1917 + i] for i in range(n)]
    start = time.perf_counter()
    outs = engine.generate(input_ids=ids, sampling_params=[_params(args, i, greedy)
                                                           for i in range(n)])
    seconds = time.perf_counter() - start
    assert all(o["meta_info"]["completion_tokens"] == args.output_len for o in outs)
    return seconds


def _sampling(args) -> dict:
    from seq2serve import Seq2SeqEngine

    path = args.model_path
    if path is None:
        from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint

        path = str(write_llama_checkpoint(tempfile.mkdtemp()))
    n = args.num_requests
    res = {"workload": {k: v for k, v in vars(args).items() if k != "fn"}}
    with Seq2SeqEngine(model_path=path, device=args.device, dtype="float32",
                       max_running_requests=max(n, 1), disable_radix_cache=True) as engine:
        _timed(engine, args, 2, greedy=False)  # warm-up
        for name, greedy in (("greedy", True), ("sampled", False)):
            one, many = _timed(engine, args, 1, greedy), _timed(engine, args, n, greedy)
            res[name] = {"one_s": one, f"{n}_together_s": many, "ratio": many / one}
            print(f"{name:8s}: 1 request {one:6.2f} s, {n} together {many:6.2f} s "
                  f"({many / one:.2f}x)", flush=True)
    res["sampled_over_greedy_together"] = (res["sampled"][f"{n}_together_s"]
                                           / res["greedy"][f"{n}_together_s"])
    print(f"sampled / greedy, {n} together: {res['sampled_over_greedy_together']:.2f}x")
    return res
