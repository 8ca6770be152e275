"""Beam search in the frontend: requests (one per prompt, k result rids), the HTTP API's
options and its 400s, and translations' default beam count from generation_config.json; and
two end-to-end runs through a server (its beam search itself is checked against HF in
test_beam_search.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import httpx
import openai
import pytest

from seq2serve import Seq2SeqEngine
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.server_args import RequestLimits
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.frontend.generate_request import GenerateReqInput
from seq2serve.runtime.frontend.openai_protocol import TranslationRequest
from seq2serve.runtime.frontend.openai_serving import OpenAIServing
from seq2serve.runtime.frontend.prompts import translation_prompt
from seq2serve.runtime.frontend.request_ids import client_rid, scoped_rid
from seq2serve.runtime.frontend.scheduler_link import SchedulerLink
from seq2serve.runtime.frontend.tokenizer_manager import TokenizerManager
from seq2serve.runtime.frontend.translation import default_num_beams, with_beams
from seq2serve.runtime.messages.io_struct import AbortRequest, TokenizedRequest, TokenOutput
from seq2serve.tests.helpers import SOURCES, T5_CONFIGS, make_t5
from seq2serve.tests.server_helpers import ServerProcess

MODEL_BEAMS = 3  # the test model's generation_config.json num_beams
BEAMS = {"num_beams": 4, "num_return_sequences": 2, "max_new_tokens": 6}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = make_t5(Path(tmp_path_factory.mktemp("beam-frontend")) / "t5",
                   **T5_CONFIGS["t5_relu_untied"])
    (path / "generation_config.json").write_text(json.dumps({"num_beams": MODEL_BEAMS}))
    return str(path)


@pytest.fixture(scope="module")
def server(model_dir):
    srv = ServerProcess(model_dir)
    yield srv
    try:
        assert httpx.get(srv.url + "/debug/integrity").json()["ok"]
        assert srv.terminate() == 0, srv.output()
    finally:
        srv.kill()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


@pytest.fixture(scope="module")
def engine(model_dir):
    with Seq2SeqEngine(model_path=model_dir, device="cpu") as e:
        yield e


def tokenizer_manager(path: str, **limits) -> TokenizerManager:
    """A TokenizerManager with no runtime behind it: enough to tokenize."""
    config = ModelConfig.from_path(path)
    info = {"is_encoder_decoder": True, "vocab_size": config.vocab_size,
            "input_vocab_size": config.vocab_size,
            "decoder_start_token_id": config.arch.decoder_start_token_id,
            "context_length": 512, "max_encoder_len": 512, "kv_capacity_tokens": 4096,
            "cross_capacity_tokens": 4096}
    return TokenizerManager(None, load_tokenizer(path), info, path,
                            limits=RequestLimits(**limits))


# --- requests ----------------------------------------------------------------------------------
def test_a_beam_search_is_one_request_per_prompt_with_k_result_rids(model_dir):
    tm = tokenizer_manager(model_dir)
    _, reqs = tm.tokenize(GenerateReqInput(text=SOURCES[:2], rid=["a", "b"],
                                           sampling_params=BEAMS))
    # the runtime's rids: the client's under its (here anonymous) user
    assert [client_rid(r.rid) for r in reqs] == ["a-0", "b-0"]
    assert [r.beam_rids for r in reqs] == [[_rid("a-0"), _rid("a-1")], [_rid("b-0"), _rid("b-1")]]
    assert all(r.sampling_params.num_beams == 4 for r in reqs)
    _, [one] = tm.tokenize(GenerateReqInput(text=SOURCES[0], rid="c",
                                            sampling_params={"num_beams": 3}))
    assert one.rid == _rid("c") and one.beam_rids is None and one.result_rids == [_rid("c")]


def test_k_results_count_against_max_batch_inputs(model_dir):
    tm = tokenizer_manager(model_dir, max_batch_inputs=3)
    # rows: 2 prompts x 4 beams (the 2 results each ask no more than the beams)
    with pytest.raises(ValueError, match="8 inputs .*max_batch_inputs"):
        tm.tokenize(GenerateReqInput(text=SOURCES[:2], sampling_params=BEAMS))


@pytest.mark.parametrize("field", ["stream", "return_logprob"])
def test_stream_and_logprobs_are_refused_with_beams(model_dir, field):
    tm = tokenizer_manager(model_dir)
    with pytest.raises(ValueError, match=f"{field} cannot be combined with num_beams > 1"):
        tm.tokenize(GenerateReqInput(text=SOURCES[0], sampling_params=BEAMS, **{field: True}))


def _rid(rid: str) -> str:
    return scoped_rid(None, rid)


class _Wire:
    """The scheduler's socket: records what is sent; `answer` replies to each request with
    one final output per result rid (the detokenizer's text filled in)."""

    def __init__(self, tm: TokenizerManager, answer: bool) -> None:
        self.tm, self.answer, self.sent = tm, answer, []

    def send_pyobj(self, msg) -> None:
        for m in msg if isinstance(msg, list) else [msg]:  # a list: one call's requests
            self.sent.append(m)
            if self.answer and isinstance(m, TokenizedRequest):
                for j, rid in enumerate(m.result_rids):
                    self.tm.states[rid].queue.put_nowait(TokenOutput(
                        rid=rid, new_token_ids=[7, j], finished_reason={"type": "length"},
                        completion_tokens=2, extra={"beam_score": -1.0 - j},
                        text=f"text of {rid}"))


def _wired(model_dir: str, answer: bool) -> tuple[TokenizerManager, _Wire, list]:
    tm = tokenizer_manager(model_dir)
    tm._started = True
    wire = _Wire(tm, answer)
    tm.link = SchedulerLink.over([wire])
    released = []
    tm._release = released.append
    return tm, wire, released


def test_generate_sends_each_request_once_and_returns_k_results_per_prompt(model_dir):
    tm, wire, released = _wired(model_dir, answer=True)
    obj = GenerateReqInput(text=SOURCES[:2], rid=["a", "b"], sampling_params=BEAMS)

    async def run():
        return [r async for r in tm.generate(obj)]

    results = asyncio.run(run())
    assert [type(m) for m in wire.sent] == [TokenizedRequest, TokenizedRequest]  # no aborts
    assert released == wire.sent  # pixel-store entries: once per request sent
    assert [r["text"] for r in results] == [f"text of {_rid(rid)}"
                                            for rid in ("a-0", "a-1", "b-0", "b-1")]
    assert [r["meta_info"]["id"] for r in results] == ["a-0", "a-1", "b-0", "b-1"]
    assert [r["meta_info"]["beam_score"] for r in results] == [-1.0, -2.0, -1.0, -2.0]
    assert not tm.states


def test_leaving_early_aborts_every_unfinished_result(model_dir):
    tm, wire, released = _wired(model_dir, answer=False)
    obj = GenerateReqInput(text=SOURCES[:2], rid=["a", "b"], sampling_params=BEAMS)

    async def run():
        agen = tm.generate(obj)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(agen.__anext__(), 2.0)

    asyncio.run(run())
    aborted = [m.rid for m in wire.sent if isinstance(m, AbortRequest)]
    assert aborted == [_rid(r) for r in ("a-0", "a-1", "b-0", "b-1")] and not tm.states
    assert len(released) == 2


# --- translations' beam count ------------------------------------------------------------------
def test_default_beams_from_generation_config(tmp_path, model_dir, caplog):
    assert default_num_beams(model_dir) == MODEL_BEAMS
    assert default_num_beams(str(tmp_path)) == 1  # no file
    for text in ("{not json", "[4]", '{"num_beams": "four"}', '{"num_beams": 0}'):
        (tmp_path / "generation_config.json").write_text(text)
        with caplog.at_level(logging.WARNING):
            caplog.clear()
            assert default_num_beams(str(tmp_path)) == 1
        assert "generation_config.json" in caplog.text, text
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": 1}')
    assert default_num_beams(str(tmp_path)) == 1


def test_beam_size_and_num_beams_are_one_option():
    assert with_beams({"temperature": 0}, None, 3) == {"temperature": 0, "num_beams": 3}
    assert with_beams(None, 2, 3) == with_beams({"num_beams": 2}, None, 3) == {"num_beams": 2}
    assert with_beams({"num_beams": 2}, 2, 3) == {"num_beams": 2}
    assert with_beams(None, None, 3, stream=True) == {}  # a stream does not wait for beams
    with pytest.raises(ValueError, match=r"beam_size \(2\) and num_beams \(3\) differ"):
        with_beams({"num_beams": 3}, 2, 1)
    with pytest.raises(ValueError, match="stream cannot be combined with beam_size"):
        with_beams(None, 2, 1, stream=True)


class _Recorder:
    """A TokenizerManager that records what it is asked and answers one result per prompt."""

    languages = None  # the TokenizerManager's for a model with a prompt template (T5)
    limits = RequestLimits()
    tokenizer = None  # what detokenizes a target prefix's results (none asked for here)

    def source_token_limit(self, max_new_tokens: int) -> int:  # what a document's pieces fit
        return 512

    def prompt_ids_many(self, texts: list[str]) -> list[list[int]]:
        return [[0] * len(t.split()) for t in texts]

    def __init__(self) -> None:
        self.asked: list[GenerateReqInput] = []

    async def generate(self, obj):
        self.asked.append(obj)
        for _ in obj.input_ids:  # one per source, tokenized by the fake above
            yield {"text": "x", "meta_info": {"finish_reason": {"type": "length"},
                                              "prompt_tokens": 3, "completion_tokens": 1}}


@pytest.mark.parametrize("given, beams", [({}, MODEL_BEAMS), ({"beam_size": 2}, 2),
                                          ({"num_beams": 1}, 1), ({"stream": True}, None)])
def test_translations_take_the_model_default_beams(model_dir, given, beams):
    tm = _Recorder()
    serving = OpenAIServing(tm, "t5", model_dir)
    body = TranslationRequest(input=["a", "b"], source_lang="English", target_lang="German",
                              length_penalty=0.5, **given)

    class Connected:
        async def is_disconnected(self):
            return False

    asyncio.run(serving.translations(body, Connected()))
    sp = tm.asked[0].sampling_params
    assert sp.get("num_beams") == beams and sp["length_penalty"] == 0.5


# --- the HTTP API's 400s -----------------------------------------------------------------------
PROMPT = {"prompt": "x", "max_tokens": 4}
CHAT = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
TRANSLATE = {"input": "x", "source_lang": "English", "target_lang": "German"}
BAD = [
    ("/v1/completions", {**PROMPT, "num_beams": 2, "stream": True}, "stream"),
    ("/v1/completions", {**PROMPT, "num_beams": 2, "logprobs": 1}, "logprobs"),
    ("/v1/chat/completions", {**CHAT, "num_beams": 2, "stream": True}, "stream"),
    ("/v1/chat/completions", {**CHAT, "num_beams": 2, "logprobs": True}, "logprobs"),
    ("/v1/completions", {**PROMPT, "num_beams": 2, "num_return_sequences": 3},
     "num_return_sequences (3) must not exceed num_beams (2)"),
    ("/v1/completions", {**PROMPT, "num_beams": 2, "n": 2}, "n cannot be combined"),
    ("/v1/completions", {**PROMPT, "num_beams": 2, "early_stopping": "sometimes"},
     "early_stopping"),
    ("/v1/completions", {**PROMPT, "num_beams": 99}, "num_beams must be <="),
    ("/generate", {"text": "x", "stream": True, "sampling_params": {"num_beams": 2}},
     "stream cannot be combined with num_beams > 1"),
    ("/generate", {"text": "x", "return_logprob": True, "sampling_params": {"num_beams": 2}},
     "return_logprob cannot be combined with num_beams > 1"),
    ("/generate", {"text": "x", "sampling_params": {"num_beams": 2, "early_stopping": "no"}},
     'early_stopping must be true, false or "never"'),
    ("/v1/translations", {**TRANSLATE, "beam_size": 2, "num_beams": 3},
     "beam_size (2) and num_beams (3) differ"),
    ("/v1/translations", {**TRANSLATE, "beam_size": 2, "stream": True},
     "stream cannot be combined with beam_size"),
    ("/v1/translations", {**TRANSLATE, "beam_size": "wide"}, "beam_size"),
]


@pytest.mark.parametrize("path, body, needle", BAD)
def test_bad_beam_options_get_a_400_naming_the_field(server, path, body, needle):
    r = httpx.post(server.url + path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"] or needle == err.get("param"), err


def test_the_openai_client_sees_the_refusal(client):
    model = client.models.list().data[0].id
    with pytest.raises(openai.BadRequestError, match="stream cannot be combined"):
        client.completions.create(model=model, prompt="x", max_tokens=4, stream=True,
                                  extra_body={"num_beams": 2})
    with pytest.raises(openai.BadRequestError, match="logprobs cannot be combined"):
        client.chat.completions.create(model=model, max_tokens=4, logprobs=True,
                                       messages=[{"role": "user", "content": "x"}],
                                       extra_body={"num_beams": 2})


# --- end to end, through the server -------------------------------------------------------------
def test_completions_return_k_choices_per_prompt_best_first(server, client, engine):
    model = client.models.list().data[0].id
    prompts = SOURCES[:2]
    r = client.completions.create(model=model, prompt=prompts, max_tokens=6,
                                  extra_body={"num_beams": 4, "num_return_sequences": 2})
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    ref = engine.generate(prompt=prompts, sampling_params=BEAMS)
    assert [c.text for c in r.choices] == [x["text"] for x in ref]
    for first, second in (ref[0:2], ref[2:4]):
        assert first["meta_info"]["beam_score"] >= second["meta_info"]["beam_score"]
        assert first["meta_info"]["kv_bytes"] > 0
    assert r.usage.prompt_tokens == sum(x["meta_info"]["prompt_tokens"] for x in ref[::2])
    assert r.usage.completion_tokens == sum(x["meta_info"]["completion_tokens"] for x in ref)
    native = httpx.post(server.url + "/generate", json={
        "text": prompts[0], "rid": "beams", "sampling_params": BEAMS}, timeout=120).json()
    assert [x["meta_info"]["id"] for x in native] == ["beams-0", "beams-1"]
    assert [x["output_ids"] for x in native] == [x["output_ids"] for x in ref[:2]]
    chat = client.chat.completions.create(
        model=model, max_tokens=6, messages=[{"role": "user", "content": prompts[0]}],
        extra_body={"num_beams": 3, "num_return_sequences": 3, "length_penalty": 0.5})
    assert [c.index for c in chat.choices] == [0, 1, 2]


def test_translations_with_beams_equal_the_engine(server, engine, model_dir):
    texts = ["The house is wonderful.", "Good morning"]
    prompts = [translation_prompt(model_dir, t, "English", "German") for t in texts]
    body = {"input": texts, "source_lang": "English", "target_lang": "German", "max_tokens": 6}
    for beams in (3, 2):
        t = httpx.post(server.url + "/v1/translations", json={**body, "beam_size": beams},
                       timeout=120).json()
        ref = engine.generate(prompt=prompts, sampling_params={
            "num_beams": beams, "max_new_tokens": 6, "temperature": 0})
        assert [d["translation"] for d in t["data"]] == [x["text"] for x in ref]
        if beams == MODEL_BEAMS:  # the model's default: the same without beam_size
            default = httpx.post(server.url + "/v1/translations", json=body, timeout=120)
            assert default.json()["data"] == t["data"]
            mine = engine.translate(texts, "English", "German",
                                    sampling_params={"max_new_tokens": 6, "temperature": 0})
            assert [x["text"] for x in mine] == [x["text"] for x in ref]
            assert all("beam_score" in x["meta_info"] for x in mine)
    greedy = engine.translate(texts, "English", "German", beam_size=1,
                              sampling_params={"max_new_tokens": 6, "temperature": 0})
    assert all("beam_score" not in x["meta_info"] for x in greedy)


def test_images_are_capped_per_request_not_per_prompt(model_dir):
    """Issue 39, item 9: 3 prompts x 2 images is 6 images in one request, over a total of 5,
    though each prompt is within its own limit of 4; 5 images in one prompt is over that."""
    tm = tokenizer_manager(model_dir, max_images=4, max_images_total=5)
    tm.image_processor = object()  # a vision model; the caps are checked before any image
    with pytest.raises(ValueError, match="6 images in one request.*max_images_per_call"):
        tm._images([["a.png", "b.png"]] * 3)
    with pytest.raises(ValueError, match="5 images in one prompt.*max_images_per_request"):
        tm._images([["a.png"] * 5])
