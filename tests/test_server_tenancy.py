"""What an outside probe found across tenants (issue 39, third round), each checked against a
real `seq2serve serve` process: rids are per user, the control routes are the admin's, and
the caches are per user by default. Data-parallel routing: tests/test_data_parallel.py."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from seq2serve.runtime.tools.demo_checkpoint import default_demo_path
from seq2serve.tests.server_helpers import ServerProcess

DEMO = str(default_demo_path())
AUTH = {"Authorization": "Bearer sekret"}
ADMIN = {"Authorization": "bearer boss"}  # the scheme in any case (RFC 7235)
LONG = 2000  # new tokens: about 10 s of decoding on a 2-core CPU


@pytest.fixture(scope="module")
def server():
    # no --cache-isolation: the default is tested too
    srv = ServerProcess(DEMO, "--api-key", "sekret", "--admin-api-key", "boss")
    yield srv
    assert srv.proc.poll() is None, "the server died"
    assert srv.terminate() == 0


def _generate(srv, **body) -> httpx.Response:
    body.setdefault("text", "translate digits to English: 42")
    body.setdefault("sampling_params", {"max_new_tokens": 8, "temperature": 0})
    return httpx.post(srv.url + "/generate", json=body, headers=AUTH, timeout=60)


CONTROL = [("post", "/flush_cache"), ("get", "/debug/stats"), ("get", "/debug/integrity"),
           ("get", "/metrics")]


@pytest.mark.parametrize("method,path", CONTROL)
def test_control_routes_need_the_admin_key(server, method, path):
    plain = httpx.request(method, server.url + path, headers=AUTH)
    assert plain.status_code == 403, plain.text
    assert "admin API key" in plain.json()["error"]["message"]
    assert httpx.request(method, server.url + path).status_code == 401
    assert httpx.request(method, server.url + path, headers=ADMIN).status_code == 200
    upper = {"Authorization": "BEARER boss"}
    assert httpx.request(method, server.url + path, headers=upper).status_code == 200


def test_the_admin_key_opens_the_model_routes_and_the_scheme_is_case_insensitive(server):
    for headers in (ADMIN, {"Authorization": "bearer sekret"}, {"Authorization": "BEARER sekret"}):
        assert httpx.get(server.url + "/v1/models", headers=headers).status_code == 200
    assert httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer boss!"}
                     ).status_code == 401


def _events(response):
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def test_rids_are_per_user(server):
    """Bob can neither abort alice's `job-1` nor learn that it runs; she can abort it."""
    body = {"text": "translate digits to English: 7", "rid": "job-1", "user": "alice",
            "stream": True, "sampling_params": {"max_new_tokens": LONG, "ignore_eos": True}}
    with httpx.Client(timeout=60) as c, c.stream("POST", server.url + "/generate", json=body,
                                                 headers=AUTH) as stream:
        assert stream.status_code == 200
        events = _events(stream)
        assert next(events)["meta_info"]["id"] == "job-1"
        # the same rid from another user runs (no "rid must be unique"); from alice it does not
        assert _generate(server, rid="job-1", user="bob").status_code == 200
        again = _generate(server, rid="job-1", user="alice")
        assert again.status_code == 400 and "unique" in again.text
        # bob aborts "his" job-1 (and the anonymous user's): alice's stream goes on
        for user in ("bob", None):
            r = httpx.post(server.url + "/abort_request", json={"rid": "job-1", "user": user},
                           headers=AUTH)
            assert r.status_code == 200
        until = time.monotonic() + 1.0
        for event in events:
            assert event["meta_info"]["finish_reason"] is None, event
            if time.monotonic() > until:
                break
        r = httpx.post(server.url + "/abort_request", json={"rid": "job-1", "user": "alice"},
                       headers=AUTH)
        assert r.status_code == 200
        last = None
        for last in events:
            pass
        assert last["meta_info"]["finish_reason"]["type"] == "abort", last
        assert last["meta_info"]["completion_tokens"] < LONG


def test_caches_are_per_user_by_default(server):
    def meta(user):
        r = _generate(server, text="translate digits to English: 31337", user=user)
        assert r.status_code == 200, r.text
        return r.json()["meta_info"]

    assert not meta("alice")["encoder_cache_hit"]
    bob = meta("bob")
    assert not bob["encoder_cache_hit"] and bob["cached_tokens"] == 0
    assert meta("alice")["encoder_cache_hit"]
    assert not meta(None)["encoder_cache_hit"]  # the anonymous user: one namespace of its own
    assert meta(None)["encoder_cache_hit"]
    assert "replica" not in bob  # (one replica: never a replica field)


def test_concurrent_same_rid_from_two_users_both_finish(server):
    results: dict[str, httpx.Response] = {}

    def run(user):
        results[user] = _generate(server, rid="shared-rid", user=user,
                                  sampling_params={"max_new_tokens": 200, "ignore_eos": True})

    threads = [threading.Thread(target=run, args=(u,)) for u in ("carol", "dave")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for user in ("carol", "dave"):
        out = results[user].json()
        assert results[user].status_code == 200, out
        assert out["meta_info"]["id"] == "shared-rid"
        assert out["meta_info"]["completion_tokens"] == 200
