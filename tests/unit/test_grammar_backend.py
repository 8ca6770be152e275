"""The grammar backend's pieces without a model (runtime/grammar/): the vocabulary check, the
compiled-grammar cache, a row's matcher, the bitmask's application; each against a reference
written here or the backend's own; both backends (xgrammar, llguidance) where they differ."""

from __future__ import annotations

import json

import pytest
import torch

from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.grammar.bitmask import apply_bitmask, new_bitmask
from seq2serve.runtime.grammar.compiler import GrammarCache
from seq2serve.runtime.grammar.expressible import required_chars
from seq2serve.runtime.grammar.matcher import fill_rows
from seq2serve.runtime.grammar.vocabulary import token_bytes
from seq2serve.runtime.tools.demo_checkpoint import LLAMA3_TOKENIZER, T5_TOKENIZER

T5_VOCAB = 32128
LLAMA_VOCAB = 128256
ENUM_ARRAY = json.dumps({"type": "array", "items": {"enum": ["yes", "no"]}, "maxItems": 2})


def allowed(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, vocab] bool: bit t % 32 of word t // 32 (xgrammar's layout; its own
    `testing.bitmask_to_bool_mask` loops in Python, 1.7 s a row of 128k)."""
    bits = (bitmask.to(torch.int64).unsqueeze(-1) >> torch.arange(32)) & 1
    return bits.flatten(1)[:, :vocab].bool()


@pytest.fixture(scope="module")
def t5_tok():
    return load_tokenizer(str(T5_TOKENIZER))


@pytest.fixture(scope="module", params=["xgrammar", "llguidance"])
def t5_grammars(t5_tok, request):
    return GrammarCache(t5_tok, T5_VOCAB, capacity=2, backend=request.param)


@pytest.mark.parametrize("schema, chars", [
    ({"type": "object"}, "{}"),
    ({"type": "object", "properties": {"a": {"type": "array"}}, "required": ["a"]}, '{}":[]'),
    ({"type": "object", "properties": {"a": {"type": "array"}}}, "{}"),  # a is optional
    ({"type": "array", "items": {"type": "string"}}, "[]"),  # may be empty
    ({"type": "array", "items": {"type": "string"}, "minItems": 1}, '[]"'),
    ({"anyOf": [{"type": "object"}, {"type": "array"}]}, ""),
    ({"type": ["string", "null"]}, ""),
    ({"enum": ["a", "b"]}, '"'),
    ({"enum": ["a", 1]}, ""),
    ({"const": {"k": [1]}}, '{}":[]'),
    ({"allOf": [{"type": "string"}, {"type": "object"}]}, '"{}'),
    ({"$ref": "#/$defs/x"}, ""),
])
def test_required_chars_are_those_every_valid_text_has(schema, chars):
    assert required_chars(schema) == set(chars)


def test_t5_vocabulary_refuses_objects_and_takes_arrays(t5_grammars):
    with pytest.raises(ValueError, match=r"json_schema cannot be written.*'\{' '\}'"):
        t5_grammars.matcher("json_schema", json.dumps({"type": "object"}), (1,))
    assert not t5_grammars.matcher("json_schema", ENUM_ARRAY, (1,)).terminated
    assert t5_grammars.matcher("regex", "(yes|no)", (1,)) is not None


def test_t5_pieces_are_their_text_and_special_tokens_are_empty(t5_tok):
    pieces = token_bytes(t5_tok, T5_VOCAB)
    word = t5_tok.convert_tokens_to_ids("\u2581house")
    assert pieces[word] == b" house"  # SentencePiece's word boundary is a space in the text
    assert t5_tok.decode([t5_tok.convert_tokens_to_ids("a"), word]) == "a house"
    for i in t5_tok.all_special_ids:
        assert pieces[i] == b""
    assert pieces[-1] == b""  # past the tokenizer (a padded head's ids)


BAD_REGEX = {"xgrammar": "regex is not valid: .*Unclosed",
             "llguidance": "regex is not valid: .*unclosed character class"}
BAD_EBNF = {"xgrammar": 'ebnf is not valid: .*"x" is not defined',
            "llguidance": "ebnf is not valid: Rule 'x' not found"}


def test_bad_grammars_are_named(t5_grammars):
    name = t5_grammars.backend.name
    for kind, text, why in (("regex", "[a-", BAD_REGEX[name]),
                            ("ebnf", "root ::= x", BAD_EBNF[name]),
                            ("json_schema", "{bad", "json_schema is not JSON"),
                            ("json_schema", "[1]", "must be a JSON Schema"),
                            ("json_schema", '{"type": "bogus"}', "json_schema is not valid"),
                            ("xml", "x", "unknown grammar kind")):
        with pytest.raises(ValueError, match=why):
            t5_grammars.matcher(kind, text, (1,))


def test_the_server_option_names_the_backends_the_cache_makes(t5_tok):
    """`--grammar-backend`'s choices (runtime/config, which may not import runtime/grammar)
    are the backends `make_backend` knows; any other name is refused by name."""
    from seq2serve.runtime.config.server_args import GRAMMAR_BACKENDS, ServerArgs
    from seq2serve.runtime.grammar.compiler import BACKENDS

    assert GRAMMAR_BACKENDS == BACKENDS
    with pytest.raises(ValueError, match="grammar_backend must be one of"):
        ServerArgs(model_path="x", grammar_backend="outlines")
    with pytest.raises(ValueError, match="grammar backend must be one of"):
        GrammarCache(t5_tok, T5_VOCAB, backend="outlines")


def test_the_cache_keeps_the_most_recent_grammars(t5_grammars):
    c = t5_grammars
    c.compiled("regex", "a+")
    c.compiled("regex", "b+")
    hits, misses = c.hits, c.misses
    assert c.compiled("regex", "a+") is c.compiled("regex", "a+")
    assert (c.hits, c.misses) == (hits + 2, misses)
    c.compiled("regex", "c+")  # over capacity 2: "b+" (least recently used) goes
    assert [k for _, k in c._compiled] == ["a+", "c+"]


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_a_row_follows_its_tokens_and_a_fork_is_independent(backend):
    tok = load_tokenizer(str(LLAMA3_TOKENIZER))
    cache = GrammarCache(tok, LLAMA_VOCAB, backend=backend)
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    row = cache.matcher("regex", "ab(c|d)", (eot,))
    ids = {s: tok.convert_tokens_to_ids(s) for s in ("ab", "c", "d", "x")}
    mask = new_bitmask(2, LLAMA_VOCAB)
    assert row.accept(ids["ab"])
    twin = row.fork()
    assert twin.accept(ids["c"]) and not twin.terminated
    row.fill(mask, 0)
    twin.fill(mask, 1)
    ok = allowed(mask, LLAMA_VOCAB)
    assert ok[0, ids["c"]] and ok[0, ids["d"]] and not ok[0, eot]
    assert ok[1].nonzero().flatten().tolist() == [eot]  # complete: only the stop token
    assert twin.accept(eot) and twin.terminated
    assert not row.accept(ids["x"]) and row.dead  # a token the grammar refuses
    row.fill(mask, 0)
    assert bool(allowed(mask, LLAMA_VOCAB)[0].all())  # a dead row is not masked
    row.reset()
    assert not row.dead and row.accept(ids["ab"])
    # a step's rows filled together are each row's own fill
    dead = row.fork()
    dead.accept(ids["x"])
    together, alone = new_bitmask(4, LLAMA_VOCAB), new_bitmask(4, LLAMA_VOCAB)
    rows = [(0, row), (2, cache.matcher("regex", "[0-9]+", (eot,))), (3, dead)]
    fill_rows(rows, together)
    for i, g in rows:
        g.fill(alone, i)
    assert torch.equal(together, alone) and not together[1].any()


def test_llguidance_allows_each_rows_own_stop_tokens_where_the_grammar_may_end():
    """llguidance's vocabulary has one end token (the tokenizer's EOS, here `<|eot_id|>`): a
    row's own stop tokens take its place, as xgrammar's per-matcher stop tokens do."""
    tok = load_tokenizer(str(LLAMA3_TOKENIZER))
    cache = GrammarCache(tok, LLAMA_VOCAB, backend="llguidance")
    eot, eof = tok.convert_tokens_to_ids("<|eot_id|>"), tok.convert_tokens_to_ids("<|end_of_text|>")
    assert cache.backend.end == eot
    nl = tok.convert_tokens_to_ids("Ċ")  # a text token as a stop token ("\n")
    a = tok.convert_tokens_to_ids("a")
    rows = [cache.matcher("regex", "a+", stops) for stops in ((eof,), (eof, eot), (nl,))]
    mask = new_bitmask(3, LLAMA_VOCAB)
    fill_rows(list(enumerate(rows)), mask)  # nothing written yet: no stop may come
    ok = allowed(mask, LLAMA_VOCAB)
    assert ok[:, a].all() and not ok[:, [eot, eof, nl]].any()
    for g in rows:
        assert g.accept(a)
    fill_rows(list(enumerate(rows)), mask)
    ok = allowed(mask, LLAMA_VOCAB)
    assert ok[:, a].all()
    assert ok[0, [eot, eof, nl]].tolist() == [False, True, False]
    assert ok[1, [eot, eof, nl]].tolist() == [True, True, False]
    assert ok[2, [eot, eof, nl]].tolist() == [False, False, True]
    assert not rows[0].accept(eot) and rows[0].dead  # not this row's stop
    assert rows[2].accept(nl) and rows[2].terminated
    assert rows[1].accept(eof) and rows[1].terminated


def test_the_mask_is_applied_to_the_named_rows_only():
    vocab, rows = 1000, [0, 2, 3]
    g = torch.Generator().manual_seed(0)
    words = (vocab + 31) // 32
    mask = torch.randint(-2**31, 2**31 - 1, (5, words), dtype=torch.int32, generator=g)
    logits = torch.randn(5, vocab, generator=g)
    got = logits.clone()
    apply_bitmask(got, rows, mask)
    # the reference: bit t % 32 of word t // 32, read one token at a time
    want = logits.clone()
    for r in rows:
        for t in range(vocab):
            if not (int(mask[r, t // 32]) >> (t % 32)) & 1:
                want[r, t] = float("-inf")
    assert torch.equal(got, want)
    everything = logits.clone()
    apply_bitmask(everything, list(range(5)), mask)
    assert torch.equal(everything[rows], want[rows]) and not torch.equal(everything, want)
