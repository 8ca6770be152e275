"""Llama 3.x outputs read as OpenAI tool calls (`runtime/frontend/tool_calls.py`): whole, and
streamed chunk by chunk with the same result. The expected arguments are the objects the
model wrote, compared after `json.loads` (an independent reading of the same JSON)."""

from __future__ import annotations

import json

import pytest

from seq2serve.runtime.frontend.tool_calls import (
    PYTHON_TAG,
    ToolCallStream,
    looks_like_call,
    parse_tool_calls,
    read_output,
)

NAMES = frozenset({"get_weather", "search"})


def calls_of(text: str) -> list[tuple[str, object]] | None:
    calls = parse_tool_calls(text, NAMES)
    return None if calls is None else [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("text, expected", [
    ('{"name": "get_weather", "parameters": {"city": "Paris"}}',
     [("get_weather", {"city": "Paris"})]),
    # Llama 3.2 also writes "arguments"; no arguments is an empty object
    ('{"name": "search", "arguments": {}}', [("search", {})]),
    # after <|python_tag|> (seen when special tokens are kept), with whitespace around
    (f'\n {PYTHON_TAG} {{"name": "search", "parameters": {{"q": "x"}}}} \n',
     [("search", {"q": "x"})]),
    # several, separated by ";" (and one after the last)
    (('{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
      '{"name": "search", "parameters": {"q": "fjords"}};'),
     [("get_weather", {"city": "Oslo"}), ("search", {"q": "fjords"})]),
    ('{"name": "search", "parameters": {"q": "a"}};{"name": "search", "parameters": {}}',
     [("search", {"q": "a"}), ("search", {})]),
    # strings holding ";", braces, quotes and escapes; nested objects and arrays
    (('{"name": "search", "parameters": {"q": "a; b} {c", "opts": {"deep": [1, {"x": "}"}]}, '
      '"re": "\\"quoted\\" \\\\ ; {"}}'),
     [("search", {"q": "a; b} {c", "opts": {"deep": [1, {"x": "}"}]}, "re": '"quoted" \\ ; {'})]),
    ('{"name": "search", "parameters": {"q": "日本語 ünïcode"}}',
     [("search", {"q": "日本語 ünïcode"})]),
])
def test_calls_are_read(text, expected):
    assert calls_of(text) == expected


@pytest.mark.parametrize("text", [
    "The weather in Paris is sunny.",
    "",
    "   ",
    'Sure: {"name": "search", "parameters": {}}',  # text before the call: content
    '{"name": "search", "parameters": {}} and then some text',  # text after it
    '{"name": "search", "parameters": {}} {"name": "search", "parameters": {}}',  # no ";"
    '{"name": "unknown_tool", "parameters": {}}',  # not a tool of the request
    '{"name": "search"}',  # no arguments
    '{"name": "search", "parameters": "q=x"}',  # arguments not an object
    '{"name": "search", "parameters": {}, "arguments": {}}',  # both
    '{"name": "search", "parameters": {}, "id": 3}',  # another key
    '{"city": "Paris"}',  # JSON, not a call
    '{"name": "search", "parameters": {"q": "x"}',  # cut short
    '{"name": "search", "parameters": {"q": "x"}}; {"name": ',  # the second cut short
    "{'name': 'search', 'parameters': {}}",  # Python, not JSON
    '{"name": "search", "parameters": {"q": NaN}}x',
    '["search"]',
    PYTHON_TAG,
    "{" * 100_000,  # deeper than the JSON parser goes
    '{"name": "search", "parameters": ' + '{"a": ' * 50_000 + "1" + "}" * 50_001,
])
def test_anything_else_is_content(text):
    assert parse_tool_calls(text, NAMES) is None
    out = read_output(text, "stop", NAMES, first_only=False)
    assert (out.content, out.calls, out.finish_reason) == (text, [], "stop")


def test_a_finished_output_is_answered_as_openai_does():
    call = '{"name": "search", "parameters": {"q": "x"}}; {"name": "get_weather", "parameters": {}}'
    out = read_output(call, "stop", NAMES, first_only=False)
    assert out.content is None and out.finish_reason == "tool_calls" and len(out.calls) == 2
    # parallel_tool_calls false: the first call only
    assert [c.name for c in read_output(call, "stop", NAMES, first_only=True).calls] == ["search"]
    # cut short by max_tokens: never read as calls, even when the JSON is whole
    assert read_output(call, "length", NAMES, False).calls == []
    assert read_output(call, "length", NAMES, False).content == call
    openai = out.calls[0].to_openai("call_1")
    assert openai == {"id": "call_1", "type": "function",
                      "function": {"name": "search", "arguments": '{"q": "x"}'}}


def test_looks_like_call_waits_for_the_first_visible_characters():
    assert looks_like_call("") is None and looks_like_call(" \n") is None
    assert looks_like_call("<|py") is None  # may still become <|python_tag|>
    assert looks_like_call(" {") is True and looks_like_call(PYTHON_TAG + "x") is True
    assert looks_like_call("<|pyx") is False and looks_like_call("Hello") is False


# --- streaming ------------------------------------------------------------------------------
def choice(text: str, finish: str | None = None, logprobs: list | None = None) -> dict:
    return {"index": 0, "delta": {"content": text}, "finish_reason": finish,
            "logprobs": None if logprobs is None else {"content": logprobs}}


def stream(pieces: list[str], finish: str = "stop", first_only: bool = False,
           logprobs: bool = False) -> list[dict]:
    s = ToolCallStream(NAMES, first_only)
    sent = []
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        sent += s.feed(choice(piece, finish if last else None, [piece] if logprobs else None))
    return sent


def test_content_streams_as_soon_as_it_cannot_be_a_call():
    s = ToolCallStream(NAMES, False)
    assert s.feed(choice("  ")) == []  # whitespace: undecided
    assert s.feed(choice("\nHel")) == [choice("  \nHel")]
    assert s.feed(choice("lo")) == [choice("lo")]
    assert s.feed(choice("!", "stop")) == [choice("!", "stop")]


@pytest.mark.parametrize("pieces", [
    ['{"name": "get_weather", ', '"parameters": {"city": "Par', 'is"}}; {"name": "search", ',
     '"parameters": {"q": ";{"}}'],
    [PYTHON_TAG, '{"name": "get_weather", "parameters": {"city": "Paris"}};',
     ' {"name": "search", "parameters": {"q": ";{"}}'],
])
def test_a_call_is_held_and_sent_as_tool_call_deltas(pieces):
    sent = stream(pieces, logprobs=True)
    text = "".join(pieces)
    whole = read_output(text, "stop", NAMES, False)
    assert [c["delta"]["tool_calls"][0]["index"] for c in sent] == [0, 1]
    got = [c["delta"]["tool_calls"][0]["function"] for c in sent]
    assert got == [{"name": c.name, "arguments": c.arguments} for c in whole.calls]
    assert all(c["delta"]["tool_calls"][0]["id"].startswith("call_") for c in sent)
    assert [c["finish_reason"] for c in sent] == [None, "tool_calls"]
    assert sent[0]["logprobs"] == {"content": pieces} and sent[1]["logprobs"] is None
    assert len(stream(pieces, first_only=True)) == 1


@pytest.mark.parametrize("pieces, finish", [
    (['{"name": "search", ', '"parameters": {"q": "x"}} and text'], "stop"),
    (['{"name": "search", ', '"parameters": {"q": "x"}}'], "length"),
    (['{"not": "a call"}'], "stop"),
    ([" ", "<|py"], "stop"),  # finished undecided
])
def test_what_is_not_a_call_after_all_is_one_content_chunk(pieces, finish):
    sent = stream(pieces, finish, logprobs=True)
    assert sent == [choice("".join(pieces), finish, pieces)]
