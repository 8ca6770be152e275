"""OpenAI's `chunking_strategy` (long audio cut at silences by Silero VAD): its values, the
windows, and the engine's text, on a tiny random multilingual Whisper checkpoint
(tests/whisper_checkpoints.py) in float32, 8 new tokens a decode (the tests' time). Oracles:
Silero's own `get_speech_timestamps` for where the speech is (on speech-like synthetic audio,
tests/speech_samples.py), HF `generate` on each window's samples for the text (joined); audio
without speech has no text. The endpoint's side (the `openai` client, verbose_json, 400s
naming the field) is in tests/test_audio_timestamps.py, on that file's server; its helpers
(`clips`, `long_regions`, `hf_timed`) are here."""

from __future__ import annotations

import numpy as np
import pytest

from seq2serve.encoders.audio_loader import AudioLimits, read_audio
from seq2serve.encoders.image_loader import MediaPolicy
from seq2serve.runtime.frontend.audio_chunks import Window, speech_windows
from seq2serve.runtime.frontend.chunking_strategy import VadOptions, form_value, vad_options
from seq2serve.runtime.frontend.transcription_job import TranscriptionJob
from seq2serve.tests.speech_samples import RATE, speech_and_silence
from seq2serve.tests.test_audio_api import hf_text
from seq2serve.tests.whisper_checkpoints import encoded, write_whisper_checkpoint

pytest.importorskip("soundfile")
silero_vad = pytest.importorskip("silero_vad")
openai = pytest.importorskip("openai")

# 34 s: speech at 0.5-2.5 s and 4-5.5 s (one window, the pause inside it), at 31-33 s (past
# 30 s from the first: a second window); the 25.5 s of silence between them is not decoded
LONG = [("silence", 0.5), ("speech", 2.0), ("silence", 1.5), ("speech", 1.5),
        ("silence", 25.5), ("speech", 2.0), ("silence", 1.0)]
SHORT = [("silence", 1.5), ("speech", 2.0), ("silence", 1.0)]
NEW = 8  # new tokens a decode


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A multilingual checkpoint without timestamp tokens (text)."""
    root = tmp_path_factory.mktemp("whisper-vad")
    return {"plain": str(write_whisper_checkpoint("multilingual", root / "p", seed=5))}


def vad_clips() -> dict:
    """The clips as WAV bytes and the samples the server reads from them."""
    out = {}
    for name, layout in (("long", LONG), ("short", SHORT)):
        wav = encoded(speech_and_silence(layout, seed=1), RATE, "WAV")
        out[name] = (wav, read_audio(wav, AudioLimits(max_seconds=100)))
    out["silent"] = (encoded(np.zeros(5 * RATE, np.float32), RATE, "WAV"), None)
    return out


def auto_regions(samples) -> list[tuple[int, int]]:
    """Silero's own regions with "auto"'s settings (OpenAI's defaults)."""
    return silero_regions(samples, threshold=0.5, speech_pad_ms=300, min_silence_duration_ms=500)


@pytest.fixture(scope="module")
def clips():
    return vad_clips()


@pytest.fixture(scope="module")
def long_regions(clips):
    return auto_regions(clips["long"][1])


def silero_regions(samples, **kwargs) -> list[tuple[int, int]]:
    """Silero's own speech timestamps (samples), with Whisper's 30 s as the longest region."""
    found = silero_vad.get_speech_timestamps(
        __import__("torch").from_numpy(samples), silero_vad.load_silero_vad(),
        sampling_rate=RATE, max_speech_duration_s=30, **kwargs)
    return [(r["start"], r["end"]) for r in found]


def hf_joined(path: str, samples, windows: list[Window]) -> str:
    """HF generate's text of each window's samples (German, NEW tokens), joined."""
    return "".join(hf_text(path, samples[w.start:w.end], NEW, language="de", task="transcribe")
                   for w in windows)


def hf_timed(path: str, samples, windows: list[Window]) -> tuple[str, list[tuple]]:
    """HF's default generate(return_timestamps=True) on each window: the texts joined, and
    the segments (start, end, text) moved on by the window's start (to the ms)."""
    import torch
    from transformers import (
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperTokenizer,
    )

    model = WhisperForConditionalGeneration.from_pretrained(path).eval()
    extractor = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)
    tok = WhisperTokenizer.from_pretrained(path)
    begin = model.generation_config.no_timestamps_token_id + 1
    texts, segments = [], []
    for w in windows:
        features = extractor(samples[w.start:w.end], sampling_rate=RATE,
                             return_tensors="pt").input_features
        with torch.no_grad():
            out = model.generate(features, return_timestamps=True, return_segments=True,
                                 max_new_tokens=NEW, language="de", task="transcribe")
        texts.append(tok.decode(out["sequences"][0].tolist(), skip_special_tokens=True))
        segments += [(round(float(s["start"]) + w.start / RATE, 3),
                      round(float(s["end"]) + w.start / RATE, 3),
                      tok.decode([t for t in s["tokens"].tolist() if t < begin]))
                     for s in out["segments"][0]]
    return "".join(texts), segments


def test_speech_windows_join_regions_up_to_30_s():
    """Regions join while the span fits a window; a longer region is cut every window."""
    assert speech_windows([]) == []
    assert speech_windows([(0, 10), (20, 30), (35, 40)], chunk=40) == [Window(0, 40, 0, 0)]
    assert speech_windows([(0, 10), (20, 30), (35, 41)], chunk=40) == [
        Window(0, 30, 0, 0), Window(35, 41, 0, 0)]
    assert speech_windows([(5, 100), (110, 120)], chunk=40) == [
        Window(5, 45, 0, 0), Window(45, 85, 0, 0), Window(85, 120, 0, 0)]


def test_chunking_strategy_values():
    """"auto", a server_vad object (a mapping, JSON text, or the openai client's bracketed
    form fields) onto Silero's settings; anything else a ValueError naming the field."""
    assert vad_options(None) is None and vad_options("auto") == VadOptions()
    given = vad_options('{"type": "server_vad", "threshold": 0.3, "prefix_padding_ms": 100}')
    assert given.silero_kwargs() == {"threshold": 0.3, "speech_pad_ms": 100,
                                     "min_silence_duration_ms": 500}
    fields = {"chunking_strategy[type]": "server_vad", "chunking_strategy[threshold]": "0.6",
              "chunking_strategy[silence_duration_ms]": "200", "language": "de"}
    assert vad_options(form_value(fields)) == VadOptions(0.6, 300, 200)
    for bad in ("sometimes", '{"type": "semantic_vad"}', {"type": "server_vad", "threshold": 2},
                {"type": "server_vad", "prefix_padding_ms": 1.5}, ["server_vad"],
                {"type": "server_vad", "eagerness": "low"}):
        with pytest.raises(ValueError, match="chunking_strategy"):
            vad_options(bad)


def test_windows_are_cut_where_silero_says(clips, long_regions):
    """The job's windows: Silero's regions (its own call, the mapped settings) joined as the
    clip was laid out (the first two in one window, the third past 30 s in its own); with
    other server_vad settings, Silero's regions for those."""
    _, samples = clips["long"]
    regions = long_regions
    assert len(regions) == 3, regions
    assert regions[0][0] < 0.5 * RATE < regions[0][1] < 4 * RATE < regions[1][0]
    assert regions[1][1] < 5.6 * RATE + 0.3 * RATE and regions[2][0] > 30 * RATE
    job = TranscriptionJob.of(samples, AudioLimits(max_seconds=100), MediaPolicy(),
                              vad=vad_options("auto"))
    assert job.spans == (Window(regions[0][0], regions[1][1], 0, 0),
                         Window(regions[2][0], regions[2][1], 0, 0))
    assert [len(w) for w in job.windows] == [w.end - w.start for w in job.spans]
    _, short = clips["short"]
    other = VadOptions(threshold=0.7, prefix_padding_ms=0, silence_duration_ms=100)
    [(start, end)] = silero_regions(short, threshold=0.7, speech_pad_ms=0,
                                    min_silence_duration_ms=100)
    job = TranscriptionJob.of(short, AudioLimits(), MediaPolicy(), vad=other)
    assert job.spans == (Window(start, end, 0, 0),) and start > 1.4 * RATE


def test_the_engine(ckpt, clips, long_regions):
    """Seq2SeqEngine.transcribe(chunking_strategy="auto"): HF's text of each window, joined;
    no speech: no text, no window, nothing decoded (no language to detect either)."""
    from seq2serve.runtime.frontend.engine import Seq2SeqEngine

    path = ckpt["plain"]
    wav, samples = clips["long"]
    windows = speech_windows(long_regions)
    with Seq2SeqEngine(model_path=path, device="cpu", dtype="float32",
                       max_audio_seconds=100) as engine:
        got = engine.transcribe(wav, language="de", chunking_strategy="auto",
                                sampling_params={"max_new_tokens": NEW})
        silent = engine.transcribe(clips["silent"][0], chunking_strategy="auto")
        with pytest.raises(ValueError, match="chunking_strategy"):
            engine.transcribe(wav, language="de", chunking_strategy="auto", chunk_length_s=20)
    expected = hf_joined(path, samples, windows)
    assert got["text"] == expected and expected.strip()
    assert got["meta_info"]["windows"] == 2 and got["meta_info"]["completion_tokens"] == 2 * NEW
    assert silent["text"] == "" and silent["meta_info"]["windows"] == 0
    assert silent["meta_info"]["completion_tokens"] == 0
