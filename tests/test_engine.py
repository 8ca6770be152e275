"""The Python API, end to end through the scheduler and detokenizer processes."""

from __future__ import annotations

import asyncio
import time

import pytest

from seq2serve import Seq2SeqEngine
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.tests.helpers import SOURCES, hf_greedy

GREEDY = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(t5_dir):
    with Seq2SeqEngine(model_path=t5_dir, device="cpu", max_total_tokens=8192,
                       max_cross_tokens=8192) as e:
        yield e
        e.check_integrity()


@pytest.fixture(scope="module")
def tok(t5_dir):
    return load_tokenizer(t5_dir)


def test_single_prompt_returns_a_dict(engine, tok, t5_dir):
    out = engine.generate(prompt=SOURCES[0], sampling_params=GREEDY)
    ref = hf_greedy(t5_dir, tok(SOURCES[0]).input_ids, 10)
    assert out["output_ids"] == ref
    assert out["text"] == tok.decode(ref, skip_special_tokens=True)
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == len(tok(SOURCES[0]).input_ids)
    assert meta["completion_tokens"] == 10
    assert meta["finish_reason"] == {"type": "length"}


def test_batch_of_prompts_and_input_ids(engine, tok, t5_dir):
    outs = engine.generate(prompt=SOURCES, sampling_params=GREEDY)
    assert isinstance(outs, list) and len(outs) == len(SOURCES)
    for src, out in zip(SOURCES, outs):
        assert out["output_ids"] == hf_greedy(t5_dir, tok(src).input_ids, 10)
    ids = [tok(s).input_ids for s in SOURCES[:3]]
    by_ids = engine.generate(input_ids=ids, sampling_params=GREEDY)
    assert [o["output_ids"] for o in by_ids] == [o["output_ids"] for o in outs[:3]]


def test_forced_decoder_prefix(engine, tok, t5_dir):
    src = tok(SOURCES[1]).input_ids
    prefix = [0, 1566, 12]
    out = engine.generate(input_ids=src, decoder_input_ids=prefix, sampling_params=GREEDY)
    assert out["output_ids"] == hf_greedy(t5_dir, src, 10, decoder_input_ids=prefix)
    # the start token is prepended when the prefix lacks it
    out2 = engine.generate(input_ids=src, decoder_input_ids=prefix[1:], sampling_params=GREEDY)
    assert out2["output_ids"] == out["output_ids"]


def test_stream_concatenates_to_the_full_result(engine):
    full = engine.generate(prompt=SOURCES[3], sampling_params=GREEDY)
    chunks = list(engine.generate(prompt=SOURCES[3], sampling_params=GREEDY, stream=True))
    assert "".join(c["text"] for c in chunks) == full["text"]
    assert [t for c in chunks for t in c["output_ids"]] == full["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length"}
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_n_samples_and_seeds(engine):
    sp = {"max_new_tokens": 8, "temperature": 1.5, "seed": 5, "n": 3, "ignore_eos": True}
    outs = engine.generate(prompt=SOURCES[2], sampling_params=sp)
    assert len(outs) == 3
    assert len({tuple(o["output_ids"]) for o in outs}) > 1  # n samples differ
    again = engine.generate(prompt=SOURCES[2], sampling_params=sp)
    assert [o["output_ids"] for o in again] == [o["output_ids"] for o in outs]


def test_stop_string_is_cut_from_the_text(engine, tok):
    full = engine.generate(prompt=SOURCES[0], sampling_params=GREEDY)
    words = full["text"].split()
    stop = words[2][:3]
    out = engine.generate(prompt=SOURCES[0], sampling_params={**GREEDY, "stop": stop})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert stop not in out["text"] and full["text"].startswith(out["text"])
    streamed = engine.generate(prompt=SOURCES[0], sampling_params={**GREEDY, "stop": stop},
                               stream=True)
    assert "".join(c["text"] for c in streamed) == out["text"]


def test_text_and_tokens_agree_on_a_stop_string_seen_before_min_new_tokens(engine, tok):
    """Stop strings count from min_new_tokens on (the scheduler's rule): an occurrence before
    that stays in the text, and the text is cut only where the tokens stopped."""
    full = engine.generate(prompt=SOURCES[0], sampling_params=GREEDY)
    stop = full["text"].split()[0][:3]  # in the first word: before min_new_tokens
    first = full["text"].index(stop)
    sp = {**GREEDY, "stop": stop, "min_new_tokens": 4}
    out = engine.generate(prompt=SOURCES[0], sampling_params=sp)
    text, reason = out["text"], out["meta_info"]["finish_reason"]
    assert text.startswith(full["text"][: first + len(stop)])  # the early one is kept
    shown = tok.decode(out["output_ids"], skip_special_tokens=True)
    if reason["type"] == "stop":  # cut at the occurrence the last token completed
        assert text == shown[: shown.rindex(stop)] and shown.rindex(stop) > first
    else:
        assert reason == {"type": "length"} and text == full["text"]
    streamed = engine.generate(prompt=SOURCES[0], sampling_params=sp, stream=True)
    assert "".join(c["text"] for c in streamed) == text


def test_async_generate(engine):
    async def main():
        single = await engine.async_generate(prompt=SOURCES[4], sampling_params=GREEDY)
        stream = await engine.async_generate(prompt=SOURCES[4], sampling_params=GREEDY,
                                             stream=True)
        pieces = [c["text"] async for c in stream]
        both = await asyncio.gather(*[engine.async_generate(prompt=s, sampling_params=GREEDY)
                                      for s in SOURCES[:4]])
        return single, pieces, both

    single, pieces, both = asyncio.run(main())
    assert "".join(pieces) == single["text"]
    assert [b["output_ids"] for b in both] == [
        o["output_ids"] for o in engine.generate(prompt=SOURCES[:4], sampling_params=GREEDY)]


@pytest.mark.parametrize("kwargs, message", [
    ({"prompt": ""}, "empty"),
    ({"prompt": []}, "empty"),
    ({"prompt": ["ok", 3]}, "text"),
    ({"input_ids": []}, "empty"),
    ({"input_ids": [1, 2, 10**7]}, "outside"),
    ({"input_ids": [[1, 2], "x"]}, "input_ids"),
    ({"prompt": "x", "input_ids": [1]}, "exactly one"),
    ({"prompt": "word " * 3000}, "longer than"),
    ({"prompt": "x", "sampling_params": {"max_new_tokens": 10**6}}, "max_new_tokens"),
    ({"prompt": "x", "sampling_params": {"bogus": 1}}, "bogus"),
    ({"prompt": "x", "sampling_params": {"top_p": 7}}, "top_p"),
    ({"prompt": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
    ({"prompt": "x", "image_data": [b"\x89PNG"]}, "takes no images"),
])
def test_bad_input_raises_and_the_engine_keeps_serving(engine, kwargs, message, tok, t5_dir):
    with pytest.raises(ValueError, match=message):
        engine.generate(**kwargs)
    out = engine.generate(prompt=SOURCES[2], sampling_params=GREEDY)
    assert out["output_ids"] == hf_greedy(t5_dir, tok(SOURCES[2]).input_ids, 10)
    engine.check_integrity()


def test_early_stop_of_a_stream_aborts_the_request(engine):
    stream = engine.generate(prompt=SOURCES[5], stream=True,
                             sampling_params={"max_new_tokens": 500, "ignore_eos": True})
    next(stream)
    stream.close()
    for _ in range(100):
        if engine.stats()["running_requests"] == 0:
            break
        time.sleep(0.05)
    assert engine.stats()["running_requests"] == 0
    engine.check_integrity()


def test_engine_start_errors_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        Seq2SeqEngine(model_path=str(tmp_path), device="cpu")
    with pytest.raises(ValueError, match="unknown engine option"):
        Seq2SeqEngine(model_path=str(tmp_path), colour="blue")
    with pytest.raises(ValueError, match="api_server_count is the HTTP server's"):
        Seq2SeqEngine(model_path=str(tmp_path), api_server_count=2)
