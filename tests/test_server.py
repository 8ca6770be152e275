"""The HTTP server, driven by the real `openai` client and by raw HTTP, on loopback."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from seq2serve import Seq2SeqEngine
from seq2serve.tests.helpers import SOURCES
from seq2serve.tests.server_helpers import ServerProcess

GREEDY = {"max_tokens": 10, "temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def server(t5_dir):
    srv = ServerProcess(t5_dir, "--max-total-tokens", "16384", "--max-cross-tokens", "16384")
    yield srv
    try:
        assert httpx.get(srv.url + "/debug/integrity").json()["ok"]
        children = srv.all_children()
        start = time.monotonic()
        assert srv.terminate() == 0, srv.output()  # SIGTERM: clean exit 0
        assert time.monotonic() - start < 15
        time.sleep(0.5)
        for pid in children:  # no orphans left behind
            with pytest.raises(ProcessLookupError):
                import os
                os.kill(pid, 0)
    finally:
        srv.kill()


@pytest.fixture(scope="module")
def engine(t5_dir):
    with Seq2SeqEngine(model_path=t5_dir, device="cpu") as e:
        yield e


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


@pytest.fixture(scope="module")
def model_name(client):
    return client.models.list().data[0].id


def test_completion_equals_the_engine(client, model_name, engine):
    r = client.completions.create(model=model_name, prompt=SOURCES[0], **GREEDY)
    ref = engine.generate(prompt=SOURCES[0], sampling_params={
        "max_new_tokens": 10, "temperature": 0, "ignore_eos": True})
    assert r.choices[0].text == ref["text"]
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 10
    assert r.usage.prompt_tokens == ref["meta_info"]["prompt_tokens"]


def test_chat_equals_the_engine(client, model_name, engine):
    messages = [{"role": "user", "content": SOURCES[1]}]
    r = client.chat.completions.create(model=model_name, messages=messages, **GREEDY)
    ref = engine.chat(messages, sampling_params={"max_new_tokens": 10, "temperature": 0,
                                                 "ignore_eos": True})
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref["text"]


def test_streams_concatenate_to_the_whole(client, model_name):
    whole = client.completions.create(model=model_name, prompt=SOURCES[3], **GREEDY)
    pieces = [c.choices[0].text for c in client.completions.create(
        model=model_name, prompt=SOURCES[3], stream=True, **GREEDY) if c.choices]
    assert "".join(pieces) == whole.choices[0].text
    messages = [{"role": "user", "content": SOURCES[4]}]
    chat = client.chat.completions.create(model=model_name, messages=messages, **GREEDY)
    deltas = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model_name, messages=messages, stream=True,
        stream_options={"include_usage": True}, **GREEDY) if c.choices]
    assert "".join(deltas) == chat.choices[0].message.content


def test_n_samples_and_usage(client, model_name):
    r = client.completions.create(model=model_name, prompt=SOURCES[2], n=2, max_tokens=8,
                                  temperature=1.5, seed=7, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].text != r.choices[1].text
    assert r.usage.completion_tokens == 16
    chat = client.chat.completions.create(model=model_name, n=2, max_tokens=4, seed=1,
                                          messages=[{"role": "user", "content": "hi"}])
    assert len(chat.choices) == 2


def test_logprobs(client, model_name):
    r = client.completions.create(model=model_name, prompt=SOURCES[5], logprobs=3, **GREEDY)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 10
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert len(top) <= 3 and abs(max(top.values()) - chosen) < 1e-5  # greedy: the best
    c = client.chat.completions.create(model=model_name, logprobs=True, top_logprobs=2,
                                       messages=[{"role": "user", "content": SOURCES[5]}],
                                       **GREEDY)
    content = c.choices[0].logprobs.content
    assert len(content) == 10 and all(len(t.top_logprobs) == 2 for t in content)
    assert all(t.logprob <= 0 for t in content)


def test_native_generate_and_translations(server, engine):
    body = {"text": SOURCES[0], "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    r = httpx.post(server.url + "/generate", json=body).json()
    ref = engine.generate(prompt=SOURCES[0], sampling_params=body["sampling_params"])
    assert r["output_ids"] == ref["output_ids"] and r["text"] == ref["text"]
    with httpx.stream("POST", server.url + "/generate", json={**body, "stream": True}) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines()
                  if line.startswith("data: {")]
    assert events[-1]["text"] == ref["text"]  # SGLang style: text so far in each event
    t = httpx.post(server.url + "/v1/translations", json={
        "input": ["The house is wonderful.", "Good morning"], "source_lang": "English",
        "target_lang": "German", "max_tokens": 6}).json()
    assert t["object"] == "translation" and [d["index"] for d in t["data"]] == [0, 1]
    ref = engine.translate(["The house is wonderful.", "Good morning"], "English", "German",
                           sampling_params={"max_new_tokens": 6, "temperature": 0})
    assert [d["translation"] for d in t["data"]] == [x["text"] for x in ref]
    assert t["usage"]["completion_tokens"] == sum(x["meta_info"]["completion_tokens"]
                                                  for x in ref)


def test_operational_endpoints(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    metrics = httpx.get(server.url + "/metrics").text
    for name in ("seq2serve_requests_total", "seq2serve_prompt_tokens_total",
                 "seq2serve_generation_tokens_total", "seq2serve_num_running_reqs",
                 "seq2serve_num_waiting_reqs", "seq2serve_time_to_first_token_seconds_bucket",
                 "seq2serve_inter_token_latency_seconds_bucket", "seq2serve_kv_cache_usage",
                 "seq2serve_cross_kv_cache_usage"):
        assert name in metrics, name
    assert httpx.post(server.url + "/flush_cache").json() == {"flushed": True}
    assert httpx.post(server.url + "/abort_request", json={"rid": "nope"}).status_code == 200


BAD = [
    ("/v1/completions", {"prompt": "x", "max_tokens": "abc"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "temperature": 5}, 400, "temperature"),
    ("/v1/completions", {"max_tokens": 5}, 400, "prompt"),
    ("/v1/completions", "{\"prompt\": ", 400, "malformed JSON"),
    ("/v1/completions", "[1, 2]", 400, "object"),
    ("/v1/completions", {"prompt": "word " * 5000}, 400, "longer than"),
    ("/v1/completions", {"prompt": []}, 400, "empty"),
    ("/v1/completions", {"prompt": "x", "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": "x", "n": 17}, 400, "max_n"),  # the server's limit (16)
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 17}, 400,
     "max_n"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 100000}, 400, "max_new_tokens"),
    ("/v1/completions", {"prompt": "x", "stop": 5}, 400, "stop"),
    ("/v1/completions", {"prompt": "x", "top_k": -7}, 400, "top_k"),
    ("/v1/completions", {"prompt": "x", "model": "nope"}, 404, "not found"),
    ("/v1/completions", {"prompt": "x", "echo": True}, 400, "echo"),
    ("/v1/completions", {"prompt": [1, 2, 99999999]}, 400, "outside"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ("/v1/chat/completions", {}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "stream": True, "max_tokens": 0}, 400, "max_tokens"),
    ("/generate", {"text": "x", "sampling_params": {"foo": 1}}, 400, "foo"),
    ("/generate", {"text": "x", "stream": True, "sampling_params": {"top_p": 3}}, 400, "top_p"),
    ("/generate", {"input_ids": [1, 99999999]}, 400, "outside"),
    ("/generate", {}, 400, "exactly one"),
    ("/v1/translations", {"input": [], "source_lang": "a", "target_lang": "b"}, 400, "input"),
    ("/v1/translations", {"input": "x", "source_lang": "English"}, 400, "target_lang"),
    ("/abort_request", {}, 400, "rid"),
]


@pytest.mark.parametrize("path, body, status, needle", BAD)
def test_bad_input_gets_a_4xx_naming_the_problem(server, path, body, status, needle):
    if isinstance(body, str):
        r = httpx.post(server.url + path, content=body,
                       headers={"content-type": "application/json"})
    else:
        r = httpx.post(server.url + path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] or needle == err.get("param"), err
    ok = httpx.post(server.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 3})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


def test_32_concurrent_requests_with_aborts(server, model_name):
    async def full_stream(c: httpx.AsyncClient, i: int) -> str:
        text = ""
        async with c.stream("POST", "/v1/completions", json={
                "prompt": SOURCES[i % 8], "max_tokens": 6 + i % 5, "stream": True,
                "temperature": 0, "ignore_eos": True}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    text += json.loads(line[6:])["choices"][0]["text"]
                elif line == "data: [DONE]":
                    return "done"
        raise AssertionError("stream ended without [DONE]")

    async def whole(c: httpx.AsyncClient, i: int) -> str:
        path = "/v1/completions" if i % 2 else "/v1/chat/completions"
        body = ({"prompt": SOURCES[i % 8]} if i % 2 else
                {"messages": [{"role": "user", "content": SOURCES[i % 8]}]})
        r = await c.post(path, json={**body, "max_tokens": 4 + i % 7, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == "length"
        return "done"

    async def aborted(c: httpx.AsyncClient, i: int) -> str:
        async with c.stream("POST", "/v1/completions", json={
                "prompt": SOURCES[i % 8], "max_tokens": 1500, "stream": True,
                "ignore_eos": True}) as r:
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("data: {")
                if seen == 3:
                    return "aborted"  # leaving the block disconnects mid-stream
        raise AssertionError("stream ended early")

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            jobs = [(full_stream, whole, aborted, whole)[i % 4](c, i) for i in range(32)]
            return await asyncio.gather(*jobs)

    results = asyncio.run(main())
    assert results.count("aborted") == 8 and results.count("done") == 24
    deadline = time.monotonic() + 10  # aborted requests (1500 tokens) must stop early
    while time.monotonic() < deadline:
        stats = httpx.get(server.url + "/debug/stats").json()
        if stats["running_requests"] == 0 and stats["waiting_requests"] == 0:
            break
        time.sleep(0.1)
    assert stats["running_requests"] == 0 and stats["waiting_requests"] == 0
    assert httpx.get(server.url + "/debug/integrity").json()["ok"]


def test_api_key(t5_dir):
    srv = ServerProcess(t5_dir, "--api-key", "s3cret")
    try:
        assert httpx.get(srv.url + "/health").status_code == 200
        key = {"Authorization": "Bearer s3cret"}
        schema = httpx.get(srv.url + "/openapi.json", headers=key).json()
        routes = [(method, path) for path, ops in schema["paths"].items() for method in ops]
        assert len(routes) >= 11
        for method, path in routes + [("get", "/openapi.json"), ("get", "/docs")]:
            for headers in ({}, {"Authorization": "Bearer s3cre"}, {"Authorization": "s3cret"}):
                r = httpx.request(method, srv.url + path, headers=headers, json={})
                if path == "/health":
                    assert r.status_code == 200
                else:
                    assert r.status_code == 401 and "API key" in r.json()["error"]["message"], \
                        (method, path, headers)
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x"},
                       headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        good = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret")
        assert good.completions.create(model=good.models.list().data[0].id, prompt="hi",
                                       max_tokens=2).choices[0].text is not None
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.url + "/v1", api_key="nope").models.list()
    finally:
        assert srv.terminate() == 0


def test_dead_detokenizer_makes_the_server_exit_nonzero(t5_dir):
    srv = ServerProcess(t5_dir)
    try:
        detok = [p for p in srv.children()
                 if b"detokenizer" in open(f"/proc/{p}/cmdline", "rb").read()]
        assert len(detok) == 1
        import os
        import signal
        os.kill(detok[0], signal.SIGKILL)
        start = time.monotonic()
        code = srv.proc.wait(timeout=10)
        assert code != 0 and time.monotonic() - start < 10
        assert "detokenizer process" in srv.output() and "died" in srv.output()
    finally:
        srv.kill()


def test_cache_reporting_and_flush(server):
    body = {"text": SOURCES[6], "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    first = httpx.post(server.url + "/generate", json=body).json()
    again = httpx.post(server.url + "/generate", json=body).json()
    assert again["meta_info"]["encoder_cache_hit"] and again["output_ids"] == first["output_ids"]
    metrics = httpx.get(server.url + "/metrics").text
    rate = [line for line in metrics.splitlines()
            if line.startswith("seq2serve_encoder_cache_hit_rate ")]
    assert rate and float(rate[0].split()[1]) > 0
    assert "seq2serve_prefix_cache_tokens" in metrics
    assert httpx.post(server.url + "/flush_cache").json() == {"flushed": True}
    stats = httpx.get(server.url + "/debug/stats").json()
    assert stats["encoder_cache_entries"] == 0 and stats["radix_cache_tokens"] == 0
    # the scheduler froze its start-up heap and times the collector's passes (collector.py)
    assert stats["gc_frozen_objects"] > 10_000 and len(stats["gc_pause_max_ms"]) == 3
    after = httpx.post(server.url + "/generate", json=body).json()
    assert not after["meta_info"]["encoder_cache_hit"]


def test_max_n_flag_sets_the_limit(t5_dir):
    srv = ServerProcess(t5_dir, "--max-n", "20")
    try:
        body = {"prompt": "hi", "max_tokens": 2}
        r = httpx.post(srv.url + "/v1/completions", json={**body, "n": 18})
        assert r.status_code == 200 and len(r.json()["choices"]) == 18, r.text
        r = httpx.post(srv.url + "/v1/completions", json={**body, "n": 21})
        assert r.status_code == 400 and "max_n" in r.json()["error"]["message"]
        assert httpx.get(srv.url + "/debug/integrity").json()["ok"]
    finally:
        assert srv.terminate() == 0
