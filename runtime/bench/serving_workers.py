"""`bench serving --workers N`: N client processes share one load, so that the client's event
loop (SSE parsing, JSON, httpx) is not what limits a fast server. Each gets every N-th prompt,
its share of the concurrency (or the rate: N Poisson streams at rate/N are one at the rate);
all start together behind a barrier, and the records are merged: one duration from the
first start to the last end, percentiles over every request. Each worker's CPU time over the
run says whether the clients were near a bottleneck (`client_cpu_share`)."""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing as mp
import time

from seq2serve.runtime.bench.serving_load import LoadSpec, RequestRecord, run_load, summarize
from seq2serve.runtime.bench.stalls import stall_moments


def split(spec: LoadSpec, workers: int) -> list[LoadSpec]:
    """The workers' shares (workers without a prompt are dropped)."""
    shares = []
    for i in range(workers):
        prompts = spec.prompts[i::workers]
        if not prompts:
            continue
        concurrency = None
        if spec.concurrency is not None:
            concurrency = max(1, spec.concurrency // workers + (i < spec.concurrency % workers))
        rate = spec.rate / workers if spec.rate else None
        shares.append(dataclasses.replace(spec, prompts=prompts, concurrency=concurrency,
                                          rate=rate, seed=spec.seed + i, progress=i == 0))
    return shares


def _worker(spec: LoadSpec, barrier, results) -> None:
    import httpx  # noqa: F401 - imported before the barrier, not inside the timing

    barrier.wait()
    cpu = time.process_time()
    records, start, end = asyncio.run(run_load(spec))
    results.put(([dataclasses.asdict(r) for r in records], start, end,
                 time.process_time() - cpu))


def run_workers(spec: LoadSpec, workers: int) -> dict:
    """The load of `spec` from `workers` processes (1: in this process), merged."""
    if workers == 1:
        cpu = time.process_time()
        records, start, end = asyncio.run(run_load(spec))
        return _merge([(records, start, end, time.process_time() - cpu)])
    ctx = mp.get_context("spawn")
    shares = split(spec, workers)
    barrier, results = ctx.Barrier(len(shares)), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(s, barrier, results), daemon=True)
             for s in shares]
    for p in procs:
        p.start()
    try:
        outs = _collect(procs, results)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return _merge([([RequestRecord(**r) for r in recs], start, end, cpu)
                   for recs, start, end, cpu in outs])


def _collect(procs: list, results) -> list:
    import queue

    outs = []
    while len(outs) < len(procs):
        try:
            outs.append(results.get(timeout=1.0))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a load worker exited with code {dead[0]}") from None
    return outs


def _merge(outs: list[tuple[list[RequestRecord], float, float, float]]) -> dict:
    seconds = max(o[2] for o in outs) - min(o[1] for o in outs)
    res = summarize([r for o in outs for r in o[0]], seconds)
    res["workers"] = len(outs)
    res["stalls"] = stall_moments([g for o in outs for r in o[0] for g in r.long_gaps],
                                  min(o[1] for o in outs))
    res["client_cpu_share"] = [round(o[3] / max(o[2] - o[1], 1e-9), 3) for o in outs]
    return res
