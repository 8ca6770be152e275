"""Grammars compile off the scheduler's loop (issue 41): a request with a new grammar waits
for its compile thread while the running batch keeps decoding; it then runs to a valid
output; a bad grammar ends its request with the error; an abort while it compiles leaves
nothing behind; a compiled grammar is taken from the cache at once. A tiny random Llama with
the real Llama 3 tokenizer."""

from __future__ import annotations

import json
import threading

import pytest

from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.scheduler.grammar_rows import Grammars
from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint
from seq2serve.tests.helpers import make_scheduler

SCHEMA = json.dumps({"type": "object", "properties": {"n": {"type": "integer", "maximum": 99}},
                     "required": ["n"], "additionalProperties": False})


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> str:
    return str(write_llama_checkpoint(tmp_path_factory.mktemp("llama") / "compiles",
                                      init_scale=10.0, seed=1))


def _add(s, rid: str, **params) -> None:
    sp = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": 24, **params})
    s.add_request(TokenizedRequest(rid=rid, encoder_input_ids=[],
                                   decoder_input_ids=s.tokenizer.encode("JSON:"),
                                   sampling_params=sp, stream=True))


def _held_compiles(monkeypatch) -> threading.Event:
    """Compiles wait for the returned event before they start."""
    go = threading.Event()
    row = Grammars.row

    def held(self, sp):
        assert go.wait(60), "the test never released the compile"
        return row(self, sp)

    monkeypatch.setattr(Grammars, "row", held)
    return go


def _step(s, out: dict, errors: dict) -> None:
    for o in s.step():
        out.setdefault(o.rid, []).extend(o.new_token_ids)
        if o.error is not None:
            errors[o.rid] = o.error


def test_the_batch_decodes_while_a_grammar_compiles(llama_dir, monkeypatch):
    s = make_scheduler(llama_dir)
    go = _held_compiles(monkeypatch)
    out, errors = {}, {}
    _add(s, "free", ignore_eos=True)
    _step(s, out, errors)
    _add(s, "json", json_schema=SCHEMA)  # returns at once: the compile is held
    assert s.stats()["grammar_compiling"] == 1
    for _ in range(6):
        _step(s, out, errors)
    assert len(out["free"]) >= 5 and "json" not in out  # the batch went on without it
    go.set()
    while s.has_work:
        _step(s, out, errors)
        s.check_integrity()
    assert not errors and len(out["free"]) == 24
    text = s.tokenizer.decode(out["json"], skip_special_tokens=True)
    assert set(json.loads(text)) == {"n"}
    assert s.stats()["grammar_compiling"] == 0

    # compiled now: a second request with it is queued at once, a cache hit
    hits = s.stats()["grammar_cache_hits"]
    _add(s, "again", json_schema=SCHEMA)
    assert s.stats()["grammar_compiling"] == 0 and s.stats()["grammar_cache_hits"] == hits + 1
    while s.has_work:
        _step(s, out, errors)
    assert out["again"] == out["json"]


def test_a_bad_grammar_ends_its_request_with_the_error(llama_dir):
    s = make_scheduler(llama_dir)
    out, errors = {}, {}
    _add(s, "free", ignore_eos=True, max_new_tokens=8)
    _add(s, "bad", regex="[unclosed")
    while s.has_work:
        _step(s, out, errors)
    assert "regex is not valid" in errors["bad"] and out["bad"] == []
    assert len(out["free"]) == 8 and "free" not in errors
    s.check_integrity()


def test_an_abort_while_compiling_leaves_nothing(llama_dir, monkeypatch):
    s = make_scheduler(llama_dir)
    go = _held_compiles(monkeypatch)
    _add(s, "json", json_schema=SCHEMA)
    assert s.find("json") is not None
    aborted = s.abort_request("json")
    assert aborted is not None and aborted.finished_reason["type"] == "abort"
    assert s.find("json") is None and not s.has_work
    go.set()
    s.compiles._pool.shutdown(wait=True)  # the compile ends in the cache, and nothing runs
    assert not s.has_work and s.step() == []
    s.check_integrity()
