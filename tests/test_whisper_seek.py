"""HF's re-decoding of a Whisper window from its last complete segment
(`runtime/frontend/whisper_seek.py`), against HF in float32 on the tiny random checkpoints
with timestamp tokens (tests/whisper_checkpoints.py): `Seq2SeqEngine.transcribe(...,
return_timestamps=True)` gives HF's default `generate(return_timestamps=True)` (no
`force_unique_generate_call`: its sequential loop, which decodes the window again from
`seek` on zero-padded log-mel frames) token for token, its `sequences` and its `segments`,
greedy and with beams; `force_unique_generate_call=True` keeps one decode. The segment rules
are checked against HF's `_retrieve_segment` itself on hand-made decodes."""

from __future__ import annotations

import pytest
import torch

from seq2serve.runtime.frontend.engine import Seq2SeqEngine
from seq2serve.runtime.frontend.whisper_seek import retrieve_segments
from seq2serve.tests.whisper_checkpoints import clip, hf_models, tiny_checkpoints

pytest.importorskip("soundfile")
pytest.importorskip("soxr")

MAX_NEW = 20


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoints(tmp_path_factory.mktemp("whisper-seek"), timestamps=True)


@pytest.fixture(scope="module")
def hf(ckpt):
    return hf_models(ckpt)


def hf_default(hf, kind: str, samples, language: str | None, prompt: str | None = None,
               **kwargs) -> dict:
    """HF's default `generate(return_timestamps=True)` for one window: its `sequences` and
    `segments` (start, end, tokens), how many generate calls it made, and the one call's
    tokens (`force_unique_generate_call=True`, up to the end of text). `prompt`: the text
    before (HF's `prompt_ids`, before every decode's forced tokens)."""
    from transformers import WhisperTokenizer

    model, extractor = hf[kind]
    features = extractor(samples, sampling_rate=16_000, return_tensors="pt").input_features
    lang = {} if language is None else {"language": language, "task": "transcribe"}
    skip = 1 if language is None else 3
    if prompt is not None:
        ids = WhisperTokenizer.from_pretrained(model.name_or_path).get_prompt_ids(prompt)
        lang["prompt_ids"] = torch.tensor(ids)
        skip += len(ids)
    with torch.no_grad():
        out = model.generate(features, max_new_tokens=MAX_NEW, return_timestamps=True,
                             return_segments=True, **lang, **kwargs)
        once = model.generate(features, max_new_tokens=MAX_NEW, return_timestamps=True,
                              force_unique_generate_call=True, **lang, **kwargs)[0].tolist()
    segs = out["segments"][0]
    eos = model.generation_config.eos_token_id
    once = once[skip:]
    return {"sequence": out["sequences"][0].tolist(),
            "segments": [(float(s["start"]), float(s["end"]), s["tokens"].tolist())
                         for s in segs],
            "decodes": len({id(s["result"]) for s in segs}),
            "once": once[:once.index(eos) + 1] if eos in once else once}


@pytest.mark.parametrize("kind, language, seeds, beams, prompt", [
    ("multilingual", "de", (0,), 1, None), ("english", None, (0, 2), 1, None),
    ("multilingual", "de", (3,), 4, None), ("multilingual", "de", (1,), 1, "the sea")])
def test_transcribe_redecodes_as_hfs_default(ckpt, hf, kind, language, seeds, beams, prompt):
    """Greedy, with beams, with previous text (HF's `prompt_ids`: before every decode)."""
    with Seq2SeqEngine(model_path=ckpt[kind], device="cpu", dtype="float32") as engine:
        for seed in seeds:
            want = hf_default(hf, kind, clip(seed), language, prompt, num_beams=beams)
            assert want["decodes"] >= 2 and want["sequence"] != want["once"], \
                "HF should decode the window again"
            got = engine.transcribe(clip(seed), language=language, return_timestamps=True,
                                    prompt=prompt,
                                    sampling_params={"max_new_tokens": MAX_NEW,
                                                     "num_beams": beams})
            assert got["output_ids"] == want["sequence"]
            assert got["meta_info"]["decodes"] == want["decodes"]
            segs = got["segments"]
            assert [s["tokens"] for s in segs] == [t for *_, t in want["segments"]]
            assert [x for s in segs for x in (s["start"], s["end"])] == pytest.approx(
                [x for a, b, _ in want["segments"] for x in (a, b)], abs=1e-9)
            once = engine.transcribe(clip(seed), language=language, return_timestamps=True,
                                     force_unique_generate_call=True, prompt=prompt,
                                     sampling_params={"max_new_tokens": MAX_NEW,
                                                      "num_beams": beams})
            assert once["output_ids"] == want["once"] and "decodes" not in once["meta_info"]


def test_segments_are_hfs_retrieve_segment():
    """`retrieve_segments` against HF's `_retrieve_segment` (ids 10..: timestamps): pairs
    with text after the last one, a pair at the end, a single last timestamp, no pair (a
    last timestamp, `<|0.00|>` only, none), nothing; from seek 0 and from a later seek."""
    from transformers.models.whisper.generation_whisper import WhisperGenerationMixin

    b = 10
    cases = ([b, 1, 2, b + 40, b + 40, 3, b + 90, b + 95, 4, 5],
             [b + 2, 1, b + 40, b + 41, 2, b + 90, b + 90],
             [b, 1, b + 40, b + 40, 2, b + 90],
             [b + 3, 1, 2, b + 7], [b, 1, 2], [1, 2], [])
    for seek in (0, 1333, 2970, 2946):  # 30 and 54 frames left: HF's float32 end
        for ids in cases:
            seq = torch.tensor(ids, dtype=torch.long)
            want, offset = WhisperGenerationMixin._retrieve_segment(
                seek_sequence=seq, seek_outputs=[None], time_offset=torch.tensor(
                    [seek], dtype=torch.float64) * 0.02 / 2,
                timestamp_begin=b, seek_num_frames=torch.tensor([3000 - seek]),
                time_precision=0.02, time_precision_features=0.01, input_stride=2,
                prev_idx=0, idx=0, return_token_timestamps=False,
                decoder_input_ids=torch.zeros(1, 3))
            got, moved = retrieve_segments(ids, b, seek)
            assert moved == int(offset), (seek, ids)
            assert [s.tokens for s in got] == [w["tokens"].tolist() for w in want]
            assert [x for s in got for x in (s.start, s.end)] == pytest.approx(
                [float(w[k]) for w in want for k in ("start", "end")], abs=1e-9)


def test_the_encoders_frames_are_hfs_input_segment():
    """The model's seeked features (`WindowBatch.seeks`) are HF's `_get_input_segment`: the
    frames from `seek` on, zero-padded back to 3,000; a seek out of range is refused."""
    from transformers.models.whisper.generation_whisper import WhisperGenerationMixin

    from seq2serve.models.whisper.model import _seeked
    from seq2serve.runtime.frontend.generate_request import GenerateReqInput

    feats = torch.randn(3, 8, 3000)
    seeks = (0, 7, 2999)
    seek = torch.tensor(seeks)
    want = WhisperGenerationMixin._get_input_segment(
        feats, seek, (3000 - seek).clamp(max=3000), 3000, 3, [0, 1, 2])
    assert torch.equal(_seeked(feats, seeks), want)
    assert _seeked(feats, ()) is feats
    for bad in (3000, -1, True):
        with pytest.raises(ValueError, match="audio_seek"):
            GenerateReqInput(audio_data=clip(0), audio_seek=bad).normalize()
    with pytest.raises(ValueError, match="audio_seek"):
        GenerateReqInput(input_ids=[1, 2], audio_seek=5).normalize()


def test_a_window_ends_where_hf_would_seek_by_nothing():
    """A decode whose last pair is at `<|0.00|>` would send HF's loop back to the same frames
    forever; the window ends there instead. The end of text is left off, a single last
    timestamp ends the window."""
    from seq2serve.runtime.frontend.whisper_seek import WindowSeek

    b, eos = 10, 3
    w = WindowSeek(b, eos)
    w.add([b, 1, b, b, 2])
    assert w.done and w.sequence == [b, 1, b, b] and w.decodes == 1
    w = WindowSeek(b, eos)
    w.add([b, 1, b + 5, b + 5, 2, eos])  # text after the last pair: again from 0.10 s
    assert not w.done and w.seek == 10
    w.add([b, 1, b + 4, eos])  # a single last timestamp: done
    assert w.done and w.sequence == [b, 1, b + 5, b + 5, b, 1, b + 4]
    assert [(s.start, s.end, s.seek) for s in w.segments] == [(0.0, 0.1, 0), (0.1, 0.18, 10)]
