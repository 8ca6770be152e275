"""`seq2serve bench serving`: a load generator against a running server. Streams completions
at a fixed concurrency or a Poisson request rate from one or more client processes
(`--workers`: serving_workers.py; one client's load: serving_load.py) and reports SGLang
bench_serving's figures: request and output token throughput, time to first token,
inter-token and end-to-end latency (mean, p50, p90, p99); with `--compare-offline` the
offline engine's throughput on the same workload (serving_offline.py) and the ratio. With
`--audio-seconds` the requests are WAV clips to /v1/audio/transcriptions (a speech model's
server), each answered with exactly `--output-len` tokens; with `--image-size` they are chat
messages to /v1/chat/completions, each a distinct JPEG image and `--input-len` words (an
image model's server: Florence-2, Mllama).

Before the timed load, a warm-up round of distinct requests (`--warmup-requests`; by default
one round at the load's concurrency) runs the server's first batches of each size: on a
fresh machine those compile Triton kernel variants (whisper-large-v3 on an H200: ~1.1 s in
its first encoder pass and ~1.4 s in its first decoder step, twenty-first session) that a
running server pays once. The offline engine is warmed with the same requests. The warm-up's
own figures are reported apart (`warmup`), so a cold start stays visible."""

from __future__ import annotations

import json
import time

from seq2serve.runtime.bench.serving_load import LoadSpec, make_image_messages, make_prompts
from seq2serve.runtime.bench.step_stats import describe, window
from seq2serve.runtime.bench.workload import wav_clips


def add_serving_parser(sub) -> None:
    p = sub.add_parser("serving", help="load generator against a running server")
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--input-len", type=int, default=64, help="words per prompt")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--request-rate", type=float, default=None,
                   help="Poisson arrivals per second (instead of a fixed concurrency)")
    p.add_argument("--workers", type=int, default=1,
                   help="client processes sharing the load (requests, concurrency or rate)")
    p.add_argument("--compare-offline", action="store_true",
                   help="then run the offline engine on the same workload (the server's model "
                        "path, from /get_model_info) and print server / offline")
    p.add_argument("--engine-args", default="{}",
                   help="JSON of the offline engine's options (with --compare-offline)")
    p.add_argument("--num-beams", type=int, default=1,
                   help="beam search with this many beams (each request answered whole, not "
                        "streamed; the server's max_running_requests counts beam rows)")
    p.add_argument("--audio-seconds", type=float, default=None,
                   help="send distinct synthetic clips this long (at most 30) as WAV files to "
                        "/v1/audio/transcriptions instead of text prompts (--input-len unused; "
                        "streamed, language en, min_tokens = max_tokens = --output-len)")
    p.add_argument("--image-size", type=int, default=None,
                   help="send chat messages to /v1/chat/completions instead, each a distinct "
                        "random square JPEG image of this many pixels a side (a data URL) "
                        "and --input-len words of text")
    p.add_argument("--warmup-requests", type=int, default=None,
                   help="distinct requests sent (all at once) before the timed load, reported "
                        "apart (default: one round, the concurrency or the rate's requests in "
                        "one second; 0: none)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=0,
                   help="the load's prompts and arrival times; give each load on one server "
                        "its own (the same prompts again are answered partly from its caches)")
    p.add_argument("--json", default=None)
    p.set_defaults(fn=_serving)


def workload(num_requests: int, input_len: int, seed: int = 0,
             audio_seconds: float | None = None,
             image_size: int | None = None) -> list[str | dict | bytes]:
    """The requests' prompts: text of `input_len` words, chat messages of an `image_size`
    image and such text, or WAV clips of `audio_seconds`."""
    if image_size is not None:
        if audio_seconds is not None:
            raise ValueError("give --image-size or --audio-seconds, not both")
        if not 0 < image_size <= 4096:
            raise ValueError(f"--image-size must be in (0, 4096] pixels, got {image_size}")
        return make_image_messages(num_requests, input_len, image_size, seed)
    if audio_seconds is None:
        return make_prompts(num_requests, input_len, seed)
    if not 0 < audio_seconds <= 30:
        raise ValueError(f"--audio-seconds must be in (0, 30] (one Whisper window), got "
                         f"{audio_seconds:g}")
    return wav_clips(num_requests, audio_seconds, seed)


def measure(base_url: str, num_requests: int, input_len: int, output_len: int,
            concurrency: int | None, rate: float | None, workers: int = 1,
            api_key: str | None = None, seed: int = 0, num_beams: int = 1,
            audio_seconds: float | None = None, warmup: int | None = 0,
            image_size: int | None = None) -> dict:
    """One load's figures (`concurrency` None: Poisson arrivals at `rate`), merged over
    `workers` client processes, after `warmup` distinct requests sent at once (None: one
    round, `warmup_count`), whose own figures come as `warmup`."""
    from seq2serve.runtime.bench.serving_workers import run_workers

    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    if num_beams < 1:
        raise ValueError(f"--num-beams must be at least 1, got {num_beams}")
    if warmup is None:
        warmup = warmup_count(num_requests, concurrency, rate)
    if warmup < 0:
        raise ValueError(f"--warmup-requests must be at least 0, got {warmup}")
    prompts = workload(num_requests, input_len, seed, audio_seconds, image_size)
    spec = LoadSpec(base_url, tuple(prompts), output_len, concurrency, rate, api_key, seed,
                    num_beams=num_beams)
    warm = None
    if warmup:
        warm_spec = LoadSpec(base_url, tuple(warmup_workload(warmup, input_len, seed,
                                                              audio_seconds, image_size)),
                             output_len, warmup, None, api_key, seed, num_beams=num_beams,
                             progress=False)
        warm = run_workers(warm_spec, 1)
    before, start = server_stats(base_url, api_key), time.perf_counter()
    res = run_workers(spec, workers)
    after, elapsed = server_stats(base_url, api_key), time.perf_counter() - start
    # (the scheduler's side of the load: None where the server does not answer /debug/stats)
    server = window(before, after, elapsed) if before and after else None
    return res | {"concurrency": concurrency, "rate": rate, "num_beams": num_beams,
                  "audio_seconds": audio_seconds, "image_size": image_size, "warmup": warm,
                  "server": server}


def server_stats(base_url: str, api_key: str | None = None) -> dict | None:
    """The server's scheduler counters (/debug/stats), or None if it does not answer them."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(base_url.rstrip("/") + "/debug/stats", headers=headers, timeout=30)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None


def warmup_count(num_requests: int, concurrency: int | None, rate: float | None) -> int:
    """The default warm-up: one round of the load (its concurrency, or a second of its
    arrivals), no more requests than the load has."""
    per_round = concurrency if concurrency else max(1, round(rate or 1))
    return min(per_round, num_requests)


def warmup_workload(n: int, input_len: int, seed: int, audio_seconds: float | None,
                    image_size: int | None = None) -> list[str | dict | bytes]:
    """`n` requests none of the load's prompts repeats (another seed): the server's caches
    (radix, encoder) cannot answer the timed load from them."""
    return workload(n, input_len, seed + 1_000_003, audio_seconds, image_size)


def _serving(args) -> dict:
    res = measure(args.base_url, args.num_requests, args.input_len, args.output_len,
                  None if args.request_rate else args.concurrency, args.request_rate,
                  args.workers, args.api_key, args.seed, args.num_beams, args.audio_seconds,
                  args.warmup_requests, args.image_size)
    if res["warmup"]:
        w = res["warmup"]
        print(f"warm-up (not in the figures below): {w['completed']}/{w['requests']} requests "
              f"in {w['seconds']:.2f} s", flush=True)
    print_summary(res)
    if res["server"]:
        print(f"server during the load: {describe(res['server'])}", flush=True)
    if args.compare_offline:
        from seq2serve.runtime.bench.serving_offline import compare_offline

        warm = res["warmup"]["requests"] if res["warmup"] else 0
        res["offline"] = compare_offline(
            args.base_url, workload(args.num_requests, args.input_len, args.seed,
                                    args.audio_seconds, args.image_size),
            args.output_len, res["concurrency"], json.loads(args.engine_args), args.num_beams,
            warmup_prompts=warmup_workload(warm, args.input_len, args.seed,
                                           args.audio_seconds, args.image_size)
            if warm else None)
        res["server_over_offline"] = (res["output_tokens_per_s"]
                                      / res["offline"]["output_tokens_per_s"])
        print(f"offline engine: {res['offline']['output_tokens_per_s']:.1f} output tok/s; "
              f"server / offline: {res['server_over_offline']:.2f}x", flush=True)
        print(f"offline engine's scheduler: {describe(res['offline']['scheduler'])}",
              flush=True)
    print(json.dumps(res, indent=2), flush=True)
    return res


def print_summary(res: dict) -> None:
    print(f"requests {res['completed']}/{res['requests']} in {res['seconds']:.2f} s "
          f"({res['workers']} client processes): {res['requests_per_s']:.2f} req/s, "
          f"{res['output_tokens_per_s']:.1f} output tok/s", flush=True)
    print(f"  {res['tokens_per_event']:.2f} output tokens per streamed event", flush=True)
    if res["completed"] and not res["tpot"]:
        print("  answered whole (one event an answer, as beams are): TTFT is each answer's "
              "whole time, and there is no time a token", flush=True)
    for name in ("ttft", "itl", "tpot", "e2e"):
        f = res[name]
        if f:
            print(f"  {name.upper():4s} mean {f['mean_ms']:9.1f}  p50 {f['p50_ms']:9.1f}  "
                  f"p90 {f['p90_ms']:9.1f}  p99 {f['p99_ms']:9.1f} ms", flush=True)
    st = res.get("stalls")
    if st and st["long_gaps"]:
        print(f"  gaps over 10 ms: {st['long_gaps']}, {st['in_shared_stalls']} of them in "
              f"{st['shared_stalls']} moments shared by >= 8 streams; largest: "
              + ", ".join(f"{m['streams']} streams at {m['at_s']} s ({m['gap_p50_ms']} ms)"
                          for m in st["largest"][:3]), flush=True)
    for e in res["errors"]:
        print(f"  error: {e}", flush=True)
