"""`seq2serve bench serving`: a load generator against a running server. Streams completions
at a fixed concurrency or a Poisson request rate and reports time to first token, inter-token
latency, end-to-end latency (percentiles) and throughput."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    itls: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str = ""


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    v = sorted(values)
    pick = lambda q: v[min(len(v) - 1, int(q * len(v)))]  # noqa: E731
    return {"mean_ms": statistics.fmean(v) * 1e3, "p50_ms": pick(0.5) * 1e3,
            "p90_ms": pick(0.9) * 1e3, "p99_ms": pick(0.99) * 1e3}


async def _one(client, url: str, body: dict, headers: dict) -> RequestRecord:
    start = time.perf_counter()
    last = start
    rec = RequestRecord(ok=False)
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                rec.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return rec
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                now = time.perf_counter()
                if rec.tokens == 0:
                    rec.ttft = now - start
                else:
                    rec.itls.append(now - last)
                last = now
                rec.tokens += 1
        rec.ok, rec.e2e = True, time.perf_counter() - start
    except Exception as e:  # noqa: BLE001 - a failed request is a measurement
        rec.error = f"{type(e).__name__}: {e}"
    return rec


async def run_load(base_url: str, num_requests: int, input_len: int, output_len: int,
                   concurrency: int | None, rate: float | None, api_key: str | None = None,
                   seed: int = 0) -> dict:
    import httpx

    rng = random.Random(seed)
    words = ["house", "river", "green", "table", "music", "light", "stone", "paper"]
    prompts = [" ".join(rng.choice(words) for _ in range(input_len)) for _ in range(num_requests)]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = base_url.rstrip("/") + "/v1/completions"
    sem = asyncio.Semaphore(concurrency or num_requests)
    limits = httpx.Limits(max_connections=concurrency or num_requests)

    from tqdm import tqdm

    bar = tqdm(total=num_requests, desc="requests", unit="req", disable=None)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def task(i: int) -> RequestRecord:
            async with sem:
                body = {"prompt": prompts[i], "max_tokens": output_len, "stream": True,
                        "temperature": 0, "ignore_eos": True}
                record = await _one(client, url, body, headers)
                bar.update()
                return record

        start = time.perf_counter()
        jobs = []
        for i in range(num_requests):
            jobs.append(asyncio.ensure_future(task(i)))
            if rate:  # Poisson arrivals
                await asyncio.sleep(rng.expovariate(rate))
        records = await asyncio.gather(*jobs)
        elapsed = time.perf_counter() - start
    bar.close()
    ok = [r for r in records if r.ok]
    tokens = sum(r.tokens for r in ok)
    return {
        "requests": num_requests, "completed": len(ok), "failed": num_requests - len(ok),
        "errors": sorted({r.error for r in records if not r.ok})[:5],
        "seconds": elapsed, "output_tokens_per_s": tokens / elapsed,
        "requests_per_s": len(ok) / elapsed, "concurrency": concurrency, "rate": rate,
        "ttft": _percentiles([r.ttft for r in ok]),
        "itl": _percentiles([x for r in ok for x in r.itls]),
        "e2e": _percentiles([r.e2e for r in ok]),
    }


def add_serving_parser(sub) -> None:
    p = sub.add_parser("serving", help="load generator against a running server")
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--input-len", type=int, default=64, help="words per prompt")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--request-rate", type=float, default=None,
                   help="Poisson arrivals per second (instead of a fixed concurrency)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--json", default=None)
    p.set_defaults(fn=_serving)


def _serving(args) -> dict:
    res = asyncio.run(run_load(args.base_url, args.num_requests, args.input_len,
                               args.output_len, None if args.request_rate else args.concurrency,
                               args.request_rate, args.api_key))
    print(json.dumps(res, indent=2))
    return res
