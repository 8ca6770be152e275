"""Reliability and security, with figures: schema fuzzing, a soak with aborts, memory pressure,
faults, limits and hostile input. Reduced sizes by default (CI); the full run is

    SEQ2SERVE_RELIABILITY=full SEQ2SERVE_RELIABILITY_REPORT=reliability.json \\
        pytest -q tests/test_reliability.py

whose figures docs/reliability.md reports."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from seq2serve import Seq2SeqEngine
from seq2serve.runtime.tools.demo_checkpoint import default_demo_path, write_mllama_checkpoint
from seq2serve.tests.server_helpers import ServerProcess

FULL = os.environ.get("SEQ2SERVE_RELIABILITY") == "full"
FUZZ_EXAMPLES = 450 if FULL else 25  # per operation with inputs (7 of the 11 operations)
SOAK_REQUESTS = 20_000 if FULL else 200
SOAK_MARK = SOAK_REQUESTS // 10  # memory is compared with this point (warm-up done)
SOAK_CONCURRENCY = 48 if FULL else 32
FIGURES: dict = {}
DEMO = str(default_demo_path())
# a server with limits small enough that fuzzing never waits on long generations
LIMITED = ("--max-new-tokens-limit", "32", "--max-n", "4", "--max-prompt-tokens", "256",
           "--max-request-bytes", str(256 << 10))


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    path = os.environ.get("SEQ2SERVE_RELIABILITY_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({"scale": "full" if FULL else "ci", **FIGURES}, f, indent=2)


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(DEMO, *LIMITED)
    yield srv
    assert srv.proc.poll() is None, "the server died"
    assert httpx.get(srv.url + "/health").status_code == 200
    assert httpx.get(srv.url + "/debug/integrity").json()["ok"]
    assert srv.terminate() == 0


def _tree_rss(pid: int) -> int:
    p = psutil.Process(pid)
    return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])


def _onednn_mb_per_shape() -> float:
    """Host memory (MB) oneDNN and PyTorch's ideep keep for each new product shape, measured
    in a fresh process: 200 new row counts through one packed weight of the demo model's
    width. A CPU scheduler keeps one primitive per (rows, weight) it meets (models/cpu_ops.py),
    counted in /debug/stats as `cpu_gemm_shapes`."""
    code = """
import psutil, torch
from seq2serve.models.cpu_ops import OneDnnOps
from seq2serve.models.linear import Linear
from seq2serve.models.ops import use_ops
layer, ops = Linear(96, 96), OneDnnOps()
use_ops(layer, ops)
ops.warm(layer)
with torch.inference_mode():
    layer(torch.randn(1, 96))
    before = psutil.Process().memory_info().rss
    for rows in range(2, 202):
        layer(torch.randn(rows, 96))
    print((psutil.Process().memory_info().rss - before) / 200 / 2**20)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return float(out)


def _cached_mb(stats: dict, mb_per_shape: float) -> float:
    """What the scheduler's bounded caches hold (MB), from /debug/stats: the encoder cache's
    warm tier (hidden states, up to --encoder-hidden-cache-mb) and oneDNN's primitives (up to
    its caches' capacity)."""
    return (stats["encoder_cache_hidden_bytes"] / 2**20
            + stats["cpu_gemm_shapes"] * mb_per_shape)


def _process_rss(srv: ServerProcess) -> dict[str, int]:
    """RSS in MB of the server and each of its children, by role."""
    out = {"http": psutil.Process(srv.proc.pid).memory_info().rss >> 20}
    for pid in srv.children():
        cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        out["scheduler" if b"scheduler" in cmd else "detokenizer"] = \
            psutil.Process(pid).memory_info().rss >> 20
    return out


# --- schema fuzzing ------------------------------------------------------------------------
FUZZED = {"requests": 0, "server_errors": 0, "operations": 0}


def test_schema_fuzzing_never_gets_a_5xx(server):
    """Every operation of the server's own OpenAPI schema, with requests generated from it
    (schemathesis' strategies driven by hypothesis)."""
    from hypothesis import given

    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    for op in operations:
        @given(case=op.as_strategy())
        @settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def fuzz(case):
            response = case.call(base_url=server.url, timeout=60)
            FUZZED["requests"] += 1
            FUZZED["server_errors"] += response.status_code >= 500
            case.validate_response(response, checks=[not_a_server_error])

        fuzz()
        FUZZED["operations"] += 1
        assert server.proc.poll() is None, f"the server died fuzzing {op.label}"
    FIGURES["fuzzing"] = dict(FUZZED)
    assert FUZZED["server_errors"] == 0


def test_server_healthy_after_fuzzing(server):
    assert FUZZED["requests"] >= 5 * FUZZ_EXAMPLES
    if FULL:
        assert FUZZED["requests"] >= 2000
    assert httpx.get(server.url + "/health").status_code == 200
    r = httpx.post(server.url + "/v1/translations", json={
        "input": "1984", "source_lang": "digits", "target_lang": "English"})
    assert r.json()["data"][0]["translation"] == "one thousand nine hundred eighty-four"


# --- soak with aborts ----------------------------------------------------------------------
def test_soak_with_disconnects(server):
    """Mixed traffic with 10 % of clients leaving early (5 % mid-stream, 5 % waiting for a
    non-streamed answer); afterwards nothing runs, every slot is accounted for, and no
    process's memory grew after the first tenth of the run (5 % at full scale) beyond what
    the scheduler's bounded caches took meanwhile (they fill over tens of thousands of
    distinct requests; docs/reliability.md has the figures)."""
    rng = random.Random(0)
    numbers = [rng.randrange(-999_999, 1_000_000) for _ in range(SOAK_REQUESTS)]
    mb_per_shape = _onednn_mb_per_shape()
    cached_start = _cached_mb(httpx.get(server.url + "/debug/stats").json(), mb_per_shape)
    rss_start = _tree_rss(server.proc.pid)

    async def one(c: httpx.AsyncClient, i: int) -> str:
        prompt = f"translate digits to English: {numbers[i]}"
        kind = i % 20
        if kind == 0:  # aborted mid-stream: the client goes away after two events
            async with c.stream("POST", "/v1/completions", json={
                    "prompt": prompt, "max_tokens": 32, "stream": True,
                    "ignore_eos": True}) as r:
                seen = 0
                async for line in r.aiter_lines():
                    seen += line.startswith("data: {")
                    if seen == 2:
                        return "aborted"
            return "lost"
        if kind == 10:  # a non-streamed request whose client gives up waiting
            try:
                r = await c.post("/v1/completions", timeout=0.02, json={
                    "prompt": prompt, "max_tokens": 32, "ignore_eos": True})
            except httpx.TimeoutException:
                return "aborted"
            return "ok" if r.status_code == 200 else "lost"  # it was quicker than that
        if kind in (1, 2, 3, 11, 12, 13):  # streamed to the end
            text, done = "", False
            async with c.stream("POST", "/v1/completions", json={
                    "prompt": prompt, "max_tokens": 32, "stream": True,
                    "temperature": 0}) as r:
                async for line in r.aiter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: {"):
                        text += json.loads(line[6:])["choices"][0]["text"]
            return "ok" if done and text else "lost"
        r = await c.post("/v1/translations", json={
            "input": [str(numbers[i])], "source_lang": "digits", "target_lang": "English",
            "max_tokens": 8 + i % 24})
        ok = r.status_code == 200 and r.json()["data"][0]["finish_reason"] in ("stop", "length")
        return "ok" if ok else "lost"

    async def run(indices) -> list[str]:
        sem = asyncio.Semaphore(SOAK_CONCURRENCY)
        limits = httpx.Limits(max_connections=SOAK_CONCURRENCY)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as c:
            async def guarded(i):
                async with sem:
                    return await one(c, i)
            return await asyncio.gather(*(guarded(i) for i in indices))

    def settle() -> dict:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            stats = httpx.get(server.url + "/debug/stats").json()
            if stats["running_requests"] == stats["waiting_requests"] == 0:
                break
            time.sleep(0.2)
        return stats

    start = time.monotonic()
    results = asyncio.run(run(range(SOAK_MARK)))
    stats_mark = settle()
    rss_mark = _process_rss(server)
    results += asyncio.run(run(range(SOAK_MARK, SOAK_REQUESTS)))
    elapsed = time.monotonic() - start
    stats = settle()
    integrity = httpx.get(server.url + "/debug/integrity").json()
    rss_end = _tree_rss(server.proc.pid)
    rss_final = _process_rss(server)
    cached_mark = _cached_mb(stats_mark, mb_per_shape)
    cached_end = _cached_mb(stats, mb_per_shape)
    FIGURES["soak"] = {
        "requests": SOAK_REQUESTS, "concurrency": SOAK_CONCURRENCY,
        "completed": results.count("ok"), "aborted": results.count("aborted"),
        "lost": results.count("lost"), "seconds": round(elapsed, 1),
        "integrity_ok": integrity["ok"], "rss_start_mb": rss_start >> 20,
        "rss_end_mb": rss_end >> 20, "rss_mb_at_mark": rss_mark, "rss_mb_at_end": rss_final,
        "mark": SOAK_MARK, "onednn_mb_per_shape": round(mb_per_shape, 3),
        # the scheduler's bounded caches at the start, the mark and the end
        "cached_mb": [round(cached_start), round(cached_mark), round(cached_end)],
        "cpu_gemm_shapes_at_mark_and_end": [stats_mark["cpu_gemm_shapes"],
                                            stats["cpu_gemm_shapes"]],
        "encoder_cache_entries_at_mark_and_end": [stats_mark["encoder_cache_entries"],
                                                  stats["encoder_cache_entries"]],
        "hidden_mb_at_mark_and_end": [round(stats_mark["encoder_cache_hidden_bytes"] / 2**20),
                                      round(stats["encoder_cache_hidden_bytes"] / 2**20)]}
    assert results.count("lost") == 0 and integrity["ok"]
    assert results.count("aborted") >= SOAK_REQUESTS // 20  # every mid-stream one, and more
    assert stats["running_requests"] == 0 and stats["waiting_requests"] == 0
    # no unbounded growth: the tree within 400 MB of the start, the caches' filling aside
    net_end = (rss_end >> 20) - (cached_end - cached_start)
    assert net_end < (rss_start >> 20) + 400, FIGURES["soak"]
    if FULL:  # flat once warm: each process within 5 % of where it was at the mark
        for role, mb in rss_final.items():
            held = cached_end - cached_mark if role == "scheduler" else 0
            assert mb - held <= rss_mark[role] * 1.05, FIGURES["soak"]


# --- memory pressure -----------------------------------------------------------------------
def test_tiny_pools_queue_and_retract_but_lose_nothing(server):
    numbers = [str(n) for n in range(987_000, 987_024)]
    body = {"input": numbers, "source_lang": "digits", "target_lang": "English",
            "max_tokens": 20}
    reference = httpx.post(server.url + "/v1/translations", json=body, timeout=120).json()
    # 6 pages of decoder K/V for 24 requests that need ~3 each; room for ~5 sources
    tight = ServerProcess(DEMO, "--page-size", "4", "--max-total-tokens", "24",
                          "--max-cross-tokens", "60", "--disable-radix-cache")
    try:
        r = httpx.post(tight.url + "/v1/translations", json=body, timeout=300)
        assert r.status_code == 200, r.text
        stats = httpx.get(tight.url + "/debug/stats").json()
        assert [d["translation"] for d in r.json()["data"]] == [
            d["translation"] for d in reference["data"]]
        assert httpx.get(tight.url + "/debug/integrity").json()["ok"]
        FIGURES["memory_pressure"] = {"requests": len(numbers), "kv_pool_tokens": 24,
                                      "cross_pool_tokens": 60, "retractions":
                                      stats["retractions"], "same_output": True}
        assert stats["retractions"] > 0
    finally:
        assert tight.terminate() == 0


# --- faults --------------------------------------------------------------------------------
def _children(srv: ServerProcess) -> dict[str, int]:
    out = {}
    for pid in srv.children():
        cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        out["scheduler" if b"scheduler" in cmd else "detokenizer"] = pid
    return out


@pytest.mark.parametrize("victim", ["scheduler", "detokenizer"])
def test_a_dead_child_ends_the_server_quickly(victim):
    srv = ServerProcess(DEMO)
    try:
        children = _children(srv)
        os.kill(children[victim], signal.SIGKILL)
        start = time.monotonic()
        code = srv.proc.wait(timeout=10)
        took = time.monotonic() - start
        assert code != 0 and f"{victim} process" in srv.output()
        time.sleep(0.5)
        orphans = [p for p in children.values() if psutil.pid_exists(p)
                   and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert not orphans
        FIGURES.setdefault("faults", []).append({"killed": victim, "exit_code": code,
                                                 "seconds_to_exit": round(took, 2),
                                                 "orphans": len(orphans)})
    finally:
        srv.kill()


def test_sigterm_under_load_shuts_down_cleanly():
    srv = ServerProcess(DEMO)
    children = _children(srv)
    results: list = []

    def load():
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            for i in range(200):
                try:
                    r = c.post("/v1/translations", json={"input": [str(i)] * 4, "source_lang":
                                                         "digits", "target_lang": "English"})
                    results.append(r.status_code)
                except httpx.HTTPError:
                    results.append("closed")
                    return

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    start = time.monotonic()
    code = srv.terminate(timeout=20)
    took = time.monotonic() - start
    for t in threads:
        t.join(timeout=30)
    assert code == 0 and took < 15
    assert not any(t.is_alive() for t in threads)  # every client got an answer or a close
    assert all(r in (200, 503, "closed") for r in results)
    time.sleep(0.5)
    assert not [p for p in children.values() if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    FIGURES.setdefault("faults", []).append({"killed": "SIGTERM under load", "exit_code": code,
                                             "seconds_to_exit": round(took, 2),
                                             "requests_answered_before": results.count(200)})


# --- limits --------------------------------------------------------------------------------
LIMIT_CASES = [
    ("request body", "/v1/completions", {"prompt": "x" * (300 << 10)}, 413, "max_request_bytes"),
    ("prompt tokens", "/v1/completions", {"prompt": "1 " * 400}, 400, "max_prompt_tokens"),
    ("max_tokens", "/v1/completions", {"prompt": "1", "max_tokens": 33}, 400,
     "max_new_tokens_limit"),
    ("n", "/v1/completions", {"prompt": "1", "n": 5}, 400, "max_n"),
]


@pytest.mark.parametrize("name, path, body, status, needle", LIMIT_CASES)
def test_limits_name_themselves(server, name, path, body, status, needle):
    r = httpx.post(server.url + path, json=body, timeout=30)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]
    FIGURES.setdefault("limits", []).append({"limit": name, "status": r.status_code})
    ok = httpx.post(server.url + "/v1/completions", json={"prompt": "1984", "max_tokens": 4})
    assert ok.status_code == 200


def _png_data_url(size: int) -> str:
    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray((np.random.default_rng(size).random((size, size, 3)) * 255)
                    .astype("uint8")).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_image_limits_and_hostile_images(tmp_path):
    path = str(write_mllama_checkpoint(tmp_path / "m"))
    srv = ServerProcess(path, "--max-images-per-request", "2", "--max-image-pixels", "10000")
    try:
        def chat(parts):
            return httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": parts}], "max_tokens": 2})

        small = {"type": "image_url", "image_url": {"url": _png_data_url(40)}}
        text = {"type": "text", "text": "describe"}
        cases = {
            "images per request": ([small] * 3 + [text], "max_images_per_request"),
            "pixels per image": ([{"type": "image_url", "image_url": {
                "url": _png_data_url(200)}}, text], "over the limit of 10000"),
            "truncated image": ([{"type": "image_url", "image_url": {
                "url": small["image_url"]["url"][:200]}}, text], "image 0"),
            "remote URL": ([{"type": "image_url", "image_url": {
                "url": "http://169.254.169.254/latest/meta-data"}}, text], "disabled"),
            "local file": ([{"type": "image_url", "image_url": {"url": "/etc/hostname"}},
                            text], "image 0"),
        }
        for name, (parts, needle) in cases.items():
            r = chat(parts)
            assert r.status_code == 400 and needle in r.json()["error"]["message"], (name, r.text)
            FIGURES.setdefault("limits", []).append({"limit": name, "status": r.status_code})
        assert chat([small, text]).status_code == 200
        assert httpx.get(srv.url + "/debug/integrity").json()["ok"]
    finally:
        assert srv.terminate() == 0


# --- isolation -----------------------------------------------------------------------------
def test_isolation_across_users_over_http():
    srv = ServerProcess(DEMO, "--cache-isolation", "user", "--page-size", "4")
    try:
        body = {"input_ids": [13959, 3, 9, 12, 1566, 10, 3, 2534, 4482, 1],
                "decoder_input_ids": [0, 80, 7523, 3, 15, 18, 386, 6189, 3, 9, 10],
                "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
        first = httpx.post(srv.url + "/generate", json={**body, "user": "alice"}).json()
        same = httpx.post(srv.url + "/generate", json={**body, "user": "alice"}).json()
        other = httpx.post(srv.url + "/generate", json={**body, "user": "bob"}).json()
        assert same["meta_info"]["encoder_cache_hit"] and same["meta_info"]["cached_tokens"] > 0
        # a cross-user hit would show here
        assert not other["meta_info"]["encoder_cache_hit"]
        assert other["meta_info"]["cached_tokens"] == 0
        assert other["output_ids"] == first["output_ids"]
        FIGURES["isolation"] = {"same_user_cached_tokens": same["meta_info"]["cached_tokens"],
                                "other_user_cached_tokens": 0, "cross_user_hits": 0}
    finally:
        assert srv.terminate() == 0


def test_engine_refuses_bad_limits_at_start():
    with pytest.raises(ValueError, match="max_n"):
        Seq2SeqEngine(model_path=DEMO, device="cpu", max_n=0)
