"""Data parallelism (`--dp-size 2`) on the CPU: a real server with two scheduler replicas,
driven by the real `openai` client and raw HTTP. Answers are checked against the independent
reference of the bundled demo model's task (tests/number_words.py), the replica each request
went to against what the replicas report (`meta_info`, /debug/stats)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time

import httpx
import openai
import psutil
import pytest

from seq2serve import Seq2SeqEngine
from seq2serve.runtime.tools.demo_checkpoint import default_demo_path, write_mllama_checkpoint
from seq2serve.tests.mllama_oracle import random_image
from seq2serve.tests.number_words import is_held_out, number_to_words
from seq2serve.tests.server_helpers import ServerProcess

DEMO = str(default_demo_path())
# numbers from the demo model's training split: it answers them exactly
POOL = [n for n in random.Random(7).sample(range(100_000), 600) if not is_held_out(n)]
LOAD, REPEATED = POOL[:200], POOL[200:232]
# pools of a few MB (by default a CPU replica plans them from the host's free memory)
POOLS = ("--max-total-tokens", "16384", "--max-cross-tokens", "16384")
# the control routes and meta_info.replica are the admin's (--admin-api-key)
ADMIN_KEY = "admin-key-dp"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _prompt(n: int) -> str:
    return f"translate digits to English: {n}"


def _schedulers(srv: ServerProcess) -> list[int]:
    return [p for p in srv.children()
            if b"scheduler" in open(f"/proc/{p}/cmdline", "rb").read()]


@pytest.fixture(scope="module")
def server():
    """One dp_size 2 server for the module; its last test kills a replica."""
    srv = ServerProcess(DEMO, "--dp-size", "2", *POOLS, "--admin-api-key", ADMIN_KEY)
    yield srv
    srv.kill()


def test_the_layout_is_reported(server):
    assert "2 data-parallel replicas (0: cpu, 1: cpu)" in server.output()
    layout = httpx.get(server.url + "/debug/stats", headers=ADMIN).json()["layout"]
    assert layout["dp_size"] == 2
    assert sorted(r["pid"] for r in layout["replicas"]) == sorted(_schedulers(server))
    assert len(server.children()) == 3  # two schedulers, one detokenizer


def test_200_concurrent_requests_nothing_lost(server):
    before = httpx.get(server.url + "/debug/stats", headers=ADMIN).json()
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused",
                                timeout=120, max_retries=0)

    async def one(n: int) -> str:
        r = await client.completions.create(model="demo-t5-numbers", prompt=_prompt(n),
                                            max_tokens=40, temperature=0)
        assert r.choices[0].finish_reason == "stop"
        return r.choices[0].text

    async def main():
        try:
            return await asyncio.gather(*(one(n) for n in LOAD))
        finally:
            await client.close()

    texts = asyncio.run(main())
    expected = [number_to_words(n) for n in LOAD]
    # the demo model gets a few numbers wrong (alone too); a lost or crossed answer would be
    # missing, or another request's
    wrong = [(want, got) for want, got in zip(expected, texts) if got != want]
    assert len(texts) == 200 and len(wrong) <= 4, wrong
    assert not {got for _, got in wrong} & set(expected)
    after = httpx.get(server.url + "/debug/stats", headers=ADMIN).json()
    router = after["router"]
    assert router["outstanding_requests"] == [0, 0] and router["outstanding_tokens"] == [0, 0]
    routed = [a + b for a, b in zip(router["routed_affinity"], router["routed_least_loaded"])]
    done = [routed[i] - sum(before["router"][k][i] for k in ("routed_affinity",
                                                              "routed_least_loaded"))
            for i in range(2)]
    assert sum(done) == 200 and min(done) >= 60  # both replicas served a fair share
    encoded = [r["encoder_inputs"] for r in after["replicas"]]
    assert sum(encoded) - before["encoder_inputs"] == 200  # each source encoded once
    assert after["running_requests"] == after["waiting_requests"] == 0
    assert httpx.get(server.url + "/debug/integrity", headers=ADMIN).json()["ok"]
    metrics = httpx.get(server.url + "/metrics", headers=ADMIN).text
    for i in (0, 1):
        assert f'seq2serve_kv_cache_usage{{replica="{i}"}}' in metrics
        assert f'seq2serve_dp_outstanding_requests{{replica="{i}"}} 0.0' in metrics


def test_a_repeated_source_goes_to_the_replica_that_cached_it(server):
    async def round_(c: httpx.AsyncClient, numbers: list[int]) -> dict[int, dict]:
        async def one(n):
            r = await c.post("/generate", json={"text": _prompt(n), "sampling_params": {
                "max_new_tokens": 40, "temperature": 0}}, headers=ADMIN)
            assert r.status_code == 200, r.text
            return n, r.json()

        return dict(await asyncio.gather(*(one(n) for n in numbers)))

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            first = await round_(c, REPEATED)
            again = await round_(c, random.Random(1).sample(REPEATED, len(REPEATED)))
            return first, again

    first, again = asyncio.run(main())
    assert not any(first[n]["meta_info"]["encoder_cache_hit"] for n in REPEATED)
    assert {first[n]["meta_info"]["replica"] for n in REPEATED} == {0, 1}
    for n in REPEATED:
        assert again[n]["meta_info"]["replica"] == first[n]["meta_info"]["replica"]
        assert again[n]["meta_info"]["encoder_cache_hit"], n
        assert again[n]["text"] == first[n]["text"]
    assert httpx.get(server.url + "/debug/integrity", headers=ADMIN).json()["ok"]


def test_flush_reaches_every_replica(server):
    assert httpx.post(server.url + "/flush_cache", headers=ADMIN).json() == {"flushed": True}
    stats = httpx.get(server.url + "/debug/stats", headers=ADMIN).json()
    assert [r["encoder_cache_entries"] for r in stats["replicas"]] == [0, 0]


def test_stats_report_the_true_tp_and_dp_size(server):
    stats = httpx.get(server.url + "/debug/stats", headers=ADMIN).json()
    assert stats["tp_size"] == 1 and stats["dp_size"] == 2  # tp_size was summed: 2
    assert stats["tp_devices"] == ["cpu", "cpu"]


def test_another_users_prompt_gives_no_routing_signal(server):
    """Bob sends the source alice sent: no replica field, no affinity counted, no cache hit;
    alice's own repeat is routed by her affinity."""
    def routed() -> tuple[int, int]:
        router = httpx.get(server.url + "/debug/stats", headers=ADMIN).json()["router"]
        return sum(router["routed_affinity"]), sum(router["routed_least_loaded"])

    def send(user: str, headers=None) -> dict:
        r = httpx.post(server.url + "/generate", headers=headers, timeout=60, json={
            "text": _prompt(POOL[240]), "user": user,
            "sampling_params": {"max_new_tokens": 40, "temperature": 0}})
        assert r.status_code == 200, r.text
        return r.json()["meta_info"]

    alice = send("alice")
    assert "replica" not in alice and not alice["encoder_cache_hit"]
    before = routed()
    bob = send("bob")
    assert "replica" not in bob and not bob["encoder_cache_hit"] and bob["cached_tokens"] == 0
    assert routed() == (before[0], before[1] + 1)  # by load, as a source nobody sent
    assert send("alice")["encoder_cache_hit"]
    assert routed() == (before[0] + 1, before[1] + 1)  # alice's own affinity
    assert "replica" in send("carol", headers=ADMIN)  # the admin sees where it ran
    assert httpx.get(server.url + "/debug/stats").status_code == 403


def test_one_replica_runs_as_before():
    me = psutil.Process()
    before = {p.pid for p in me.children()}
    with Seq2SeqEngine(model_path=DEMO, device="cpu", max_total_tokens=4096,
                       max_cross_tokens=4096) as engine:
        started = [p for p in me.children() if p.pid not in before]
        assert len(started) == 2  # one scheduler, one detokenizer: no router process
        assert len(engine.procs.schedulers) == 1
        assert engine.tokenizer_manager.link.router is None
        out = engine.generate(prompt=_prompt(42), sampling_params={"max_new_tokens": 20,
                                                                   "temperature": 0})
        assert out["text"] == "forty-two" and "replica" not in out["meta_info"]
        stats = engine.stats()
        assert "replicas" not in stats and stats["layout"]["dp_size"] == 1


def test_a_repeated_image_goes_to_the_replica_that_cached_it(tmp_path):
    model = str(write_mllama_checkpoint(tmp_path / "mllama", seed=3))
    images = [random_image(i, 28 + 10 * i, 40) for i in range(4)]
    greedy = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
    with Seq2SeqEngine(model_path=model, device="cpu", dp_size=2, max_total_tokens=4096,
                       max_cross_tokens=4096) as engine:
        # one call of four images: routed one by one, so both replicas get some
        first = engine.generate(prompt=["<|image|>Describe"] * 4,
                                image_data=[[im] for im in images], sampling_params=greedy)
        assert {o["meta_info"]["replica"] for o in first} == {0, 1}
        order = [2, 0, 3, 1]
        again = engine.generate(prompt=["<|image|>Describe"] * 4,
                                image_data=[[images[i]] for i in order], sampling_params=greedy)
        for i, o in zip(order, again):
            assert o["meta_info"]["encoder_cache_hit"]
            assert o["meta_info"]["replica"] == first[i]["meta_info"]["replica"]
            assert o["output_ids"] == first[i]["output_ids"]
        engine.check_integrity()


def test_a_dead_replica_is_reported_and_ends_the_server(server):
    """Last: kills replica 1's scheduler under load."""
    srv = server
    victims = _schedulers(srv)
    assert len(victims) == 2
    others = [p for p in srv.children() if p not in victims]
    statuses: list = []

    def load():
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            for i in range(100):
                try:
                    r = c.post("/v1/completions", json={
                        "prompt": _prompt(i), "max_tokens": 400, "ignore_eos": True})
                except httpx.HTTPError:
                    statuses.append("closed")
                    return
                statuses.append(r.status_code)
                if r.status_code == 503:
                    err = r.json()["error"]
                    assert err["type"] == "service_unavailable", err
                    assert "scheduler process of replica 1" in err["message"], err

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.5)  # requests running on both replicas
    os.kill(victims[1], signal.SIGKILL)
    start = time.monotonic()
    code = srv.proc.wait(timeout=15)
    took = time.monotonic() - start
    for t in threads:
        t.join(timeout=30)
    assert code != 0 and took < 10
    assert "scheduler process of replica 1" in srv.output() and "died" in srv.output()
    assert statuses.count(503) >= 1  # in-flight requests failed cleanly
    assert set(statuses) <= {200, 503, "closed"}
    time.sleep(0.5)
    assert not [p for p in [victims[0], *others] if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
