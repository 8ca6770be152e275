"""Issue 39 (third round), items 2-5, 7, 9: what a request may cost the server, checked
against a real `seq2serve serve` process (demo model, CPU)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from seq2serve.runtime.tools.demo_checkpoint import default_demo_path
from seq2serve.tests.server_helpers import ServerProcess
from seq2serve.tests.timing import within

DEMO = str(default_demo_path())


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(DEMO)
    yield srv
    assert srv.proc.poll() is None, "the server died"
    assert srv.terminate() == 0


def _post(srv, path, body, timeout=60):
    return httpx.post(srv.url + path, json=body, timeout=timeout)


def _refused(r, *words):
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert all(w in message for w in words), message


def test_stop_strings_are_capped_by_total_length(server):
    """Item 2: 16 stop strings of 10,000 characters are refused naming max_stop_chars."""
    r = _post(server, "/v1/completions", {"prompt": "translate digits to English: 5",
                                          "stop": ["x" * 10_000 + str(i) for i in range(16)]})
    _refused(r, "max_stop_chars", "160022 characters")
    r = _post(server, "/v1/completions", {"prompt": "translate digits to English: 5",
                                          "stop": ["x" * 1000], "max_tokens": 4})
    assert r.status_code == 200, r.text


def test_tokenize_is_capped_and_off_the_event_loop(server):
    """Item 3: more texts than max_batch_inputs are refused; texts that are tokenized do not
    stall /health."""
    _refused(_post(server, "/tokenize", {"prompt": ["5"] * 1025}), "max_batch_inputs")
    _refused(_post(server, "/tokenize", {"prompt": "5 " * 20_000,
                                         "add_special_tokens": False}), "characters")
    health = _health_while(server, [("/tokenize", {"prompt": ["12345 " * 500] * 1000})] * 2)
    assert max(health) < within(1.0), health


def _health_while(srv, requests) -> list[float]:
    """/health latencies (s) while `requests` ([(path, body)]) run, each on its thread."""
    raws = [(path, json.dumps(body).encode()) for path, body in requests]
    done = []

    def send(path, raw):
        r = httpx.post(srv.url + path, content=raw, timeout=120,
                       headers={"Content-Type": "application/json"})
        done.append(r.status_code)

    threads = [threading.Thread(target=send, args=pr) for pr in raws]
    for t in threads:
        t.start()
    health = []
    while any(t.is_alive() for t in threads):
        t0 = time.monotonic()
        assert httpx.get(srv.url + "/health", timeout=30).status_code == 200
        health.append(time.monotonic() - t0)
        time.sleep(0.01)
    for t in threads:
        t.join()
    assert len(done) == len(requests), done
    return health


def test_large_bodies_never_stall_the_event_loop(server):
    """Item 4: bodies under the size cap that take seconds to parse and validate are parsed
    off the event loop and refused; /health stays responsive with 8 of them in flight."""
    bias = {"logit_bias": {str(i): 1.0 for i in range(150_000)},
            "prompt": "translate digits to English: 5"}
    chat = {"messages": [{"role": "user", "content": "5"}] * 50_000}
    ids = {"input_ids": [[5]] * 150_000}
    r = _post(server, "/v1/completions", bias)
    _refused(r, "logit_bias", "max_batch_inputs")
    _refused(_post(server, "/v1/chat/completions", chat), "messages", "max_batch_inputs")
    _refused(_post(server, "/generate", ids), "input_ids", "max_batch_inputs")
    load = [("/v1/completions", bias), ("/v1/chat/completions", chat), ("/generate", ids),
            ("/v1/translations", {"input": ["5"] * 100_000, "source_lang": "digits",
                                  "target_lang": "English"})] * 2
    health = sorted(_health_while(server, load))
    p99 = health[int(0.99 * (len(health) - 1))]
    print(f"/health with 8 large bodies in flight: {len(health)} probes, median "
          f"{health[len(health) // 2] * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms, "
          f"max {health[-1] * 1e3:.0f} ms")
    assert health[-1] < within(1.0), health[-5:]
    # a large body that is fine is still served
    r = _post(server, "/v1/completions", {"prompt": ["translate digits to English: 5 "
                                                     + "6 " * 100] * 200, "max_tokens": 1})
    assert r.status_code == 200 and len(r.json()["choices"]) == 200, r.text[:300]


def test_beams_count_as_rows(server):
    """Item 5: prompts x num_beams counts against max_batch_inputs, as prompts x n does."""
    r = _post(server, "/generate", {"text": ["5"] * 1024,
                                    "sampling_params": {"num_beams": 32, "max_new_tokens": 2}})
    _refused(r, "32768 inputs", "num_beams", "max_batch_inputs")
    r = _post(server, "/v1/completions", {"prompt": ["5"] * 300, "num_beams": 4,
                                          "max_tokens": 2})
    _refused(r, "1200 inputs", "max_batch_inputs")


@pytest.mark.parametrize("field,value", [("n", 2), ("num_return_sequences", 2),
                                         ("logprobs", True), ("best_of", 2),
                                         ("frequency_penalty", 1.0)])
def test_translations_refuse_what_they_cannot_honour(server, field, value):
    """Item 7: no field is silently ignored."""
    body = {"input": "5", "source_lang": "digits", "target_lang": "English", field: value}
    r = _post(server, "/v1/translations", body)
    _refused(r, field)


def test_translations_honour_stop_seed_and_top_p(server):
    base = {"input": "7 3", "source_lang": "digits", "target_lang": "English",
            "max_tokens": 8}
    full = _post(server, "/v1/translations", base).json()["data"][0]["translation"]
    word = full.split()[-1]
    cut = _post(server, "/v1/translations", {**base, "stop": [word]}).json()["data"][0]
    assert cut["translation"] == full[:full.index(word)] and word not in cut["translation"]
    sampled = [_post(server, "/v1/translations", {**base, "temperature": 1.0, "top_p": 0.9,
                                                  "seed": 7}).json()["data"][0]["translation"]
               for _ in range(2)]
    assert sampled[0] == sampled[1]
