"""Tool calling on /v1/chat/completions for Llama 3.x chat models (issue 41).

Two halves, each against an independent oracle:
- the prompt: a real server (a tiny random Llama with the real Llama 3 tokenizer) must give the
  model exactly what HF's `apply_chat_template(messages, tools=..., add_generation_prompt=True)`
  gives, token for token. The server's answer to the chat request is compared with its answer
  to /generate of HF's ids (same greedy tokens, same log-probs: a random model's logits tell
  prompts apart), through the real `openai` client;
- the answer: a random model never writes a call, so known outputs are fed one layer below
  HTTP (the handlers, `OpenAIServing`, over a scripted TokenizerManager) and what comes back is
  read by the `openai` package itself: its response types, and for streams its own
  accumulator (`ChatCompletionStreamState`), which must rebuild the same calls.

The shared Llama 3 tokenizer's template (Llama 3.0's) has no tool support, so the server's
checkpoint gets a template written here in Llama 3.1's JSON tool-calling format (tools in a
system turn with "Environment: ipython", calls as `{"name", "parameters"}`, results in an
`ipython` turn); the same tokenizer with its own template must refuse tools.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.frontend.openai_protocol import ChatCompletionRequest
from seq2serve.runtime.frontend.openai_serving import OpenAIServing, RequestError
from seq2serve.runtime.tools.demo_checkpoint import (
    LLAMA3_TOKENIZER,
    MLLAMA_CHAT_TEMPLATE,
    default_demo_path,
    write_llama_checkpoint,
)
from seq2serve.tests.server_helpers import ServerProcess

# Llama 3.1's JSON tool-calling prompt format, written for these tests
TOOL_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if tools %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nEnvironment: ipython\\n' }}"
    "{{- 'To call a function, answer with JSON {\"name\": its name, \"parameters\": an object of "
    "its arguments} and nothing else.\\n\\n' }}"
    "{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}"
    "{{- '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- elif message.tool_calls is defined %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- for call in message.tool_calls %}{%- if not loop.first %}{{- '; ' }}{%- endif %}"
    "{{- '{\"name\": \"' + call.function.name + '\", \"parameters\": ' }}"
    "{{- call.function.arguments | tojson }}{{- '}' }}{%- endfor %}"
    "{{- '<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' }}"
    "{{- message.content | trim }}{{- '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
TOOLS = [WEATHER, SEARCH]
ASK = [{"role": "system", "content": "Be brief."},
       {"role": "user", "content": "What is the weather in Paris?"}]
MAX = 4


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> str:
    path = write_llama_checkpoint(tmp_path_factory.mktemp("llama") / "tools", init_scale=10.0,
                                  seed=1)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["chat_template"] = TOOL_TEMPLATE
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return str(path)


@pytest.fixture(scope="module")
def tok(llama_dir):
    return load_tokenizer(llama_dir)


@pytest.fixture(scope="module")
def server(llama_dir):
    srv = ServerProcess(llama_dir)
    yield srv
    assert srv.proc.poll() is None, "the server died"
    assert httpx.get(srv.url + "/debug/integrity").json()["ok"]
    srv.kill()  # its clean shutdown is test_server.py's (a drain costs seconds here)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def hf_ids(tok, messages, tools=None) -> list[int]:
    out = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                  return_dict=True)
    return list(out["input_ids"])


def chat(client, messages, **kwargs):
    kwargs = {"max_tokens": MAX, "temperature": 0, "logprobs": True, **kwargs}
    return client.chat.completions.create(model="tools", messages=messages,
                                          extra_body={"ignore_eos": True}, **kwargs)


def assert_prompt_is(server, tok, response, ids: list[int]) -> None:
    """The chat response is the server's answer to exactly `ids`."""
    ref = httpx.post(server.url + "/generate", timeout=60, json={
        "input_ids": ids, "return_logprob": True,
        "sampling_params": {"max_new_tokens": MAX, "temperature": 0, "ignore_eos": True}}).json()
    assert response.usage.prompt_tokens == len(ids) == ref["meta_info"]["prompt_tokens"]
    got = [(e.token, e.logprob) for e in response.choices[0].logprobs.content]
    want = [(tok.decode([t]), lp) for lp, t in ref["meta_info"]["output_token_logprobs"]]
    assert [t for t, _ in got] == [t for t, _ in want]
    assert [lp for _, lp in got] == pytest.approx([lp for _, lp in want], abs=1e-4)
    assert response.choices[0].message.content == ref["text"]  # a random model calls nothing


# --- the prompt, through a real server -----------------------------------------------------
def test_tools_reach_the_template_as_hf_renders_them(server, client, tok):
    r = chat(client, ASK, tools=TOOLS)
    assert_prompt_is(server, tok, r, hf_ids(tok, ASK, TOOLS))
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.tool_calls is None
    assert r.usage.prompt_tokens > len(hf_ids(tok, ASK))  # the tools are in it


def test_a_tool_conversation_round_trips(server, client, tok):
    """The client sends back the calls as OpenAI wrote them (arguments: a JSON string) and the
    results with their ids; the template gets HF's form (arguments: an object)."""
    calls = [{"id": "call_a", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
             {"id": "call_b", "type": "function",
              "function": {"name": "search", "arguments": '{"q": "Paris; {events}"}'}}]
    sent = [*ASK, {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call_a", "content": '{"celsius": 21}'},
            {"role": "tool", "tool_call_id": "call_b", "content": "a concert"},
            {"role": "assistant", "content": "It is 21 degrees, and there is a concert."},
            {"role": "user", "content": "Thanks!"}]
    hf = [*ASK, {"role": "assistant", "tool_calls": [
        {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
        for c in calls]}, *sent[3:]]
    assert_prompt_is(server, tok, chat(client, sent, tools=TOOLS), hf_ids(tok, hf, TOOLS))
    # "none" checks the tools but does not show them to the model; the history is rendered
    assert_prompt_is(server, tok, chat(client, sent, tools=TOOLS, tool_choice="none"),
                     hf_ids(tok, hf))


def test_streamed_content_with_tools_is_the_whole_answer(client):
    sampled = {"tools": TOOLS, "tool_choice": "auto", "n": 2, "seed": 5, "temperature": 1.0}
    whole = chat(client, ASK, **sampled)
    chunks = list(chat(client, ASK, **sampled, stream=True))
    for i in range(2):
        text = "".join(c.choices[0].delta.content or "" for c in chunks
                       if c.choices and c.choices[0].index == i)
        assert text == whole.choices[i].message.content
        assert [c.choices[0].finish_reason for c in chunks if c.choices
                and c.choices[0].index == i and c.choices[0].finish_reason] == ["length"]


REFUSALS = [
    ({"tool_choice": "required"}, None, None),  # taken (a forced call, below)
    ({"tool_choice": {"type": "function", "function": {"name": "search"}}}, None, None),
    ({"tool_choice": {"type": "function", "function": {"name": "sing"}}},
     "tool_choice.function.name", "not one of the tools"),
    ({"tool_choice": {"type": "function", "name": "search"}}, "tool_choice", '"required" or'),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
     "cannot be combined with response_format"),
    ({"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}},
     "tool_choice", "send only the allowed tools"),
    ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools.0.type", "custom"),
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools.0.function.name",
     "required"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools.0.function.name",
     "pattern"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools.0.function.parameters", "JSON Schema of an object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
     "tools.0.function.parameters", "dictionary"),
    ({"tools": [{"type": "function", "function": {"name": "f", "colour": "red"}}]},
     "tools.0.function.colour", "unknown field"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": True}}]},
     "tools.0.function.strict", 'tool_choice "required"'),
    ({"tools": [SEARCH, SEARCH]}, "tools.1.function.name", "two tools"),
    ({"tools": [], "tool_choice": "auto"}, "tool_choice", "only allowed with tools"),
    ({"tools": [], "parallel_tool_calls": False}, "parallel_tool_calls", "only allowed with tools"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, None, None),  # taken
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
     "messages.0.tool_calls", "only an assistant"),
    ({"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages.0.tool_calls.0.function.arguments", "JSON object"),
    ({"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{"}}]}]},
     "messages.0.tool_calls.0.function.arguments", "JSON object"),
    ({"messages": [*ASK, {"role": "tool", "tool_call_id": "call_x", "content": "1"}]},
     "messages.2.tool_call_id", "names no tool call"),
    ({"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]},
     "messages.0.tool_call_id", "only a tool message"),
]


@pytest.mark.parametrize("fields, param, why", REFUSALS)
def test_tool_fields_are_checked_by_name(server, fields, param, why):
    body = {"messages": ASK, "max_tokens": 1, "tools": TOOLS, **fields}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    if param is None:
        assert r.status_code == 200, r.text
        return
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and why in error["message"], error


# --- calls forced by the grammar, through the openai client's tool-calling flow ----------
# the arguments are bounded: a random model never closes a free string on its own
BOOK = {"type": "function", "function": {
    "name": "book_table", "description": "Book a table.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]},
        "people": {"type": "integer", "minimum": 1, "maximum": 12},
        "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}},
        "required": ["city", "people", "time"]}}}
NOTE = {"type": "function", "function": {
    "name": "note", "parameters": {"type": "object", "properties": {
        "text": {"type": "string", "maxLength": 10}}, "required": ["text"]}}}
FORCED = [BOOK, NOTE]


def _assert_call(call, tools) -> None:
    import jsonschema

    schema = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert call.type == "function" and call.function.name in schema
    jsonschema.validate(json.loads(call.function.arguments, strict=False),
                        schema[call.function.name])


@pytest.mark.parametrize("choice, names", [
    ("required", {"book_table", "note"}),
    ({"type": "function", "function": {"name": "note"}}, {"note"}),
])
def test_a_forced_call_goes_through_the_clients_tool_flow(server, client, tok, choice, names):
    kwargs = {"model": "tools", "messages": ASK, "tools": FORCED, "tool_choice": choice,
              "max_tokens": 200, "temperature": 0}
    r = client.chat.completions.create(**kwargs)
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and message.content is None
    assert len(message.tool_calls) == 1 and message.tool_calls[0].function.name in names
    _assert_call(message.tool_calls[0], FORCED)
    # streamed, the openai package's accumulator rebuilds the same call
    with client.chat.completions.stream(**kwargs) as stream:
        final = stream.get_final_completion()
    streamed = final.choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments, strict=False))
            for c in streamed] == [(c.function.name, json.loads(c.function.arguments,
                                                                  strict=False))
                                   for c in message.tool_calls]
    # the client sends the call back with its result; the model answers (not forced now) to
    # exactly the prompt HF's template makes of the conversation
    call = message.tool_calls[0]
    follow = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
              {"role": "tool", "tool_call_id": call.id, "content": '{"ok": true}'}]
    hf = [*ASK, {"role": "assistant", "tool_calls": [
        {**call.model_dump(), "function": {"name": call.function.name, "arguments": json.loads(
            call.function.arguments, strict=False)}}]}, follow[-1]]
    assert_prompt_is(server, tok, chat(client, follow, tools=FORCED), hf_ids(tok, hf, FORCED))


def test_forced_calls_with_beams_and_samples(client):
    r = client.chat.completions.create(model="tools", messages=ASK, tools=FORCED,
                                       tool_choice="required", max_tokens=200, temperature=1,
                                       n=3, seed=11)
    for c in r.choices:
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1
        _assert_call(c.message.tool_calls[0], FORCED)
    r = client.chat.completions.create(model="tools", messages=ASK, tools=FORCED,
                                       tool_choice={"type": "function",
                                                    "function": {"name": "book_table"}},
                                       max_tokens=200, temperature=0,
                                       extra_body={"num_beams": 4})
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["book_table"]
    _assert_call(r.choices[0].message.tool_calls[0], FORCED)


# --- the answer, one layer below HTTP --------------------------------------------------------
class ScriptedTokenizerManager:
    """What `OpenAIServing` uses of the TokenizerManager, answering every request with the given
    outputs: per choice, its text in pieces and its finish reason. The choices' pieces come
    interleaved, as the scheduler's would."""

    def __init__(self, tokenizer, outputs: list[tuple[list[str], str]],
                 architecture: str = "LlamaForCausalLM") -> None:
        self.tokenizer, self.outputs = tokenizer, outputs
        self.info = {"architecture": architecture}

    async def generate(self, obj):
        meta = {"prompt_tokens": len(obj.input_ids or ()), "completion_tokens": 1}
        if not obj.stream:
            for i, (pieces, finish) in enumerate(self.outputs):
                yield {"index": i, "text": "".join(pieces), "output_ids": [],
                       "meta_info": {**meta, "finish_reason": {"type": finish}}}
            return
        longest = max(len(pieces) for pieces, _ in self.outputs)
        for step in range(longest):
            for i, (pieces, finish) in enumerate(self.outputs):
                if step < len(pieces):
                    last = step == len(pieces) - 1
                    yield {"index": i, "text": pieces[step], "output_ids": [],
                           "meta_info": {**meta, "finish_reason": {"type": finish}
                                         if last else None}}


class Connected:
    async def is_disconnected(self) -> bool:
        return False


def answer(tokenizer, outputs, body: dict, architecture: str = "LlamaForCausalLM"):
    """The chat handler's answer, whole (a ChatCompletion) or streamed (its chunks, and the
    completion the openai package's accumulator rebuilds from them)."""
    tm = ScriptedTokenizerManager(tokenizer, outputs, architecture)
    serving = OpenAIServing(tm, "tools", str(LLAMA3_TOKENIZER))
    request = ChatCompletionRequest(**{"messages": ASK, **body})

    async def run():
        response = await serving.chat(request, Connected())
        if not request.stream:
            return ChatCompletion.model_validate(response)
        events = [e async for e in response.body_iterator]
        assert events[-1] == "data: [DONE]\n\n"
        chunks = [ChatCompletionChunk.model_validate(json.loads(e.removeprefix("data: ")))
                  for e in events[:-1]]
        state = ChatCompletionStreamState()
        for c in chunks:
            state.handle_chunk(c)
        return chunks, state.current_completion_snapshot

    return asyncio.run(run())


CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
TWO = CALL + '; {"name": "search", "parameters": {"q": "a; {b}"}}'
OUTPUTS = {
    "one call": ([CALL[:9], CALL[9:30], CALL[30:]], "stop"),
    "two calls": ([" ", "<|python_tag|>", TWO[:40], TWO[40:]], "stop"),
    "content": (["It is ", "sunny."], "stop"),
    "malformed": (['{"name": "get_weather", ', '"parameters": {"city": Paris}}'], "stop"),
    "cut short": ([CALL[:20]], "length"),
    "unknown tool": (['{"name": "sing", "parameters": {}}'], "stop"),
}
# what each answer must be: (content, [(name, arguments)], finish_reason)
EXPECTED = {
    "one call": (None, [("get_weather", {"city": "Paris"})], "tool_calls"),
    "two calls": (None, [("get_weather", {"city": "Paris"}), ("search", {"q": "a; {b}"})],
                  "tool_calls"),
    "content": ("It is sunny.", [], "stop"),
    "malformed": ('{"name": "get_weather", "parameters": {"city": Paris}}', [], "stop"),
    "cut short": (CALL[:20], [], "length"),
    "unknown tool": ('{"name": "sing", "parameters": {}}', [], "stop"),
}


@pytest.fixture(scope="module")
def tool_tok():
    """The server's tokenizer, without the checkpoint."""
    tokenizer = load_tokenizer(str(LLAMA3_TOKENIZER))
    tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


def summary(choice) -> tuple:
    message = choice.message
    calls = [(c.function.name, json.loads(c.function.arguments))
             for c in message.tool_calls or ()]
    assert all(c.type == "function" and c.id.startswith("call_")
               for c in message.tool_calls or ())
    assert len({c.id for c in message.tool_calls or ()}) == len(calls)
    return message.content, calls, choice.finish_reason


def test_outputs_are_answered_whole_and_streamed_alike(tool_tok):
    """Every kind of output at once, as n choices (their pieces interleaved)."""
    names = list(OUTPUTS)
    outputs = [OUTPUTS[k] for k in names]
    body = {"tools": TOOLS, "n": len(names)}
    whole = answer(tool_tok, outputs, body)
    chunks, rebuilt = answer(tool_tok, outputs, {**body, "stream": True})
    for i, name in enumerate(names):
        assert summary(whole.choices[i]) == EXPECTED[name], name
        assert summary(rebuilt.choices[i]) == EXPECTED[name], name
    # content streams as it comes; a call is sent whole at the end, one chunk per call
    content = [c.choices[0].delta.content for c in chunks
               if c.choices[0].index == names.index("content") and c.choices[0].delta.content]
    assert content == ["It is ", "sunny."]
    two = [c.choices[0].delta.tool_calls for c in chunks
           if c.choices[0].index == names.index("two calls") and c.choices[0].delta.tool_calls]
    assert [[t.index for t in d] for d in two] == [[0], [1]]


def test_parallel_tool_calls_false_keeps_the_first_call(tool_tok):
    outputs = [OUTPUTS["two calls"]]
    body = {"tools": TOOLS, "parallel_tool_calls": False}
    first = (None, EXPECTED["two calls"][1][:1], "tool_calls")
    assert summary(answer(tool_tok, outputs, body).choices[0]) == first
    assert summary(answer(tool_tok, outputs, {**body, "stream": True})[1].choices[0]) == first


def test_nothing_is_read_as_a_call_without_tools_or_with_tool_choice_none(tool_tok):
    outputs = [OUTPUTS["one call"]]
    as_text = (CALL, [], "stop")
    for body in ({}, {"tools": TOOLS, "tool_choice": "none"}):
        assert summary(answer(tool_tok, outputs, body).choices[0]) == as_text
        assert summary(answer(tool_tok, outputs, {**body, "stream": True})[1].choices[0]) == \
            as_text


@pytest.mark.parametrize("model", ["llama3.0 template", "mllama demo template", "t5 demo"])
def test_a_model_without_tool_support_refuses_tools_by_name(model):
    if model == "t5 demo":
        tokenizer = load_tokenizer(str(default_demo_path()))
        architecture = "T5ForConditionalGeneration"
    else:
        tokenizer = load_tokenizer(str(LLAMA3_TOKENIZER))
        architecture = "LlamaForCausalLM"
        if model == "mllama demo template":
            tokenizer.chat_template = MLLAMA_CHAT_TEMPLATE
            architecture = "MllamaForConditionalGeneration"
    history = [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "search", "arguments": "{}"}}]}]
    for body, param in (({"tools": TOOLS}, "tools"),
                        ({"messages": history}, "messages.2.tool_calls")):
        with pytest.raises(RequestError, match="no tool support") as e:
            answer(tokenizer, [OUTPUTS["content"]], body, architecture)
        assert e.value.param == param
    # tools the request itself tells the model not to use ask for nothing it lacks
    out = answer(tokenizer, [OUTPUTS["content"]], {"tools": TOOLS, "tool_choice": "none"},
                 architecture)
    assert out.choices[0].message.content == "It is sunny."


def test_a_template_that_refuses_the_messages_is_a_400():
    """Llama 3.1's own template raises on an assistant message with several calls, and on
    tools without a user message: the template's words, as a 400 (a ValueError here)."""
    tokenizer = load_tokenizer(str(LLAMA3_TOKENIZER))
    tokenizer.chat_template = ("{%- if messages | length > 1 %}"
                               "{{- raise_exception('one message at a time') }}{%- endif %}"
                               "{{- messages[0].content }}")
    with pytest.raises(ValueError, match="refused these messages: one message at a time"):
        answer(tokenizer, [OUTPUTS["content"]], {})
    assert answer(tokenizer, [OUTPUTS["content"]], {"messages": ASK[1:]}).choices[0] \
        .message.content == "It is sunny."
