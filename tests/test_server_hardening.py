"""What an outside probe of the server found (issue 18), each checked against a real server
process: disconnects abort non-streamed requests too, bounded metrics labels, invalid text and
huge prompts refused without stalling the event loop, inputs per request capped."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from seq2serve.runtime.tools.demo_checkpoint import default_demo_path
from seq2serve.tests.server_helpers import ServerProcess
from seq2serve.tests.timing import within

DEMO = str(default_demo_path())


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(DEMO, "--api-key", "sekret")
    yield srv
    assert srv.proc.poll() is None, "the server died"
    assert srv.terminate() == 0


AUTH = {"Authorization": "Bearer sekret"}
LONG = 2000  # new tokens: about 10 s of decoding on a 2-core CPU (see test_long_takes_long)


def _stats(srv) -> dict:
    return httpx.get(srv.url + "/debug/stats", headers=AUTH, timeout=10).json()


def _wait_idle(srv, seconds: float) -> float:
    """Seconds until nothing runs or waits; fails after `seconds` (an idle machine's limit,
    scaled by the load: timing.py)."""
    start, limit = time.monotonic(), within(seconds)
    while True:
        s = _stats(srv)
        if s["running_requests"] == 0 and s["waiting_requests"] == 0:
            return time.monotonic() - start
        assert time.monotonic() - start < limit, s
        time.sleep(0.05)


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "translate digits to English: 5", "max_tokens": LONG,
                         "ignore_eos": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "5"}],
                              "max_tokens": LONG, "ignore_eos": True}),
    ("/generate", {"text": "translate digits to English: 5",
                   "sampling_params": {"max_new_tokens": LONG, "ignore_eos": True}}),
    # short answers, but many of them: the batch's members still queued must go too
    ("/v1/translations", {"input": [str(i) for i in range(1000)], "source_lang": "digits",
                          "target_lang": "English"}),
])
@pytest.mark.parametrize("stream", [False, True])
def test_a_disconnect_aborts_the_request_within_a_second(server, path, body, stream):
    """Left alone, each request would run for several seconds more."""
    # streamed: the first event may take a while on a loaded machine (1,000 inputs are
    # tokenized first); the hang-up is what is timed
    timeout = httpx.Timeout(1.0, read=30.0) if stream else httpx.Timeout(1.0)
    with httpx.Client(timeout=timeout) as c:
        if stream:  # read the first event, then hang up
            with c.stream("POST", server.url + path, json={**body, "stream": True},
                          headers=AUTH) as r:
                assert r.status_code == 200
                next(r.iter_bytes())
        else:  # give up waiting
            with pytest.raises(httpx.TimeoutException):
                c.post(server.url + path, json=body, headers=AUTH)
    _wait_idle(server, 1.5)


def test_metrics_label_routes_not_raw_paths(server):
    for _ in range(50):
        httpx.get(f"{server.url}/no/such/{uuid.uuid4().hex}")  # without the key
        httpx.get(f"{server.url}/v1/models/{uuid.uuid4().hex}", headers=AUTH)
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    lines = [ln for ln in text.splitlines() if ln.startswith("seq2serve_requests_total")]
    assert not any("no/such" in ln or "/v1/models/" in ln for ln in lines), lines[:5]
    assert any('endpoint="other"' in ln and 'status="401"' in ln for ln in lines), lines
    assert any('endpoint="other"' in ln and 'status="404"' in ln for ln in lines), lines
    assert len(lines) < 20, lines


@pytest.mark.parametrize("path,body,field", [
    ("/v1/completions", {"prompt": "translate digits to English: \ud800 5"}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x\ud800"}]},
     "messages.0.content"),
    ("/generate", {"text": "\ud800", "stream": True}, "text"),
    ("/v1/translations", {"input": ["5", "\udfff"], "source_lang": "digits",
                          "target_lang": "English"}, "input.1"),
    ("/v1/completions", {"prompt": "5", "stop": ["\ud800"]}, "stop.0"),
])
def test_invalid_unicode_is_a_400_naming_the_field(server, path, body, field):
    import json

    raw = json.dumps(body)  # json.dumps writes a lone surrogate as the escape \\ud800
    r = httpx.post(server.url + path, content=raw, timeout=30,
                   headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert field in message and "invalid Unicode" in message, message


def test_huge_prompts_are_refused_at_once_and_never_stall_the_server(server):
    """A 5 MB prompt is refused by its length in characters before any tokenizing, and
    prompts that do get tokenized are tokenized off the event loop: /health stays quick."""
    import threading

    huge = "translate digits to English: " + "12345 " * 850_000  # 5.1 MB
    start = time.monotonic()
    r = httpx.post(server.url + "/v1/completions", json={"prompt": huge, "max_tokens": 4},
                   headers=AUTH, timeout=60)
    assert r.status_code == 400 and "characters" in r.json()["error"]["message"], r.text
    assert time.monotonic() - start < within(2.0)

    # under the character bound (the demo's 2048 encoder tokens of at most 16 characters):
    # tokenized, then refused by its token count
    big = "5 " * 16_000
    results, health = [], []

    def post():
        results.append(httpx.post(server.url + "/v1/completions", timeout=60, headers=AUTH,
                                  json={"prompt": big, "max_tokens": 4}).status_code)

    threads = [threading.Thread(target=post) for _ in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        t0 = time.monotonic()
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        health.append(time.monotonic() - t0)
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert results == [400] * 4
    # tokenized on the event loop, 16,000 tokens x 4 would hold /health for seconds
    assert max(health) < within(1.0), health


def test_inputs_per_request_are_capped(server):
    body = {"input": ["5"] * 1025, "source_lang": "digits", "target_lang": "English"}
    r = httpx.post(server.url + "/v1/translations", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 400 and "max_batch_inputs" in r.json()["error"]["message"], r.text
    r = httpx.post(server.url + "/v1/completions", headers=AUTH, timeout=30,
                   json={"prompt": ["5"] * 300, "n": 4, "max_tokens": 2})
    assert r.status_code == 400 and "1200 inputs" in r.json()["error"]["message"], r.text
    _wait_idle(server, 2.0)


def test_streams_end_with_an_error_event_when_the_scheduler_dies():
    """Streams in flight when the scheduler dies end with an error event (and [DONE]), not a
    silently closed connection; /health answers 503 until the server is gone."""
    import json
    import os
    import signal
    import threading

    srv = ServerProcess(DEMO)
    try:
        events: dict[int, list[str]] = {}
        started = threading.Barrier(5)

        def stream(i: int) -> None:
            body = {"prompt": f"translate digits to English: {i}", "max_tokens": LONG,
                    "ignore_eos": True, "stream": True}
            got = events.setdefault(i, [])
            with httpx.stream("POST", srv.url + "/v1/completions", json=body,
                              timeout=30) as r:
                lines = r.iter_lines()
                got.append(next(lines))
                started.wait()
                got.extend(ln for ln in lines if ln)

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        started.wait()
        pids = {open(f"/proc/{p}/cmdline", "rb").read(): p for p in srv.children()}
        os.kill(next(p for cmd, p in pids.items() if b"scheduler" in cmd), signal.SIGKILL)
        deadline = time.monotonic() + 2  # the server notices within its watch interval
        while (health := httpx.get(srv.url + "/health", timeout=5)).status_code == 200:
            assert time.monotonic() < deadline, "still healthy"
            time.sleep(0.05)
        for t in threads:
            t.join(30)
        assert health.status_code == 503 and "scheduler" in health.text, health.text
        for i, got in events.items():
            assert got[-1] == "data: [DONE]", got[-3:]
            error = json.loads(got[-2].removeprefix("data: "))["error"]
            assert error["code"] == 503 and "scheduler" in error["message"], error
        assert srv.proc.wait(timeout=15) != 0
    finally:
        srv.kill()


def test_slow_clients_lose_their_connections_and_are_capped():
    """Connections that never finish their headers are closed after --header-timeout, and
    headers past 64 KiB get a 431 at once; past --max-connections a new request gets a 503
    rather than a socket held open."""
    import socket

    srv = ServerProcess(DEMO, "--header-timeout", "1", "--max-connections", "30")
    try:
        host, port = "127.0.0.1", srv.port
        slow = []
        for _ in range(40):
            s = socket.create_connection((host, port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")  # half a header
            slow.append(s)
        time.sleep(0.2)
        assert httpx.get(srv.url + "/health", timeout=5).status_code == 503  # at the cap
        time.sleep(1.5)
        for s in slow:  # the server closed each: a read returns end-of-stream
            s.settimeout(5)
            assert s.recv(1024) == b""
            s.close()
        assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
        # headers that never end, sent fast: refused once past the cap, not read until the
        # deadline; a body larger than that cap is no header and is read
        s = socket.create_connection((host, port))
        s.settimeout(10)
        try:
            for _ in range(40):
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 4096)
        except OSError:  # the server closed it while we were still sending
            pass
        assert s.recv(64).startswith(b"HTTP/1.1 431 "), "headers past the cap are refused"
        s.close()
        r = httpx.post(srv.url + "/v1/completions", timeout=30,
                       content=b'{"prompt": "translate digits to English: 7", "max_tokens": 8}'
                       + b" " * 200_000, headers={"Content-Type": "application/json"})
        assert r.status_code == 200, r.text
    finally:
        srv.kill()


def test_sigterm_drains_running_requests_and_answers_503():
    """SIGTERM with a request running: /health and new requests get 503 naming the shutdown,
    the running request still gets its whole answer, and the server then exits 0."""
    import signal
    import threading

    srv = ServerProcess(DEMO, "--shutdown-grace", "60")
    try:
        result = {}

        def long_request() -> None:
            result["r"] = httpx.post(srv.url + "/v1/completions", timeout=60, json={
                "prompt": "translate digits to English: 5", "max_tokens": 300,
                "ignore_eos": True})

        t = threading.Thread(target=long_request)
        t.start()
        while httpx.get(srv.url + "/debug/stats", timeout=5).json()["running_requests"] == 0:
            time.sleep(0.02)
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        health = httpx.get(srv.url + "/health", timeout=5)
        assert health.status_code == 503 and "shutting down" in health.text, health.text
        refused = httpx.post(srv.url + "/v1/completions", timeout=10, json={
            "prompt": "translate digits to English: 7", "max_tokens": 4})
        assert refused.status_code == 503 and "shutting down" in refused.text, refused.text
        t.join(60)
        r = result["r"]
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 300, r.text
        assert srv.proc.wait(timeout=15) == 0
    finally:
        srv.kill()
