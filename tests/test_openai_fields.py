"""Every field of OpenAI's completions and chat completions requests, sent through the real
`openai` client to a real server: each is honoured or refused with a 400 whose `param` names it
(issue 41: no field silently ignored).

The tables below decide every field of the client's request types (and of its messages and
stream options); a field that a newer client adds fails `test_every_openai_field_is_decided`
until it is decided here, in the server (`frontend/openai_protocol.py`) and in the README. An
honoured field's case checks what a 2-token request can show of it (several choices, log-probs,
a stop, a seeded draw); `test_server.py` and `test_sampling.py` check the rest against the
engine and HF."""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types import completion_create_params
from openai.types.chat import (
    ChatCompletionMessageParam,
    ChatCompletionStreamOptionsParam,
)
from openai.types.chat import completion_create_params as chat_create_params

from seq2serve.runtime.tools.demo_checkpoint import default_demo_path
from seq2serve.tests.server_helpers import ServerProcess

DEMO = str(default_demo_path())
README = Path(__file__).resolve().parent.parent / "README.md"
PROMPT = "translate digits to English: 73"
MESSAGES = [{"role": "user", "content": PROMPT}]
REFUSED = 400  # an expectation: a 400 whose param names the field


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(DEMO)
    yield srv
    assert srv.proc.poll() is None, "the server died"
    assert httpx.get(srv.url + "/debug/integrity").json()["ok"]
    assert srv.terminate() == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def fields_of(*typed_dicts: Any) -> set[str]:
    """The keys of TypedDicts, or of a Union of them (a request's streaming and non-streaming
    forms, the message roles)."""
    keys: set[str] = set()
    for t in typed_dicts:
        for member in typing.get_args(t) or (t,):
            keys |= set(typing.get_type_hints(member))
    return keys


# --- what a response must show of an honoured field ---------------------------------------
def ok(r, resend) -> None:
    pass


def text_of(r) -> str:
    if isinstance(r, list):  # a stream's chunks
        return "".join((c.choices[0].text if hasattr(c.choices[0], "text")
                        else c.choices[0].delta.content or "") for c in r if c.choices)
    choice = r.choices[0]
    return choice.text if hasattr(choice, "text") else choice.message.content


def choices(k: int) -> Callable:
    def check(r, resend) -> None:
        assert len(r.choices) == k
    return check


def tokens(k: int) -> Callable:
    def check(r, resend) -> None:
        assert r.usage.completion_tokens == k
    return check


def repeatable(r, resend) -> None:
    """A seeded draw (or a greedy one) comes out the same again."""
    assert text_of(resend()) == text_of(r)


def greedy(r, resend) -> None:
    """A nucleus of one token: a sampled draw is the greedy one."""
    assert text_of(r) == text_of(resend(top_p=None, temperature=0))


def stopped_at(stop: str) -> Callable:
    def check(r, resend) -> None:
        whole = text_of(resend(stop=None))
        assert stop in whole, whole  # else the case proves nothing
        assert text_of(r) == whole[:whole.index(stop)]
    return check


def streamed(r, resend) -> None:
    assert isinstance(r, list) and text_of(r) == text_of(resend(stream=False))


def usage_chunk(r, resend) -> None:
    assert r[-1].choices == [] and r[-1].usage.completion_tokens == 2


def completion_logprobs(k: int) -> Callable:
    def check(r, resend) -> None:
        lp = r.choices[0].logprobs
        assert len(lp.token_logprobs) == 2 and all(len(top) <= k for top in lp.top_logprobs)
    return check


def chat_logprobs(k: int) -> Callable:
    def check(r, resend) -> None:
        content = r.choices[0].logprobs.content
        assert len(content) == 2 and all(len(t.top_logprobs) == k for t in content)
    return check


# --- the decisions: field -> [(value, expectation, other arguments of the request)] ---------
SEEDED = {"temperature": 1.0, "max_tokens": 6}
SHARED: dict[str, list[tuple]] = {
    "frequency_penalty": [(1.0, ok, {}), (3.0, REFUSED, {})],
    "logit_bias": [({}, ok, {}), ({"7": 5}, REFUSED, {})],
    "max_tokens": [(1, tokens(1), {}), (0, REFUSED, {})],
    "n": [(2, choices(2), {}), (0, REFUSED, {})],
    "presence_penalty": [(1.0, ok, {}), (-3.0, REFUSED, {})],
    "seed": [(7, repeatable, SEEDED), (-1, REFUSED, {})],
    "stop": [("three", stopped_at("three"), {"max_tokens": 6}), (5, REFUSED, {})],
    "stream": [(True, streamed, {}), (False, ok, {})],
    "stream_options": [({"include_usage": True}, usage_chunk, {"stream": True}),
                       ({"include_obfuscation": False}, ok, {"stream": True})],
    "temperature": [(0.0, repeatable, {"max_tokens": 6}), (3.0, REFUSED, {})],
    "top_p": [(1e-6, greedy, {**SEEDED, "seed": 3}), (0.0, REFUSED, {})],
    "user": [("alice", ok, {})],
}
COMPLETIONS: dict[str, list[tuple]] = {
    **SHARED,
    "model": [],  # every request names the served model; another is a 404 (test below)
    "prompt": [([PROMPT, "translate digits to English: 5"], choices(2), {}),
               ([[0, 1, 2]], choices(1), {}), ([], REFUSED, {})],
    "best_of": [(1, ok, {}), (2, REFUSED, {})],
    "echo": [(False, ok, {}), (True, REFUSED, {})],
    "logprobs": [(2, completion_logprobs(2), {}), (6, REFUSED, {})],
    "suffix": [("", ok, {}), ("!", REFUSED, {})],
}
FUNCTION = {"name": "f", "parameters": {"type": "object", "properties": {}}}
CHAT: dict[str, list[tuple]] = {
    **SHARED,
    "model": [],
    "messages": [([{"role": "system", "content": "x"}, *MESSAGES], ok, {}),
                 ([{"role": "user", "content": [{"type": "text", "text": PROMPT}]}], ok, {}),
                 ([], REFUSED, {})],
    "max_completion_tokens": [(1, tokens(1), {}), (0, REFUSED, {})],
    "logprobs": [(True, chat_logprobs(0), {}), (False, ok, {})],
    "top_logprobs": [(2, chat_logprobs(2), {"logprobs": True}), (2, REFUSED, {}),
                     (21, REFUSED, {"logprobs": True})],
    # accepted, changing nothing a response holds (README)
    "metadata": [({"team": "a"}, ok, {})],
    "safety_identifier": [("hashed-id", ok, {})],
    "prompt_cache_key": [("key", ok, {})],
    "prompt_cache_options": [({"mode": "implicit", "ttl": "30m"}, ok, {}),
                             ({"mode": "explicit"}, REFUSED, {})],
    "service_tier": [("auto", ok, {}), ("default", ok, {}), ("priority", REFUSED, {}),
                     ("flex", REFUSED, {})],
    "store": [(False, ok, {}), (True, REFUSED, {})],
    "modalities": [(["text"], ok, {}), (["text", "audio"], REFUSED, {})],
    "reasoning_effort": [("none", ok, {}), ("high", REFUSED, {})],
    "verbosity": [("medium", ok, {}), ("low", REFUSED, {})],
    # the demo T5's vocabulary has no braces: JSON objects are refused, arrays are taken
    # (test_grammar.py: every kind on a Llama's; below: what the T5 writes)
    "response_format": [({"type": "text"}, ok, {}), ({"type": "json_object"}, REFUSED, {}),
                        ({"type": "json_schema", "json_schema": {"name": "s", "schema": {
                            "type": "array", "items": {"enum": ["seven", "three"]}}}}, ok, {}),
                        ({"type": "json_schema", "json_schema": {"name": "s", "schema": {
                            "type": "object"}}}, REFUSED, {})],
    # tool calling: the demo T5 has no tool support (test_tool_calling.py: a Llama 3.x's);
    # "auto" and parallel_tool_calls without tools, and "required", are refused on any model
    "tool_choice": [("none", ok, {}), ("auto", REFUSED, {}), ("required", REFUSED, {})],
    "tools": [([{"type": "function", "function": FUNCTION}], REFUSED, {}),
              ([{"type": "function", "function": FUNCTION}], ok, {"tool_choice": "none"})],
    "functions": [([FUNCTION], REFUSED, {})],
    "function_call": [("none", ok, {}), ("auto", REFUSED, {})],
    "parallel_tool_calls": [(False, REFUSED, {})],
    # not implemented: refused
    "audio": [({"voice": "alloy", "format": "wav"}, REFUSED, {})],
    "prediction": [({"type": "content", "content": "seven"}, REFUSED, {})],
    "web_search_options": [({}, REFUSED, {})],
    "moderation": [({"model": "omni-moderation-latest"}, REFUSED, {})],
    "prompt_cache_retention": [("in_memory", REFUSED, {}), ("24h", REFUSED, {})],
}
# a message's fields: (role, value, expectation)
MESSAGE: dict[str, list[tuple]] = {
    "role": [(role, role, expect) for role, expect in (
        ("system", ok), ("developer", ok), ("user", ok), ("assistant", ok), ("tool", ok),
        ("function", REFUSED))],
    "content": [("user", [{"type": "text", "text": PROMPT}], ok),
                ("user", [{"type": "input_audio", "input_audio": {}}], REFUSED)],
    "name": [("user", "bob", REFUSED)],
    "refusal": [("assistant", "no", REFUSED)],
    "audio": [("assistant", {"id": "audio_1"}, REFUSED)],
    # no tool support in the demo T5 (test_tool_calling.py: a Llama 3.x's)
    "tool_calls": [("assistant", [{"id": "c", "type": "function",
                                   "function": {"name": "f", "arguments": "{}"}}], REFUSED),
                   ("assistant", [], ok)],
    "function_call": [("assistant", {"name": "f", "arguments": "{}"}, REFUSED)],
    "tool_call_id": [("tool", "call_1", REFUSED)],
}
ENDPOINTS = {"completions": COMPLETIONS, "chat": CHAT}


def test_every_openai_field_is_decided():
    """The tables decide exactly the fields of the installed client's request types."""
    assert set(COMPLETIONS) == fields_of(completion_create_params.CompletionCreateParams)
    assert set(CHAT) == fields_of(chat_create_params.CompletionCreateParams)
    assert set(MESSAGE) == fields_of(ChatCompletionMessageParam)
    assert {"include_usage", "include_obfuscation"} == fields_of(
        ChatCompletionStreamOptionsParam)


def test_the_readme_lists_every_field():
    section = README.read_text().split("### OpenAI fields")[1].split("\n## ")[0]
    named = set(re.findall(r"`([a-z_]+)`", section))
    missing = (set(COMPLETIONS) | set(CHAT) | set(MESSAGE)) - named
    assert not missing, f"README's OpenAI fields section does not name {sorted(missing)}"


def _send(client, model, endpoint: str, field: str, value: Any, extra: dict) -> Any:
    """One request through the client: the field as the client's own argument when it has
    one, else in extra_body; `extra` (the case's other arguments) last; a stream is read to
    its end."""
    create = client.completions.create if endpoint == "completions" else \
        client.chat.completions.create
    base = {"prompt": PROMPT} if endpoint == "completions" else {"messages": MESSAGES}
    kwargs = {"model": model, **base, "max_tokens": 2, "temperature": 0,
              "extra_body": {"ignore_eos": True}}
    if field is not None:
        if field in inspect.signature(create).parameters:
            kwargs[field] = value
        else:
            kwargs["extra_body"][field] = value
    kwargs = {k: v for k, v in {**kwargs, **extra}.items() if v is not None}
    r = create(**kwargs)
    return list(r) if kwargs.get("stream") else r


def _expect_error(status: int, param: str, call: Callable) -> None:
    with pytest.raises(openai.APIStatusError) as e:
        call()
    assert e.value.status_code == status, e.value
    assert e.value.param == param, e.value.body


CASES = [(endpoint, field, value, expect, extra)
         for endpoint, table in ENDPOINTS.items()
         for field, cases in table.items() for value, expect, extra in cases]


@pytest.mark.parametrize("endpoint, field, value, expect, extra", CASES,
                         ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_each_field_is_honoured_or_refused_by_name(client, model, endpoint, field, value,
                                                   expect, extra):
    def send(**more):
        return _send(client, model, endpoint, field, value, {**extra, **more})

    if isinstance(expect, int):
        _expect_error(expect, field, send)
    else:
        expect(send(), send)


@pytest.mark.parametrize("role, field, value, expect",
                         [(role, field, value, expect) for field, cases in MESSAGE.items()
                          for role, value, expect in cases])
def test_each_message_field_is_honoured_or_refused_by_name(client, model, role, field, value,
                                                           expect):
    message = {"role": role, "content": PROMPT, field: value}

    def send(**more):
        return _send(client, model, "chat", "messages", [message], more)

    if field == "content" and expect == REFUSED:  # a part type no model here takes
        with pytest.raises(openai.BadRequestError, match="unsupported part type 'input_audio'"):
            send()
    elif expect == REFUSED:
        _expect_error(REFUSED, f"messages.0.{field}", send)
    else:
        expect(send(), send)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_another_model_is_a_404_naming_it(client, endpoint):
    _expect_error(404, "model", lambda: _send(client, "nope", endpoint, None, None, {}))


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_obfuscation_is_refused_where_it_is_asked_for(client, model, endpoint):
    _expect_error(REFUSED, "stream_options.include_obfuscation", lambda: _send(
        client, model, endpoint, "stream_options", {"include_obfuscation": True},
        {"stream": True}))


SGLANG_EXTRAS = {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "ignore_eos": True,
                 "min_tokens": 1, "stop_token_ids": [1], "skip_special_tokens": False,
                 "num_beams": 2, "num_return_sequences": 2, "length_penalty": 0.5,
                 "early_stopping": True, "no_repeat_ngram_size": 2}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_sglang_extras_are_taken_and_anything_else_is_refused_by_name(client, model, endpoint):
    r = _send(client, model, endpoint, None, None, {"extra_body": dict(SGLANG_EXTRAS)})
    assert len(r.choices) == 2  # num_return_sequences
    for name, value, why in (("regex", "[0-9", "Unclosed"), ("ebnf", "root ::= a", "not defined"),
                             ("json_schema", '{"type": "object"}', "vocabulary"),
                             ("priority", 1, "first come"),
                             ("guided_json", {}, "unknown field"),
                             ("max_token", 3, "unknown field")):
        with pytest.raises(openai.BadRequestError, match=why) as e:
            _send(client, model, endpoint, name, value, {})
        assert e.value.param == name
    if endpoint == "chat":  # unknown fields inside a body are named by their path
        _expect_error(REFUSED, "messages.0.colour", lambda: _send(
            client, model, endpoint, "messages", [{**MESSAGES[0], "colour": "red"}], {}))
        _expect_error(REFUSED, "stream_options.colour", lambda: _send(
            client, model, endpoint, "stream_options", {"colour": "red"}, {"stream": True}))


SEVENS = {"type": "array", "items": {"enum": ["seven", "three", "zero"]}, "minItems": 1,
          "maxItems": 3}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_grammars_on_an_encoder_decoder_model(client, model, endpoint):
    """The demo T5 under a grammar its vocabulary can write (issue 41): greedy and 4 beams,
    each output valid (json.loads, jsonschema), and a regex fully matched."""
    import json

    import jsonschema

    regex = "(seven|three)( and (zero|one)){0,2}"
    for extra in ({}, {"num_beams": 4}):
        r = _send(client, model, endpoint, None, None, {"max_tokens": 40, "extra_body": {
            "json_schema": json.dumps(SEVENS), **extra}})
        jsonschema.validate(json.loads(text_of(r)), SEVENS)
        r = _send(client, model, endpoint, None, None, {"max_tokens": 40, "extra_body": {
            "regex": regex, **extra}})
        assert re.fullmatch(regex, text_of(r)), text_of(r)
