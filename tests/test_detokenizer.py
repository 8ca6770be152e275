"""Incremental detokenization with the real T5 (SentencePiece) and Llama 3 (byte BPE) tokenizers."""

from __future__ import annotations

import random

import pytest

from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.frontend.incremental_detokenizer import IncrementalDetokenizer
from seq2serve.runtime.tools.demo_checkpoint import ASSETS

TEXTS = [
    "Hello world, how are you?",
    "Grüße aus Köln — straße, naïve café, Ελληνικά, русский",
    "日本語のテキストと中文，한국어 🎉🎉 emoji 👩‍👩‍👧 families",
    "  leading spaces,   runs   of spaces\nand\n\nnewlines\ttabs",
    "a ▁ literal metaspace and <unk> text",
    "numbers 1,234.56 and symbols @#$%^&*() [x] {y}",
]


@pytest.fixture(scope="module", params=["t5-tokenizer", "llama3-tokenizer"])
def tok(request):
    return load_tokenizer(str(ASSETS / request.param))


def _stream(tok, ids, stop=None, skip=True, min_tokens=0):
    """The pieces shown while `ids` arrive one by one; with `stop`, the request finishes as the
    scheduler finishes it: at the first token (from `min_tokens` on) whose text holds one."""
    d = IncrementalDetokenizer(tok, skip_special_tokens=skip, stop=stop)
    pieces = []
    for n, t in enumerate(ids, 1):
        text = tok.decode(ids[:n], skip_special_tokens=skip)
        before = tok.decode(ids[:n - 1], skip_special_tokens=skip)
        hit = next((s for s in stop or [] if n >= min_tokens
                    and text.find(s, max(0, len(before) - len(s) + 1)) >= 0), None)
        if hit is not None:
            pieces.append(d.add([t], finished=True, matched_stop=hit))
            return pieces
        pieces.append(d.add([t]))
    pieces.append(d.add([], finished=True))
    return pieces


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_are_whole_characters_and_add_up(tok, text):
    ids = tok(text, add_special_tokens=False).input_ids
    full = tok.decode(ids, skip_special_tokens=True)
    pieces = _stream(tok, ids)
    assert "".join(pieces) == full
    if "\ufffd" not in full:
        assert not any("\ufffd" in p for p in pieces)
    so_far = ""
    for p in pieces:  # what was shown is never taken back
        so_far += p
        assert full.startswith(so_far)


def test_random_token_sequences_add_up(tok):
    rng = random.Random(0)
    for _ in range(100):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 30))]
        assert "".join(_stream(tok, ids)) == tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("skip", [True, False])
def test_the_last_tokens_arriving_with_finished_add_up(tok, skip):
    """The end is decoded incrementally too (no decode of the whole text): the tokens that
    come with `finished`, several at once, a partial character among them, still add up to
    the tokenizer's decode of the whole."""
    rng = random.Random(1)
    emoji = tok("日本語 🎉👩‍👩‍👧", add_special_tokens=False).input_ids
    partial = [emoji[:n] for n in range(1, len(emoji))  # ends inside a character
               if tok.decode(emoji[:n]).endswith("\ufffd")]
    for k in range(150):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 40))]
        ids += rng.choice(partial) if partial and k % 2 else []
        d = IncrementalDetokenizer(tok, skip_special_tokens=skip)
        cut, shown = rng.randrange(len(ids) + 1), ""
        while len(d.ids) < cut:
            shown += d.add(ids[len(d.ids):min(cut, len(d.ids) + rng.randrange(1, 4))])
        shown += d.add(ids[len(d.ids):], finished=True)
        assert shown == tok.decode(ids, skip_special_tokens=skip)


def test_special_tokens_kept_when_asked(tok):
    ids = tok("Hello there").input_ids  # with the tokenizer's BOS/EOS
    kept = "".join(_stream(tok, ids, skip=False))
    assert kept == tok.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("stop", ["how are", "o w", "?"])
def test_stop_strings_are_cut_and_never_shown(tok, stop):
    text = "Hello world, how are you? Fine."
    ids = tok(text, add_special_tokens=False).input_ids
    full = tok.decode(ids, skip_special_tokens=True)
    pieces = _stream(tok, ids, stop=[stop])
    shown = "".join(pieces)
    assert shown == full[: full.index(stop)]
    assert stop not in shown


def test_a_stop_string_before_min_new_tokens_stays_in_the_text(tok):
    """The scheduler ignores stop strings until min_new_tokens (as HF does): the text then
    keeps the early occurrence and is cut only where the request really stopped."""
    text = "one two, one two, one two"
    ids = tok(text, add_special_tokens=False).input_ids
    full = tok.decode(ids, skip_special_tokens=True)
    first_two = len(tok("one two", add_special_tokens=False).input_ids)
    shown = "".join(_stream(tok, ids, stop=["two"], min_tokens=first_two + 2))
    assert shown == full[: full.index("two", full.index("two") + 1)]
    assert shown.count("two") == 1


@pytest.mark.parametrize("skip", [True, False])
def test_the_direct_decode_equals_the_tokenizers_decode(tok, skip):
    """The detokenizer decodes lists of ints through the tokenizer's `_decode` (skipping
    `decode`'s per-element conversion): the same text on random ids, special ones included."""
    from seq2serve.runtime.frontend.incremental_detokenizer import _decoder

    rng = random.Random(7)
    special = list(tok.all_special_ids)
    direct = _decoder(tok)
    assert direct != tok.decode  # the fast path is the one under test
    for _ in range(200):
        ids = [rng.choice(special) if rng.random() < 0.1 else rng.randrange(len(tok))
               for _ in range(rng.randrange(0, 12))]
        assert direct(ids, skip_special_tokens=skip) == tok.decode(ids,
                                                                   skip_special_tokens=skip)


def test_the_manager_decodes_a_batch_as_each_request_alone(tok):
    """The detokenizer process decodes every request's windows of a step in one call (per
    skip setting): its texts equal each request's own IncrementalDetokenizer, with requests
    of both settings, stop strings, several steps of one request merged into one batch, and
    requests finishing at different steps."""
    from seq2serve.runtime.frontend.detokenizer_manager import DetokenizerManager
    from seq2serve.runtime.messages.io_struct import (
        BatchTokenOutput,
        DetokenizeSettings,
        TokenOutput,
    )

    rng = random.Random(2)
    manager = DetokenizerManager(tok)
    emoji = tok("日本語 🎉 straße", add_special_tokens=False).input_ids
    reqs = {}
    for k in range(12):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 25))] + emoji[:k % 5]
        settings = DetokenizeSettings(stop=("e",) if k % 4 == 3 else (),
                                      skip_special_tokens=k % 3 != 0)
        reqs[f"r{k}"] = (ids, settings, IncrementalDetokenizer(
            tok, skip_special_tokens=settings.skip_special_tokens, stop=list(settings.stop)))
    sent = {rid: 0 for rid in reqs}
    got = {rid: "" for rid in reqs}
    want = {rid: "" for rid in reqs}
    while any(sent[rid] < len(ids) for rid, (ids, _, _) in reqs.items()):
        outs = []
        for _ in range(rng.randrange(1, 3)):  # one or two steps merged into one batch
            for rid, (ids, settings, alone) in reqs.items():
                if sent[rid] >= len(ids):
                    continue
                new = ids[sent[rid]:sent[rid] + rng.randrange(1, 4)]
                first, sent[rid] = sent[rid] == 0, sent[rid] + len(new)
                done = sent[rid] >= len(ids)
                outs.append(TokenOutput(rid=rid, new_token_ids=new,
                                        finished_reason={"type": "length"} if done else None,
                                        detokenize=settings if first else None))
                want[rid] += alone.add(new, finished=done)
        manager.handle(BatchTokenOutput(outs))
        for out in outs:
            got[out.rid] += out.text
    assert got == want and not manager.states
