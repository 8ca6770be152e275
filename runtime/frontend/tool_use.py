"""What a chat request's tools ask of the prompt and of the output, checked against the model.

Tools are taken by Llama 3.x chat models only: a Llama or Mllama checkpoint with the Llama 3
vocabulary (its header and end-of-turn tokens) whose chat template renders both the tools and
an assistant message's tool calls, as Llama 3.1's and 3.2's do (the shared Llama 3.0 template
and the demo Mllama template do not). The template is asked once per tokenizer, by rendering a
probe. The output is then read in Llama 3's JSON call format (`tool_calls.py`).

- `tool_choice` "auto" (the default with tools): the tools go to the template and calls are
  read from the output. "none": the request's tools are checked but not shown to the model
  (Llama 3.1's template would tell it to answer with a call) and nothing is read as a call.
  "required" and a named function (`{"type": "function", "function": {"name": ...}}`) force
  one call: the output is constrained by a JSON Schema of Llama 3's call object,
  `{"name": <one of the tools>, "parameters": <that tool's parameters schema>}`, then the end
  of turn (`forced_schema`, the request's `json_schema` grammar; `runtime/grammar/`).
- `parallel_tool_calls` false: the first of several calls is kept (the model is not
  constrained to make one).
- A message's `tool_calls` go to the template with their arguments as objects (HF's
  convention: Llama 3.1's template writes them with `tojson`); a tool result's `tool_call_id`
  must name a call of an earlier assistant message (OpenAI's rule) and goes to the template,
  which may use it (Llama's matches results to calls by order and does not).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from seq2serve.runtime.frontend.openai_protocol import ChatCompletionRequest, ChatMessage
from seq2serve.runtime.frontend.tool_calls import ToolCallStream, ToolOutput, read_output

LLAMA3_ARCHITECTURES = ("LlamaForCausalLM", "MllamaForConditionalGeneration")
LLAMA3_TOKENS = ("<|start_header_id|>", "<|eot_id|>")
_PROBE = "seq2serve_probe_tool"


class ToolRequestError(ValueError):
    """A chat request's tools or tool messages cannot be served: a 400 naming `param`."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolUse:
    """A chat request's messages and tools as the chat template gets them, and how its
    output is read."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None  # what the template gets (None: no tools shown)
    names: frozenset[str]  # the tools whose calls are read from the output (empty: no reading)
    first_only: bool = False  # parallel_tool_calls false
    forced_schema: str | None = None  # tool_choice required / named: the call's JSON Schema

    @property
    def reads_calls(self) -> bool:
        return bool(self.names)

    def read(self, text: str, finish_reason: str | None) -> ToolOutput:
        if not self.names:
            return ToolOutput(text, [], finish_reason)
        return read_output(text, finish_reason, self.names, self.first_only)

    def stream(self) -> ToolCallStream | None:
        """A choice's stream state, or None when nothing is read as a call."""
        return ToolCallStream(self.names, self.first_only) if self.names else None


def tool_use(body: ChatCompletionRequest, tokenizer, architecture: str) -> ToolUse:
    """Check the request's tools and tool messages against each other and the model (a
    ToolRequestError naming the field), and render what the template gets."""
    tools = body.tools or []
    if not tools:
        for name in ("tool_choice", "parallel_tool_calls"):
            if getattr(body, name) not in (None, "none"):
                raise ToolRequestError(f"{name} is only allowed with tools", name)
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.function.name in seen:
            raise ToolRequestError(f"two tools are named {tool.function.name!r}",
                                   f"tools.{i}.function.name")
        seen.add(tool.function.name)
    asks = bool(tools) and body.tool_choice != "none"
    uses_messages = any(m.tool_calls or m.tool_call_id is not None for m in body.messages)
    lacking = tool_support(tokenizer, architecture) if asks or uses_messages else None
    if lacking and asks:
        raise ToolRequestError(f"tools are not supported by this model: {lacking}", "tools")
    messages = [_template_message(m, i, lacking, body.messages[:i])
                for i, m in enumerate(body.messages)]
    if not asks:
        return ToolUse(messages, None, frozenset())
    shown = [t.model_dump(exclude_none=True, exclude={"function": {"strict"}}) for t in tools]
    forced = _forced_tools(body.tool_choice, tools)
    return ToolUse(messages, shown, frozenset(seen), body.parallel_tool_calls is False,
                   call_schema(forced) if forced else None)


def _forced_tools(choice: Any, tools: list) -> list | None:
    """The tools one of which must be called ("required": any; a named function: it), or
    None when the model chooses ("auto")."""
    if choice == "required":
        return list(tools)
    if not isinstance(choice, dict):
        return None
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or set(choice) != {"type", "function"} or set(function) != {
            "name"}:
        raise ToolRequestError('tool_choice must be "auto", "none", "required" or {"type": '
                               '"function", "function": {"name": ...}}', "tool_choice")
    named = [t for t in tools if t.function.name == name]
    if not named:
        raise ToolRequestError(f"tool_choice names {name!r}, which is not one of the tools",
                               "tool_choice.function.name")
    return named


def call_schema(tools: list) -> str:
    """A JSON Schema of one Llama 3 call of one of `tools` (properties in the format's order:
    the grammar writes "name" first)."""
    branches = [{"type": "object",
                 "properties": {"name": {"const": t.function.name},
                                "parameters": t.function.parameters
                                or {"type": "object", "properties": {}}},
                 "required": ["name", "parameters"], "additionalProperties": False}
                for t in tools]
    return json.dumps(branches[0] if len(branches) == 1 else {"anyOf": branches})


def _template_message(m: ChatMessage, i: int, lacking: str | None,
                      earlier: list[ChatMessage]) -> dict[str, Any]:
    out = m.model_dump(include={"role", "content"}, exclude_none=True)
    out.setdefault("content", "")
    for name, present in (("tool_calls", bool(m.tool_calls)),
                          ("tool_call_id", m.tool_call_id is not None)):
        if present and lacking:
            raise ToolRequestError(f"messages.{i}.{name} is not supported by this model: "
                                   f"{lacking}", f"messages.{i}.{name}")
    if m.tool_calls:
        if m.role != "assistant":
            raise ToolRequestError(f"messages.{i}: only an assistant message makes tool calls",
                                   f"messages.{i}.tool_calls")
        out["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.function.name,
                          "arguments": _arguments(c.function.arguments,
                                                  f"messages.{i}.tool_calls.{j}.function."
                                                  f"arguments")}}
            for j, c in enumerate(m.tool_calls)]
    if m.tool_call_id is not None:
        if m.role != "tool":
            raise ToolRequestError(f"messages.{i}: only a tool message answers a tool call",
                                   f"messages.{i}.tool_call_id")
        if not any(c.id == m.tool_call_id for e in earlier for c in e.tool_calls or ()):
            raise ToolRequestError(f"messages.{i}.tool_call_id {m.tool_call_id!r} names no "
                                   f"tool call of an earlier assistant message",
                                   f"messages.{i}.tool_call_id")
        out["tool_call_id"] = m.tool_call_id
    return out


def _arguments(text: str, param: str) -> dict[str, Any]:
    try:
        args = json.loads(text)
    except (ValueError, RecursionError):
        args = None
    if not isinstance(args, dict):
        raise ToolRequestError(f"{param} must be a JSON object (as a string)", param)
    return args


@functools.lru_cache(maxsize=8)
def tool_support(tokenizer, architecture: str) -> str | None:
    """None when the model takes tools, else why not (the template rendered once per
    tokenizer)."""
    if not getattr(tokenizer, "chat_template", None):
        return "it has no chat template, so no tool support"
    if not _renders_tools(tokenizer):
        return ("its chat template has no tool support (it does not render the tools and an "
                "assistant's tool calls, as Llama 3.1's and 3.2's templates do)")
    vocab = tokenizer.get_vocab()
    if architecture not in LLAMA3_ARCHITECTURES or not all(t in vocab for t in LLAMA3_TOKENS):
        return (f"tool calls are read in Llama 3.x's format only, and this is not a Llama 3.x "
                f"chat model ({architecture})")
    return None


def _renders_tools(tokenizer) -> bool:
    user = {"role": "user", "content": "hi"}
    tool = {"type": "function", "function": {"name": _PROBE, "description": "a probe",
                                             "parameters": {"type": "object",
                                                            "properties": {}}}}
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_probe", "type": "function",
         "function": {"name": _PROBE + "_call", "arguments": {}}}]}
    result = {"role": "tool", "tool_call_id": "call_probe", "content": "ok"}
    try:
        shown = tokenizer.apply_chat_template([user], tools=[tool], tokenize=False,
                                              add_generation_prompt=True)
        called = tokenizer.apply_chat_template([user, call, result, user], tokenize=False,
                                               add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that fails on the probe takes no tools
        return False
    return _PROBE in shown and _PROBE + "_call" in called
