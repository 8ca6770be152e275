"""Several HTTP processes on one port (`--api-server-count 3`) on the CPU: a real server,
driven by the real `openai` client and raw HTTP. Answers are checked against the demo model's
task (tests/number_words.py); which process answered comes from /debug/stats'
`http_server`, read on the same connection."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time

import httpx
import openai
import psutil
import pytest

from seq2serve.runtime.tools.demo_checkpoint import default_demo_path
from seq2serve.tests.number_words import is_held_out, number_to_words
from seq2serve.tests.server_helpers import ServerProcess

DEMO = str(default_demo_path())
SERVERS = 3
POOL = [n for n in random.Random(11).sample(range(100_000), 300) if not is_held_out(n)][:96]
POOLS = ("--max-total-tokens", "16384", "--max-cross-tokens", "16384")
LONG = 2000  # new tokens: seconds of decoding on a 2-core CPU


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(DEMO, "--api-server-count", str(SERVERS), *POOLS)
    yield srv
    srv.kill()


def _prompt(n: int) -> str:
    return f"translate digits to English: {n}"


def _process_of(c: httpx.Client) -> int:
    """The HTTP process behind this client's (kept-alive) connection."""
    stats = c.get("/debug/stats").json()
    assert stats["http_server"]["count"] == SERVERS
    return stats["http_server"]["index"]


def _clients_on_every_process(url: str) -> dict[int, httpx.Client]:
    """One open connection to each HTTP process (new connections until each has one: the
    kernel shares them out by a hash of their ports)."""
    found: dict[int, httpx.Client] = {}
    for _ in range(200):
        c = httpx.Client(base_url=url, timeout=120)
        index = _process_of(c)
        if index in found:
            c.close()
        else:
            found[index] = c
        if len(found) == SERVERS:
            return found
    raise AssertionError(f"200 connections reached only HTTP processes {sorted(found)}")


def test_the_processes_serve_the_port_and_are_counted(server):
    clients = _clients_on_every_process(server.url)
    for c in clients.values():
        c.close()
    http = [p for p in server.children()
            if open(f"/proc/{p}/cmdline", "rb").read().endswith(b"child\x00api\x00")]
    assert len(http) == SERVERS


def test_96_concurrent_requests_over_new_connections_all_answered(server):
    """Streamed and whole requests, each on a connection of its own (so they spread over the
    processes), all give the demo model's answer; /metrics adds up every process's counts."""
    def count(metrics: str, name: str) -> float:
        return sum(float(line.split()[-1]) for line in metrics.splitlines()
                   if line.startswith(name))

    before = httpx.get(server.url + "/metrics").text

    async def one(i: int, n: int) -> tuple[int, str]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            body = {"model": "demo-t5-numbers", "prompt": _prompt(n), "max_tokens": 40,
                    "temperature": 0}
            if i % 2:
                r = await c.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                return n, r.json()["choices"][0]["text"]
            text = ""
            async with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        text += json.loads(line[6:])["choices"][0]["text"]
            return n, text

    async def main():
        return await asyncio.gather(*(one(i, n) for i, n in enumerate(POOL)))

    results = asyncio.run(main())
    assert len(results) == len(POOL)
    for n, text in results:
        assert text == number_to_words(n), (n, text)
    after = httpx.get(server.url + "/metrics").text
    done = 'seq2serve_requests_total{endpoint="/v1/completions",status="200"}'
    assert count(after, done) - count(before, done) == len(POOL)
    assert count(after, "seq2serve_e2e_request_latency_seconds_count") - count(
        before, "seq2serve_e2e_request_latency_seconds_count") == len(POOL)
    stats = httpx.get(server.url + "/debug/stats").json()
    assert stats["running_requests"] == 0 and stats["waiting_requests"] == 0
    assert httpx.get(server.url + "/debug/integrity").json()["ok"]


def test_the_openai_client_gets_its_answers(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    for n in POOL[:6]:
        r = client.completions.create(model="demo-t5-numbers", prompt=_prompt(n),
                                      max_tokens=40, temperature=0)
        assert r.choices[0].text == number_to_words(n)


def test_an_abort_reaches_a_request_in_another_process(server):
    clients = _clients_on_every_process(server.url)
    try:
        body = {"text": _prompt(7), "rid": "long-1", "user": "alice", "stream": True,
                "sampling_params": {"max_new_tokens": LONG, "ignore_eos": True}}
        with clients[0].stream("POST", "/generate", json=body) as stream:
            lines = (json.loads(line[6:]) for line in stream.iter_lines()
                     if line.startswith("data: {"))
            assert next(lines)["meta_info"]["id"] == "long-1"
            r = clients[1].post("/abort_request", json={"rid": "long-1", "user": "alice"})
            assert r.status_code == 200
            last = None
            for last in lines:
                pass
        assert last["meta_info"]["finish_reason"]["type"] == "abort", last
        assert last["meta_info"]["completion_tokens"] < LONG
    finally:
        for c in clients.values():
            c.close()


def test_sigterm_drains_and_stops_every_process(server):
    children = server.all_children()
    http = [p for p in children
            if open(f"/proc/{p}/cmdline", "rb").read().endswith(b"child\x00api\x00")]
    workers = [c.pid for p in http for c in psutil.Process(p).children(recursive=True)]
    start = time.monotonic()
    assert server.terminate() == 0, server.output()
    assert time.monotonic() - start < 20
    time.sleep(0.5)
    for pid in children + workers:  # no orphans left behind
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_dead_scheduler_is_reported_and_ends_the_server():
    srv = ServerProcess(DEMO, "--api-server-count", "2", *POOLS)
    try:
        scheduler = next(p for p in srv.children()
                         if b"scheduler" in open(f"/proc/{p}/cmdline", "rb").read())
        os.kill(scheduler, 9)
        assert srv.proc.wait(30) == 1
        assert "scheduler process" in srv.output() and "died" in srv.output()
    finally:
        srv.kill()
