"""One client's load against a server: the workload's prompts (text to /v1/completions, a
user message with an image to /v1/chat/completions, or audio files to
/v1/audio/transcriptions), its requests streamed at a fixed concurrency or as
Poisson arrivals (with beams: answered whole, TTFT = E2E), each request's record (TTFT,
inter-token gaps, end-to-end time, token counts), and bench_serving's figures over any set of
records."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field

_WORDS = ["house", "river", "green", "table", "music", "light", "stone", "paper"]
_LONG_GAP_S = 0.010  # gaps kept with their wall time (stalls.py): a few decode steps


@dataclass
class RequestRecord:
    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    itls: list[float] = field(default_factory=list)
    # (wall time it ended, length) of each gap over _LONG_GAP_S
    long_gaps: list[tuple[float, float]] = field(default_factory=list)
    tokens: int = 0  # output tokens: the server's usage count, else the streamed chunks
    prompt_tokens: int = 0
    events: int = 0  # SSE events with text (one token each unless the server fell behind)
    error: str = ""


@dataclass(frozen=True)
class LoadSpec:
    """One client's share of the load (picklable: it crosses to the worker processes)."""

    base_url: str
    # text prompts (/v1/completions), chat messages (a dict: one user message, its image as
    # a data URL, to /v1/chat/completions), or audio files' bytes (/v1/audio/transcriptions:
    # each answer exactly output_len tokens, min_tokens = max_tokens)
    prompts: tuple[str | dict | bytes, ...]
    output_len: int
    concurrency: int | None  # None: Poisson arrivals at `rate`
    rate: float | None
    api_key: str | None = None
    seed: int = 0
    progress: bool = True
    num_beams: int = 1  # > 1: beam search, answered whole (a beam result is not streamed)

    def body(self, prompt: str | dict) -> dict:
        """The JSON body for a text prompt (/v1/completions) or a chat message."""
        first = {"messages": [prompt]} if isinstance(prompt, dict) else {"prompt": prompt}
        if self.num_beams > 1:
            return {**first, "max_tokens": self.output_len, "stream": False,
                    "temperature": 0, "ignore_eos": True, "num_beams": self.num_beams}
        return {**first, "max_tokens": self.output_len, "stream": True,
                "temperature": 0, "ignore_eos": True,
                "stream_options": {"include_usage": True}}

    def request(self, prompt: str | dict | bytes) -> tuple[str, dict, bool]:
        """(path, httpx's keyword arguments, streamed) of the request for `prompt`."""
        if isinstance(prompt, (str, dict)):
            body = self.body(prompt)
            path = "/v1/chat/completions" if isinstance(prompt, dict) else "/v1/completions"
            return path, {"json": body}, body["stream"]
        form = {"response_format": "json", "temperature": "0", "language": "en",
                "max_tokens": str(self.output_len), "min_tokens": str(self.output_len)}
        if self.num_beams > 1:
            form["num_beams"] = str(self.num_beams)
        else:
            form["stream"] = "true"
        files = {"file": ("clip.wav", prompt, "audio/wav")}
        return "/v1/audio/transcriptions", {"data": form, "files": files}, self.num_beams == 1


def make_prompts(num_requests: int, input_len: int, seed: int = 0) -> list[str]:
    """`input_len` words per prompt, the same for a seed in every process."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(input_len)) for _ in range(num_requests)]


def make_image_messages(num_requests: int, input_len: int, image_size: int,
                        seed: int = 0) -> list[dict]:
    """One user message a request: a distinct random `image_size`-pixel square image (JPEG,
    quality 90, as a data URL, as a client uploads a photo), then `input_len` words of text
    (Florence-2 reads them as its free-text task prompt; Mllama's chat template puts the
    image first)."""
    import base64
    import io

    from seq2serve.runtime.bench.workload import random_image

    messages = []
    for i, text in enumerate(make_prompts(num_requests, input_len, seed)):
        buf = io.BytesIO()
        random_image(seed * 100_003 + i, image_size).save(buf, format="JPEG", quality=90)
        url = "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
        messages.append({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": text}]})
    return messages


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    v = sorted(values)
    pick = lambda q: v[min(len(v) - 1, int(q * len(v)))]  # noqa: E731
    return {"mean_ms": statistics.fmean(v) * 1e3, "p50_ms": pick(0.5) * 1e3,
            "p90_ms": pick(0.9) * 1e3, "p99_ms": pick(0.99) * 1e3}


async def _sse_lines(response):
    """The stream's lines, split at LF only (SSE's line ends; the text may hold U+2028 or
    U+0085, which httpx's `aiter_lines` takes for line breaks and so cuts a JSON event)."""
    buf = b""
    async for chunk in response.aiter_bytes():
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r")
    if buf:
        yield buf


async def _whole(client, url: str, kwargs: dict, headers: dict) -> RequestRecord:
    """A request answered in one body (beam search): its first token comes with its last."""
    start = time.perf_counter()
    rec = RequestRecord(ok=False)
    try:
        r = await client.post(url, headers=headers, **kwargs)
        if r.status_code != 200:
            rec.error = f"HTTP {r.status_code}: {r.text[:200]!r}"
            return rec
        usage = r.json()["usage"]
        # (a transcription's usage: OpenAI's input_tokens / output_tokens)
        rec.tokens = usage.get("completion_tokens", usage.get("output_tokens", 0))
        rec.prompt_tokens = usage.get("prompt_tokens", usage.get("input_tokens", 0))
        rec.ok, rec.events = True, 1
        rec.ttft = rec.e2e = time.perf_counter() - start
    except Exception as e:  # noqa: BLE001 - a failed request is a measurement
        rec.error = f"{type(e).__name__}: {e}"
    return rec


async def _one(client, url: str, kwargs: dict, headers: dict, stream: bool,
               fixed_tokens: int = 0) -> RequestRecord:
    """`fixed_tokens`: the answer's length when the stream does not report it (a
    transcription's, asked with min_tokens = max_tokens)."""
    if not stream:
        return await _whole(client, url, kwargs, headers)
    start = last = time.perf_counter()
    rec, chunks = RequestRecord(ok=False), 0
    try:
        async with client.stream("POST", url, headers=headers, **kwargs) as r:
            if r.status_code != 200:
                rec.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return rec
            async for line in _sse_lines(r):
                if not line.startswith(b"data: {"):
                    continue
                msg = json.loads(line[6:])
                if msg.get("usage"):
                    rec.tokens = msg["usage"]["completion_tokens"]
                    rec.prompt_tokens = msg["usage"]["prompt_tokens"]
                if not msg.get("choices") and msg.get("type") != "transcript.text.delta":
                    continue
                now = time.perf_counter()
                if chunks == 0:
                    rec.ttft = now - start
                else:
                    rec.itls.append(now - last)
                    if now - last > _LONG_GAP_S:
                        rec.long_gaps.append((time.time(), now - last))
                last, chunks = now, chunks + 1
        rec.tokens, rec.events = rec.tokens or fixed_tokens or chunks, chunks
        rec.ok, rec.e2e = True, time.perf_counter() - start
    except Exception as e:  # noqa: BLE001 - a failed request is a measurement
        rec.error = f"{type(e).__name__}: {e}"
    return rec


async def run_load(spec: LoadSpec) -> tuple[list[RequestRecord], float, float]:
    """Every request of `spec`; the records and the wall-clock (time.time) start and end."""
    import httpx
    from tqdm import tqdm

    rng = random.Random(spec.seed)
    n = len(spec.prompts)
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    base = spec.base_url.rstrip("/")
    sem = asyncio.Semaphore(spec.concurrency or max(n, 1))
    limits = httpx.Limits(max_connections=spec.concurrency or max(n, 1))
    bar = tqdm(total=n, desc="requests", unit="req", disable=None if spec.progress else True)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def task(prompt: str | dict | bytes) -> RequestRecord:
            path, kwargs, stream = spec.request(prompt)
            fixed = spec.output_len if isinstance(prompt, bytes) else 0
            async with sem:
                record = await _one(client, base + path, kwargs, headers, stream, fixed)
                bar.update()
                return record

        start = time.time()
        jobs = []
        for prompt in spec.prompts:
            jobs.append(asyncio.ensure_future(task(prompt)))
            if spec.rate:  # Poisson arrivals
                await asyncio.sleep(rng.expovariate(spec.rate))
        records = await asyncio.gather(*jobs)
        end = time.time()
    bar.close()
    return list(records), start, end


def summarize(records: list[RequestRecord], seconds: float) -> dict:
    """bench_serving's figures over every record (of every worker)."""
    ok = [r for r in records if r.ok]
    tokens = sum(r.tokens for r in ok)
    return {
        "requests": len(records), "completed": len(ok), "failed": len(records) - len(ok),
        "errors": sorted({r.error for r in records if not r.ok})[:5],
        "seconds": seconds, "input_tokens": sum(r.prompt_tokens for r in ok),
        "output_tokens": tokens, "requests_per_s": len(ok) / seconds,
        "output_tokens_per_s": tokens / seconds,
        "ttft": percentiles([r.ttft for r in ok]),
        # ITL is per event; an event carries more than one token when the server's HTTP
        # process fell behind (tokens_per_event > 1), and TPOT is per token: SGLang's pair
        "itl": percentiles([x for r in ok for x in r.itls]),
        # (of streamed answers: one answered whole, as beams are, has no time a token)
        "tpot": percentiles([(r.e2e - r.ttft) / (r.tokens - 1) for r in ok
                             if r.tokens > 1 and r.events > 1]),
        "tokens_per_event": tokens / max(1, sum(r.events for r in ok)),
        "e2e": percentiles([r.e2e for r in ok]),
    }
