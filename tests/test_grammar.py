"""Grammar-constrained decoding (issue 41) on a tiny random Llama with the real Llama 3
tokenizer, against independent oracles:

- every output of a set of JSON Schemas of real-world shapes (`json_schemas.py`), asked
  through the `openai` client's `response_format`, parses and validates (`jsonschema`, with
  its format checker), greedy and with 4 beams; a regex (`re.fullmatch`) and an EBNF grammar
  (Python's own parser) likewise, on /v1/completions and /generate;
- step by step, the mask the runtime applied equals xgrammar's reference matcher (built here
  from the HF tokenizer, not through `runtime/grammar/`), and each greedy token is the argmax
  of HF transformers' logits over the reference's allowed tokens.

A random model never closes a free string, so the schemas bound every string and array.
All 200 schemas run greedy (one batch), 6 of them with 4 beams; SEQ2SERVE_GRAMMAR_ALL_SCHEMAS=1
runs 40 with beams (~1 min more).
xgrammar 0.2.8 writes a raw control character (a tab) inside a string that has a `maxLength`
(and refuses the escape `\\t` there): outputs are parsed with `json.loads(strict=False)`, which
takes such characters; docs/grammar.md has the reproduction.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re

import httpx
import jsonschema
import openai
import pytest
import torch
import xgrammar as xgr

from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint
from seq2serve.tests.helpers import make_scheduler, run_to_completion
from seq2serve.tests.json_schemas import schemas
from seq2serve.tests.server_helpers import ServerProcess

ALL = os.environ.get("SEQ2SERVE_GRAMMAR_ALL_SCHEMAS") == "1"
SCHEMAS = schemas(200)
GREEDY = SCHEMAS  # all 200 in one batch: ~50 s on 2 CPU cores
BEAMS = SCHEMAS[:40] if ALL else SCHEMAS[:6]
MAX = 512
ASK = [{"role": "user", "content": "Answer in JSON."}]
REGEX = r"[A-Z]{2}-[0-9]{3,5}( [a-z]{1,4}){0,2}"
# sums and products of one-digit numbers with parentheses: Python expressions
EBNF = ('root ::= expr\n'
        'expr ::= term (("+" | "*") term){0,3}\n'
        'term ::= [0-9] | "(" [0-9] (("+" | "*") [0-9]){1,2} ")"')
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> str:
    return str(write_llama_checkpoint(tmp_path_factory.mktemp("llama") / "grammar",
                                      init_scale=10.0, seed=1))


@pytest.fixture(scope="module")
def server(llama_dir):
    srv = ServerProcess(llama_dir)
    yield srv
    assert srv.proc.poll() is None, "the server died"
    assert httpx.get(srv.url + "/debug/integrity").json()["ok"]
    srv.kill()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def allowed(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, vocab] bool: bit t % 32 of word t // 32 (xgrammar's layout; its own
    `testing.bitmask_to_bool_mask` loops in Python, 1.7 s a row of 128k)."""
    bits = (bitmask.to(torch.int64).unsqueeze(-1) >> torch.arange(32)) & 1
    return bits.flatten(1)[:, :vocab].bool()


def _valid(text: str, schema: dict) -> None:
    jsonschema.validate(json.loads(text, strict=False), schema,
                        format_checker=jsonschema.FormatChecker())


async def _chat_all(server, batch: list[dict], **extra) -> list:
    """Every schema's request at once (one client per event loop)."""
    aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused",
                                 max_retries=0, timeout=600)

    async def one(schema):
        return await aclient.chat.completions.create(
            model="grammar", messages=ASK, max_tokens=MAX, temperature=0,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "out", "schema": schema, "strict": True}},
            **extra)
    async with aclient:
        return await asyncio.gather(*(one(s) for s in batch))


def test_every_json_schema_output_validates_greedy(server):
    responses = asyncio.run(_chat_all(server, GREEDY))
    for schema, r in zip(GREEDY, responses):
        choice = r.choices[0]
        assert choice.finish_reason == "stop", (schema, choice.message.content)
        _valid(choice.message.content, schema)


def test_every_json_schema_output_validates_with_beams(server):
    responses = asyncio.run(_chat_all(server, BEAMS, n=1,
                                      extra_body={"num_beams": 4, "num_return_sequences": 2}))
    for schema, r in zip(BEAMS, responses):
        assert len(r.choices) == 2
        for choice in r.choices:
            assert choice.finish_reason == "stop", (schema, choice.message.content)
            _valid(choice.message.content, schema)


def _fraction_bounded(schema):
    """`schema` with every number a multiple of 0.01: llguidance bounds a number's fraction
    only so (xgrammar bounds it when the number has a range), and a random model never ends
    an unbounded one."""
    if isinstance(schema, dict):
        out = {k: _fraction_bounded(v) for k, v in schema.items()}
        if out.get("type") == "number":
            out["multipleOf"] = 0.01
        return out
    if isinstance(schema, list):
        return [_fraction_bounded(v) for v in schema]
    return schema


def test_llguidance_outputs_validate_greedy_and_with_beams(llama_dir):
    """The other backend (`--grammar-backend llguidance`), in-process: 40 schemas greedy, 3
    with 4 beams (both returned), each output valid."""
    s = make_scheduler(llama_dir, grammar_backend="llguidance", max_total_tokens=65536)
    prompt = s.tokenizer.encode("Answer in JSON:")
    batch = [_fraction_bounded(x) for x in SCHEMAS[:40]]
    rids = {}
    for i, schema in enumerate(batch):
        beams = {"num_beams": 4, "num_return_sequences": 2} if i < 3 else {}
        sp = SamplingParams.from_dict({"max_new_tokens": MAX, "temperature": 0, **beams,
                                       "json_schema": json.dumps(schema)})
        tr = TokenizedRequest(rid=str(i), encoder_input_ids=[], decoder_input_ids=prompt,
                              sampling_params=sp)
        if beams:
            tr.beam_rids = [str(i), f"{i}-1"]
        rids[i] = tr.beam_rids or [str(i)]
        s.add_request(tr)
    out = run_to_completion(s)
    for i, schema in enumerate(batch):
        for rid in rids[i]:
            ids = out[rid]
            assert ids[-1] in s.eos_ids, (i, s.tokenizer.decode(ids))
            _valid(s.tokenizer.decode(ids[:-1]), schema)


def test_sampled_choices_validate(client):
    r = client.chat.completions.create(
        model="grammar", messages=ASK, max_tokens=MAX, temperature=1.0, seed=7, n=4,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}})
    texts = [c.message.content for c in r.choices]
    for t in texts:
        _valid(t, PERSON)
    assert len(set(texts)) > 1  # sampled, not the argmax four times


def test_a_regex_on_completions_and_generate(client, server):
    r = client.completions.create(model="grammar", prompt="Code:", max_tokens=40,
                                  temperature=0, n=2, extra_body={"regex": REGEX, "seed": 1})
    for c in r.choices:
        assert re.fullmatch(REGEX, c.text) and c.finish_reason == "stop", c.text
    body = {"text": ["Code:", "Another code:"],
            "sampling_params": {"max_new_tokens": 40, "temperature": 0, "regex": REGEX}}
    for out in httpx.post(server.url + "/generate", json=body, timeout=120).json():
        assert re.fullmatch(REGEX, out["text"]), out["text"]


def test_an_ebnf_grammar_gives_python_expressions(client):
    r = client.completions.create(model="grammar", prompt="Sum:", max_tokens=40, temperature=1,
                                  n=4, seed=3, extra_body={"ebnf": EBNF})
    for c in r.choices:
        tree = ast.parse(c.text, mode="eval")  # the oracle: Python's parser
        assert all(isinstance(n, (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Mult))
                   for n in ast.walk(tree)), c.text
        assert c.finish_reason == "stop"


def test_json_mode_and_a_schema_on_completions(client):
    r = client.completions.create(model="grammar", prompt="JSON:", max_tokens=MAX,
                                  temperature=0, extra_body={"response_format": {
                                      "type": "json_schema",
                                      "json_schema": {"name": "p", "schema": PERSON}}})
    _valid(r.choices[0].text, PERSON)
    # JSON mode: any object; a random model may write keys until its limit, so 12 tokens
    # must be the start of an object the reference grammar accepts
    r = client.chat.completions.create(model="grammar", messages=ASK, max_tokens=12,
                                       temperature=0, response_format={"type": "json_object"})
    text = r.choices[0].message.content
    assert text.startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text, strict=False), dict)


BAD = [
    ({"extra_body": {"regex": "[a-"}}, "regex", "Unclosed"),
    ({"extra_body": {"ebnf": "root ::= x"}}, "ebnf", "not defined"),
    ({"extra_body": {"regex": "a", "ebnf": 'root ::= "a"'}}, "ebnf", "only one grammar"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
     "response_format", "not valid"),
    ({"response_format": {"type": "json_object"}, "extra_body": {"regex": "a"}}, "regex",
     "only one grammar"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema is given"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "json_schema"),
]


@pytest.mark.parametrize("kwargs, param, why", BAD)
def test_bad_grammars_are_a_400_naming_the_field(client, kwargs, param, why):
    with pytest.raises(openai.BadRequestError, match=why) as e:
        client.chat.completions.create(model="grammar", messages=ASK, max_tokens=4, **kwargs)
    assert e.value.param == param, e.value.body


# --- the masks, step by step, against xgrammar's reference matcher and HF's logits ---------
class _XgrReference:
    """xgrammar's own matcher, built from the HF tokenizer (not through runtime/grammar/)."""

    def __init__(self, tok, vocab: int, stops: list[int], kind: str, text: str) -> None:
        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab, stop_token_ids=stops)
        compiler = xgr.GrammarCompiler(info)
        self.m = xgr.GrammarMatcher(compiler.compile_json_schema(text, any_whitespace=False)
                                    if kind == "json_schema" else compiler.compile_grammar(text))
        self.bitmask = xgr.allocate_token_bitmask(1, vocab)

    def mask(self) -> torch.Tensor:
        self.m.fill_next_token_bitmask(self.bitmask)
        return self.bitmask

    def accept(self, token: int) -> bool:
        return self.m.accept_token(token)

    def done(self) -> bool:
        return self.m.is_terminated()


class _LlgReference:
    """llguidance's own matcher, its tokenizer read from the HF tokenizer by llguidance."""

    def __init__(self, tok, vocab: int, stops: list[int], kind: str, text: str) -> None:
        import llguidance
        import llguidance.hf
        from llguidance.gbnf_to_lark import gbnf_to_lark

        from seq2serve.runtime.grammar.llg_row import JSON_DEFAULTS

        lt = llguidance.hf.from_tokenizer(tok, n_vocab=vocab, eos_token=stops)
        grammar = (llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_DEFAULTS)
                   if kind == "json_schema" else gbnf_to_lark(text))
        self.m = llguidance.LLMatcher(lt, grammar, log_level=0)
        self.bitmask = torch.zeros(1, (vocab + 31) // 32, dtype=torch.int32)

    def mask(self) -> torch.Tensor:
        self.m.unsafe_compute_mask_ptr(self.bitmask.data_ptr(), self.bitmask.numel() * 4)
        return self.bitmask

    def accept(self, token: int) -> bool:
        return self.m.consume_token(token)

    def done(self) -> bool:
        return self.m.is_stopped()


@pytest.mark.parametrize("backend, overlap", [("xgrammar", True), ("xgrammar", False),
                                              ("llguidance", True)])
def test_masks_and_tokens_follow_the_reference_matcher(llama_dir, monkeypatch, backend,
                                                        overlap):
    """With the overlap schedule, the grammar rows' steps are launched before the host has
    read their last tokens, and their masks are filled late (while the forward runs): the
    masks and tokens must be the same as when every step waits, and a plain request beside
    them keeps its tokens. Each backend against its own matcher."""
    from transformers import LlamaForCausalLM

    import seq2serve.runtime.scheduler.step_launcher as launcher

    s = make_scheduler(llama_dir, disable_overlap_schedule=not overlap, grammar_backend=backend)
    tok, vocab = s.tokenizer, s.model_config.vocab_size
    masks: dict[str, list[torch.Tensor]] = {"schema": [], "ebnf": []}
    fill = launcher.grammar_masks
    late = []

    def recording(reqs, vocab_size):
        out = fill(reqs, vocab_size)
        for i in out[0] if out else ():
            masks[reqs[i].rid].append(out[1][i].clone())
        return out

    def completing(self, f):
        late.append(f.late is not None)
        return complete(self, f)

    complete = launcher.StepLauncher.complete
    monkeypatch.setattr(launcher, "grammar_masks", recording)
    monkeypatch.setattr(launcher.StepLauncher, "complete", completing)
    prompt = tok.encode("JSON:")
    grammars = {"schema": ("json_schema", json.dumps(PERSON)), "ebnf": ("ebnf", EBNF)}
    for rid, (kind, text) in grammars.items():
        sp = SamplingParams.from_dict({"max_new_tokens": 60, "temperature": 0, kind: text})
        s.add_request(TokenizedRequest(rid=rid, encoder_input_ids=[], decoder_input_ids=prompt,
                                       sampling_params=sp))
    free = SamplingParams.from_dict({"max_new_tokens": 40, "temperature": 0, "ignore_eos": True})
    s.add_request(TokenizedRequest(rid="free", encoder_input_ids=[], decoder_input_ids=prompt,
                                   sampling_params=free))
    out = run_to_completion(s)
    # the overlap schedule stayed on: nearly every decode step filled its masks late
    assert (sum(late) > 0.8 * len(out["schema"])) if overlap else not any(late)

    hf = LlamaForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()
    special = torch.zeros(vocab, dtype=torch.bool)
    special[tok.all_special_ids] = True
    with torch.no_grad():
        ids = prompt + out["free"]
        logits = hf(torch.tensor([ids])).logits[0, len(prompt) - 1:-1]
    assert out["free"] == logits.argmax(-1).tolist()  # the plain neighbour: HF's greedy tokens
    for rid, (kind, text) in grammars.items():
        tokens = out[rid]
        ref = (_XgrReference if backend == "xgrammar" else _LlgReference)(
            tok, vocab, list(s.eos_ids), kind, text)
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:]
        assert tokens[-1] in s.eos_ids
        # run ahead, a step after the last one was launched before its EOS was read: its
        # mask (the matcher terminated) allows everything, and its token is dropped
        extra = masks[rid][len(tokens):]
        assert len(extra) == (1 if overlap else 0) and all((m == -1).all() for m in extra)
        for k, token in enumerate(tokens):
            want = allowed(ref.mask(), vocab)[0]
            got = allowed(masks[rid][k][None], vocab)[0]
            # the runtime never places a special token's name inside a string (the
            # detokenizer drops it); the reference takes them as text there
            assert torch.equal(got & ~special, want & ~special), (rid, k)
            assert not (got & ~want).any(), (rid, k)
            assert token == int(logits[k].masked_fill(~got, float("-inf")).argmax()), (rid, k)
            assert ref.accept(token), (rid, k)
        assert ref.done()
