"""Whisper's timestamp rules against Hugging Face in float32, on tiny random checkpoints whose
vocabularies end with the 1,501 timestamp tokens (a multilingual one whose first timestamp is
capped, an English-only one whose is not): through `Seq2SeqEngine`, greedy and 4-beam search
give HF `generate(return_timestamps=True)`'s tokens for one window exactly (one generate
call: `force_unique_generate_call=True`), and a request without timestamps in the same batch
keeps its own tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seq2serve.runtime.config.timestamp_tokens import TimestampTokens
from seq2serve.runtime.executor.timestamp_rules import TimestampRows
from seq2serve.runtime.frontend.engine import Seq2SeqEngine
from seq2serve.runtime.frontend.transcription import WhisperPrompt
from seq2serve.tests.whisper_checkpoints import (
    clip,
    hf_models,
    tiny_checkpoints,
    write_whisper_checkpoint,
)

pytest.importorskip("soundfile")
pytest.importorskip("soxr")

MAX_NEW = 20
KINDS = (("multilingual", "de"), ("english", None))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoints(tmp_path_factory.mktemp("whisper-ts"), timestamps=True)


@pytest.fixture(scope="module")
def hf(ckpt):
    return hf_models(ckpt)


def hf_tokens(hf, kind: str, samples: np.ndarray, language: str | None,
              **kwargs) -> list[int]:
    """HF's generated tokens with timestamps for one window (the prompt cut off, and what
    follows the end of text)."""
    model, extractor = hf[kind]
    features = extractor(samples, sampling_rate=16_000, return_tensors="pt").input_features
    lang = {} if language is None else {"language": language, "task": "transcribe"}
    with torch.no_grad():
        seq = model.generate(features, max_new_tokens=MAX_NEW, return_timestamps=True,
                             force_unique_generate_call=True, **lang, **kwargs)[0].tolist()
    prompt = WhisperPrompt.from_model(model.name_or_path).tokens(language, timestamps=True)
    assert seq[:len(prompt)] == prompt
    tokens = seq[len(prompt):]
    eos = model.generation_config.eos_token_id
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


@pytest.fixture(scope="module")
def engines(ckpt):
    with Seq2SeqEngine(model_path=ckpt["multilingual"], device="cpu", dtype="float32") as m, \
            Seq2SeqEngine(model_path=ckpt["english"], device="cpu", dtype="float32") as e:
        yield {"multilingual": m, "english": e}


def stamped(ckpt, kind: str, language: str | None) -> list[int]:
    return WhisperPrompt.from_model(ckpt[kind]).tokens(language, timestamps=True)


@pytest.mark.parametrize("kind,language", KINDS)
def test_greedy_timestamps_are_hfs(ckpt, hf, engines, kind, language):
    """Several clips as one batch: each row's rules from its own tokens."""
    clips = [clip(s) for s in range(4)]
    got = engines[kind].generate(audio_data=clips,
                                 decoder_input_ids=stamped(ckpt, kind, language),
                                 sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0,
                                                  "timestamps": True})
    expected = [hf_tokens(hf, kind, c, language) for c in clips]
    assert [r["output_ids"] for r in got] == expected
    begin = hf[kind][0].generation_config.no_timestamps_token_id + 1
    pairs = sum(a >= begin and b >= begin for e in expected for a, b in zip(e, e[1:]))
    assert all(e[0] >= begin for e in expected) and pairs >= 2, "the rules should show"


@pytest.mark.parametrize("kind,language", KINDS)
def test_beam_search_timestamps_are_hfs(ckpt, hf, engines, kind, language):
    for seed in (0, 3):
        got = engines[kind].generate(
            audio_data=clip(seed), decoder_input_ids=stamped(ckpt, kind, language),
            sampling_params={"max_new_tokens": MAX_NEW, "num_beams": 4, "timestamps": True})
        assert got["output_ids"] == hf_tokens(hf, kind, clip(seed), language, num_beams=4)


def test_a_batch_with_and_without_timestamps(ckpt, hf, engines):
    """One request with timestamps and one without, admitted together: each gets HF's tokens
    for what it asked."""
    kind, language = "multilingual", "de"
    plain = WhisperPrompt.from_model(ckpt[kind]).tokens(language)
    got = engines[kind].generate(
        audio_data=[clip(1), clip(2)],
        decoder_input_ids=[stamped(ckpt, kind, language), plain],
        sampling_params=[{"max_new_tokens": MAX_NEW, "temperature": 0, "timestamps": True},
                         {"max_new_tokens": MAX_NEW, "temperature": 0}])
    model, extractor = hf[kind]
    features = extractor(clip(2), sampling_rate=16_000, return_tensors="pt").input_features
    with torch.no_grad():
        without = model.generate(features, max_new_tokens=MAX_NEW, language=language,
                                 task="transcribe", return_timestamps=False,
                                 force_unique_generate_call=True)[0].tolist()
    assert got[0]["output_ids"] == hf_tokens(hf, kind, clip(1), language)
    assert plain + got[1]["output_ids"] == without


def test_a_model_without_timestamp_tokens_refuses_them(tmp_path):
    """The tokens come from generation_config.json; a vocabulary that ends at
    `<|notimestamps|>` has none, and a request asking for them is refused naming it."""
    assert TimestampTokens.from_generation_config({"no_timestamps_token_id": 9}, 10, 0) is None
    path = write_whisper_checkpoint("english", tmp_path / "e")
    with Seq2SeqEngine(model_path=str(path), device="cpu", dtype="float32") as engine, \
            pytest.raises(ValueError, match="timestamps: this model has no timestamp tokens"):
        engine.generate(audio_data=clip(0), sampling_params={"timestamps": True,
                                                             "max_new_tokens": 4})


def test_the_bounds_follow_hfs_rules():
    """Each rule on a hand-made history (ids: 10 = EOS, 20 = <|notimestamps|>, 21.. stamps)."""
    tokens = TimestampTokens(no_timestamps=20, eos=10, max_initial_index=3)
    histories = [[], [21], [21, 5], [21, 5, 24], [21, 5, 24, 24], [22, 5, 6]]
    rows = TimestampRows.of(list(range(len(histories))), histories, tokens, 40, "cpu")
    assert rows.bounds.tolist() == [  # (text_end, stamp_lo, stamp_hi)
        [21, 21, 25],  # first: a timestamp, at most 3 in
        [0, 40, 40],  # after the first timestamp: no timestamp
        [0, 22, 40],  # after text: above the last timestamp, or text
        [10, 24, 40],  # a segment's end: its pair (the same or later) or the end of text
        [0, 40, 40],  # after a pair: text
        [0, 23, 40],  # text goes on
    ]
    logits = torch.zeros(len(histories), 40)
    logits[5, 30:] = 5.0  # the timestamps outweigh every text token: text is banned
    rows.apply(logits)
    assert torch.isinf(logits[5, :21]).all() and not torch.isinf(logits[5, 30:]).any()
    assert torch.isinf(logits[:, 20]).all()  # <|notimestamps|>, never
    assert torch.isinf(logits[2, :21]).all()  # 18 equal timestamps outweigh one text token
    assert not torch.isinf(logits[4, :20]).any() and torch.isinf(logits[4, 21:]).all()


def test_segments_are_hf_tokenizers_offsets(ckpt):
    """`timestamp_segments.segments` against HF's `decode(..., output_offsets=True)` on
    hand-made outputs: pairs, a single last timestamp, text after the last one, the end of
    text, one timestamp only, none."""
    from transformers import WhisperTokenizer

    from seq2serve.runtime.frontend.timestamp_segments import segments

    tok = WhisperTokenizer.from_pretrained(ckpt["multilingual"])
    b = WhisperPrompt.from_model(ckpt["multilingual"]).no_timestamps_token_id + 1
    eos = tok.eos_token_id
    hello, world = tok(" hello", add_special_tokens=False)["input_ids"], \
        tok(" world", add_special_tokens=False)["input_ids"]
    for ids in ([b, *hello, b + 40, b + 40, *world, b + 90, eos],
                [b + 2, *hello, b + 40, b + 41, *world, b + 90, b + 90, eos],
                [b, *hello, b + 40, b + 40, *world],
                [b + 3, *hello, *world, b + 7],
                [b, *hello, *world, eos],
                [*hello, *world, eos]):
        want = [(o["timestamp"][0], o["timestamp"][1], o["text"])
                for o in tok.decode(ids, output_offsets=True)["offsets"]]
        got = [(s.start, s.end, s.text) for s in segments(ids, b, tok.decode)]
        assert [t for *_, t in got] == [t for *_, t in want], ids
        assert [x for s in got for x in s[:2]] == pytest.approx(
            [x for s in want for x in s[:2]], abs=1e-9), ids


def test_text_without_timestamps_drops_timestamp_tokens_as_hf_decodes(ckpt, hf, engines):
    """Without timestamps a model may still choose timestamp tokens (HF's generate does not
    ban them); HF's tokenizer leaves them out of the text, and so does the engine's text,
    streamed or whole: HF generate's tokens, HF's decode of them."""
    from transformers import WhisperTokenizer

    model, extractor = hf["english"]
    tokenizer = WhisperTokenizer.from_pretrained(ckpt["english"])
    first_stamp = tokenizer.convert_tokens_to_ids("<|0.00|>")
    samples = clip(2)
    features = extractor(samples, sampling_rate=16_000, return_tensors="pt").input_features
    with torch.no_grad():
        seq = model.generate(features, max_new_tokens=MAX_NEW,
                             force_unique_generate_call=True)[0].tolist()
    prompt = WhisperPrompt.from_model(ckpt["english"]).tokens(None)
    expected = seq[len(prompt):] if seq[:len(prompt)] == prompt else seq  # (HF's, after it)
    engine = engines["english"]
    sp = {"max_new_tokens": MAX_NEW, "temperature": 0}
    got = engine.generate(audio_data=samples, decoder_input_ids=prompt, sampling_params=sp)
    assert got["output_ids"] == expected
    assert any(t >= first_stamp for t in expected), "this clip's tokens have timestamps"
    text = tokenizer.decode(expected, skip_special_tokens=True)
    assert got["text"] == text and "<|" not in text
    streamed = engine.generate(audio_data=samples, decoder_input_ids=prompt,
                               sampling_params=sp, stream=True)
    assert "".join(c["text"] for c in streamed) == text
