"""A Llama 3.x chat model's output read as OpenAI tool calls, whole or streamed.

Llama 3.1-3.3 (and Llama 3.2 Vision) call a custom tool by answering with JSON,
`{"name": "get_weather", "parameters": {"city": "Paris"}}`, sometimes after `<|python_tag|>`
(seen only when special tokens are not skipped) and sometimes with "arguments" for
"parameters"; several calls are separated by `;`. The rule here: an output is calls when,
after optional whitespace and `<|python_tag|>`, it is nothing but such objects (a `;` between
them, one after the last allowed), each naming one of the request's tools with an object of
arguments. Anything else, or a call cut short (finish reason "length"), is content as the
model wrote it: a malformed call is never an error.

Unlike vLLM's `llama3_json` parser (a regex for the objects, then a split on `;`, which breaks
on a `;` or a brace inside a string) each object is read by `json.JSONDecoder.raw_decode`; like
SGLang's Llama 3.2 detector, a name the request did not offer is not a call.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI sends it: a string

    def to_openai(self, call_id: str) -> dict[str, Any]:
        return {"id": call_id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def looks_like_call(text: str) -> bool | None:
    """Whether an output that starts with `text` is read as calls: True when it starts (after
    whitespace) with `{` or `<|python_tag|>`, False when it cannot, None while it may still."""
    head = text.lstrip()
    if not head:
        return None
    if head.startswith(("{", PYTHON_TAG)):
        return True
    return None if PYTHON_TAG.startswith(head) else False


def parse_tool_calls(text: str, names: frozenset[str]) -> list[ToolCall] | None:
    """The calls `text` is, or None when it is not calls (then it is content)."""
    if not looks_like_call(text):
        return None
    body = text.lstrip().removeprefix(PYTHON_TAG)
    calls, pos = [], _skip_space(body, 0)
    while pos < len(body):
        try:
            obj, pos = _DECODER.raw_decode(body, pos)
        except (ValueError, RecursionError):  # malformed, or nested past the parser's depth
            return None
        call = _call_of(obj, names)
        if call is None:
            return None
        calls.append(call)
        pos = _skip_space(body, pos)
        if pos < len(body):
            if body[pos] != ";":
                return None
            pos = _skip_space(body, pos + 1)
    return calls or None


def _call_of(obj: Any, names: frozenset[str]) -> ToolCall | None:
    """`{"name": ..., "parameters": {...}}` ("arguments" for "parameters") naming a tool."""
    if not isinstance(obj, dict) or not obj.keys() <= {"name", "parameters", "arguments"}:
        return None
    args = [obj[k] for k in ("parameters", "arguments") if k in obj]
    if obj.get("name") not in names or len(args) != 1 or not isinstance(args[0], dict):
        return None
    return ToolCall(obj["name"], json.dumps(args[0], ensure_ascii=False))


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


@dataclass(frozen=True)
class ToolOutput:
    """How a choice's output is answered: content, or calls (content None)."""

    content: str | None
    calls: list[ToolCall]
    finish_reason: str | None


def read_output(text: str, finish_reason: str | None, names: frozenset[str],
                first_only: bool) -> ToolOutput:
    """A finished output as content or calls. Calls finish with "tool_calls"; `first_only`
    (`parallel_tool_calls` false) keeps the first of several."""
    calls = parse_tool_calls(text, names) if finish_reason == "stop" else None
    if not calls:
        return ToolOutput(text, [], finish_reason)
    return ToolOutput(None, calls[:1] if first_only else calls, "tool_calls")


def message_of(out: ToolOutput) -> dict[str, Any]:
    """The chat completion's `message` for an output."""
    message: dict[str, Any] = {"role": "assistant", "content": out.content}
    if out.calls:
        message["tool_calls"] = [c.to_openai(new_call_id()) for c in out.calls]
    return message


class ToolCallStream:
    """One choice of a streamed chat completion when tools may be called.

    Streaming stays as it is for content: the choice's chunks pass through once the output
    cannot be a call (its first characters other than whitespace are neither `{` nor
    `<|python_tag|>`). An output that starts like a call is held to its end and then sent as
    `read_output` reads it: one chunk per call (`delta.tool_calls` with the index, id, type,
    name and the whole arguments), or, if it is not calls after all, one content chunk. So a
    streamed answer is the same as the whole one. The held chunks' log-probs go with the first
    chunk sent.
    """

    def __init__(self, names: frozenset[str], first_only: bool) -> None:
        self.names, self.first_only = names, first_only
        self.held: list[dict[str, Any]] = []  # the choices not sent yet
        self.is_call: bool | None = None

    def feed(self, choice: dict[str, Any]) -> list[dict[str, Any]]:
        """The choices to send for one streamed choice of the model's output (its delta
        carries "content"): none while held, the held ones merged, or the calls."""
        if self.is_call is False:
            return [choice]
        self.held.append(choice)
        text = "".join(c["delta"]["content"] for c in self.held)
        if self.is_call is None:
            self.is_call = looks_like_call(text)
        finish = choice["finish_reason"]
        if self.is_call is False or (finish is not None and not self.is_call):
            return [self._release(text, finish)]
        if finish is None:
            return []
        out = read_output(text, finish, self.names, self.first_only)
        if not out.calls:
            return [self._release(text, finish)]
        first = self._release("", out.finish_reason)
        sent = []
        for i, call in enumerate(out.calls):
            sent.append({**first, "delta": {"tool_calls": [{"index": i, **call.to_openai(
                new_call_id())}]}, "logprobs": first["logprobs"] if i == 0 else None,
                "finish_reason": out.finish_reason if i == len(out.calls) - 1 else None})
        return sent

    def _release(self, text: str, finish: str | None) -> dict[str, Any]:
        """The held choices as one, with `text` as its content."""
        held, self.held = self.held, []
        merged = {**held[-1], "delta": {"content": text}, "finish_reason": finish}
        if any(c["logprobs"] is not None for c in held):
            merged["logprobs"] = {"content": [e for c in held if c["logprobs"]
                                              for e in c["logprobs"]["content"]]}
        return merged
