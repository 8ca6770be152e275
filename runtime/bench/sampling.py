"""`seq2serve bench sampling`: does a sampled step scale with the batch? One request alone,
then N together, sampled (seeded or not) and greedy, on a tiny random Llama with the real
128k vocabulary (or --model-path), through the engine's processes. Besides the wall time, the
scheduler process's CPU seconds (Linux): on a shared host the wall time also counts the
waits for a core, the CPU time only the work."""

from __future__ import annotations

import os
import tempfile
import time


def add_sampling_parser(sub) -> None:
    p = sub.add_parser("sampling", help="N sampled requests together against one alone")
    p.add_argument("--model-path", help="default: a tiny random Llama, 128k vocabulary")
    p.add_argument("--shape", default=None,
                   help="instead: a real model shape with random weights (llama-3.2-1b, ...)")
    p.add_argument("--dtype", default="float32")
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


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc; 0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(engine, args, n: int, greedy: bool) -> tuple[float, float]:
    """Wall seconds and the scheduler's CPU seconds of n requests submitted together."""
    ids = [[128000, 9906, 1917 + i] for i in range(n)]
    pid = engine.procs.scheduler.pid
    cpu, start = _cpu_seconds(pid), time.perf_counter()
    outs = engine.generate(input_ids=ids, sampling_params=[_params(args, i, greedy)
                                                           for i in range(n)])
    seconds = time.perf_counter() - start
    assert all(o["meta_info"]["completion_tokens"] == args.output_len for o in outs)
    return seconds, _cpu_seconds(pid) - cpu


def _sampling(args) -> dict:
    from seq2serve import Seq2SeqEngine

    path, extra = args.model_path, {}
    if args.shape is not None:
        from seq2serve.runtime.bench.shapes import write_shape

        path, extra = str(write_shape(args.shape, tempfile.mkdtemp())), {"load_format": "dummy"}
    elif path is None:
        from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint

        path = str(write_llama_checkpoint(tempfile.mkdtemp()))
    n = args.num_requests
    res = {"workload": {k: v for k, v in vars(args).items() if k != "fn"}}
    with Seq2SeqEngine(model_path=path, device=args.device, dtype=args.dtype,
                       max_running_requests=max(n, 1), disable_radix_cache=True,
                       **extra) as engine:
        _timed(engine, args, 2, greedy=False)  # warm-up
        for name, greedy in (("greedy", True), ("sampled", False)):
            (one, one_cpu), (many, many_cpu) = (_timed(engine, args, 1, greedy),
                                                _timed(engine, args, n, greedy))
            res[name] = {"one_s": one, "together_s": many, "ratio": many / one,
                         "one_cpu_s": one_cpu, "together_cpu_s": many_cpu,
                         "cpu_ratio": many_cpu / max(one_cpu, 1e-9)}
            print(f"{name:8s}: 1 request {one:6.2f} s ({one_cpu:6.2f} s scheduler CPU), "
                  f"{n} together {many:6.2f} s ({many_cpu:6.2f} s CPU): {many / one:.2f}x "
                  f"({res[name]['cpu_ratio']:.2f}x CPU)", flush=True)
    res["sampled_over_greedy_together"] = res["sampled"]["together_s"] / res["greedy"]["together_s"]
    print(f"sampled / greedy, {n} together: {res['sampled_over_greedy_together']:.2f}x")
    return res
