"""What an outside probe of the server found (issue 18), each checked against a real server
process: disconnects abort non-streamed requests too, bounded metrics labels, invalid text and
huge prompts refused without stalling the event loop, inputs per request capped."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from seq2serve.runtime.demo_checkpoint import default_demo_path
from seq2serve.tests.server_helpers import ServerProcess

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


def _wait_idle(srv, within: float) -> float:
    """Seconds until nothing runs or waits; fails after `within`."""
    start = time.monotonic()
    while True:
        s = _stats(srv)
        if s["running_requests"] == 0 and s["waiting_requests"] == 0:
            return time.monotonic() - start
        assert time.monotonic() - start < within, s
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
    with httpx.Client(timeout=httpx.Timeout(1.0)) as c:
        if stream:  # read the first event, then hang up
            with c.stream("POST", server.url + path, json={**body, "stream": True},
                          headers=AUTH) as r:
                assert r.status_code == 200
                next(r.iter_bytes())
        else:  # give up waiting
            with pytest.raises(httpx.TimeoutException):
                c.post(server.url + path, json=body, headers=AUTH)
    assert _wait_idle(server, within=1.5) < 1.5


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
