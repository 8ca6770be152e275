"""Whisper timestamps through OpenAI's /v1/audio/* with the unmodified `openai` client, the
engine and the command line, on tiny random checkpoints with timestamp tokens
(tests/whisper_checkpoints.py) in float32: `verbose_json` segments, `srt` and `vtt` cues are
HF's for one window (its default `generate(return_timestamps=True)`: the window decoded again
from its last complete segment, its `sequences` and `segments`; with
`force_unique_generate_call` the tokens of one call, cut into segments by HF's tokenizer,
`decode(..., output_offsets=True)`); bad values are 400s naming the field. With
`chunking_strategy` (Silero VAD's windows, tests/test_audio_vad.py) the segments are HF's of
each window moved on by its start."""

from __future__ import annotations

import re

import httpx
import pytest
import torch

from seq2serve.tests.server_helpers import ServerProcess
from seq2serve.tests.whisper_checkpoints import (
    clip,
    encoded,
    long_clip,
    tiny_checkpoints,
)

pytest.importorskip("soundfile")
openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoints(tmp_path_factory.mktemp("whisper-ts-api"), timestamps=True)


@pytest.fixture(scope="module")
def server(ckpt):
    s = ServerProcess(ckpt["multilingual"], "--max-audio-seconds", "100")
    try:
        yield s
    finally:
        s.kill()


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def hf_whisper(path: str, samples):
    """HF's model, the clip's log-mel features as its extractor makes them, its tokenizer."""
    from transformers import (
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperTokenizer,
    )

    model = WhisperForConditionalGeneration.from_pretrained(path).eval()
    extractor = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)
    features = extractor(samples, sampling_rate=16_000, return_tensors="pt").input_features
    return model, features, WhisperTokenizer.from_pretrained(path)


def hf_offsets(path: str, samples, **kwargs) -> dict:
    """HF's text and segments for one window: generate with timestamps in one call (as many
    new tokens as the decoder's positions leave, the server's default), decoded by HF's
    tokenizer with its offsets."""
    model, features, tok = hf_whisper(path, samples)
    prompt_len = 3 if "language" in kwargs else 1  # <|sot|> [lang task]
    with torch.no_grad():
        seq = model.generate(features, return_timestamps=True, force_unique_generate_call=True,
                             max_new_tokens=model.config.max_target_positions - prompt_len,
                             **kwargs)[0].tolist()
    out = tok.decode(seq, output_offsets=True)
    assert out["offsets"], "the clip should give segments"
    return {"text": tok.decode(seq, skip_special_tokens=True), "offsets": out["offsets"],
            "tokens": seq[prompt_len:]}


def hf_default(path: str, samples, **kwargs) -> dict:
    """HF's default `generate(return_timestamps=True)` for one window (no
    `force_unique_generate_call`: decoded again from its last complete segment while a decode
    ends mid-segment), as many new tokens a decode as the decoder's positions leave: its text,
    `sequences` and `segments` (as `hf_offsets`' offsets: times and text), and how many
    generate calls it made."""
    model, features, tok = hf_whisper(path, samples)
    prompt_len = 3 if "language" in kwargs else 1
    with torch.no_grad():
        out = model.generate(features, return_timestamps=True, return_segments=True,
                             max_new_tokens=model.config.max_target_positions - prompt_len,
                             **kwargs)
    begin = model.generation_config.no_timestamps_token_id + 1
    segs = out["segments"][0]
    seq = out["sequences"][0].tolist()
    return {"text": tok.decode(seq, skip_special_tokens=True), "tokens": seq,
            "offsets": [{"timestamp": (float(s["start"]), float(s["end"])),
                         "text": tok.decode([t for t in s["tokens"].tolist() if t < begin])}
                        for s in segs],
            "decodes": len({id(s["result"]) for s in segs})}


def assert_segments(segments, expected: dict) -> None:
    assert_close([(s["start"], s["end"], s["text"]) for s in segments], cues_of(expected, False))


def cues_of(expected: dict, strip: bool = True) -> list[tuple[float, float, str]]:
    """HF's offsets as (start, end, text), the text stripped as a subtitle's cue is."""
    return [(o["timestamp"][0], o["timestamp"][1], o["text"].strip() if strip else o["text"])
            for o in expected["offsets"]]


def assert_close(got: list[tuple[float, float, str]], want: list[tuple[float, float, str]],
                 abs_s: float = 1e-6) -> None:
    """Equal texts, and times within `abs_s` seconds (a subtitle's clock has milliseconds)."""
    assert [t for _, _, t in got] == [t for _, _, t in want]
    times = [x for a, b, _ in want for x in (a, b)]
    assert [x for a, b, _ in got for x in (a, b)] == pytest.approx(times, abs=abs_s)


def cues(subtitles: str) -> list[tuple[float, float, str]]:
    """(start, end, text) of each cue of an SRT or WebVTT file."""
    clock = r"(\d\d):(\d\d):(\d\d)[,.](\d\d\d)"
    found = re.findall(rf"{clock} --> {clock}\n(.*?)\n\n", subtitles, flags=re.S)

    def seconds(h, m, s, ms):
        return int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000

    return [(seconds(*c[:4]), seconds(*c[4:8]), c[8]) for c in found]


def test_verbose_json_srt_and_vtt_are_hfs_segments(ckpt, server):
    """HF's default: the window decoded again from its last complete segment (a segment's
    `seek` is the frame its decode began at); `force_unique_generate_call=true`: one decode,
    cut as HF's tokenizer cuts it."""
    path, samples = ckpt["multilingual"], clip(0)
    expected = hf_default(path, samples, language="de", task="transcribe")
    assert expected["decodes"] >= 2, "HF should decode the window again"
    wav = encoded(samples, 16_000, "WAV")
    api = client(server).audio.transcriptions
    verbose = api.create(model=path, file=("a.wav", wav), language="de",
                         response_format="verbose_json", timestamp_granularities=["segment"])
    body = verbose.model_dump()
    assert body["text"] == expected["text"] and body["language"] == "de"
    assert body["task"] == "transcribe" and body["duration"] == pytest.approx(20.0)
    assert_segments(body["segments"], expected)
    assert len(body["segments"]) >= 3
    assert [t for s in body["segments"] for t in s["tokens"]] == expected["tokens"]
    assert body["segments"][0]["seek"] == 0 and body["segments"][-1]["seek"] > 0
    assert [s["id"] for s in body["segments"]] == list(range(len(body["segments"])))
    once = api.create(model=path, file=("a.wav", wav), language="de",
                      response_format="verbose_json",
                      extra_body={"force_unique_generate_call": "true"}).model_dump()
    single = hf_offsets(path, samples, language="de", task="transcribe")
    assert once["text"] == single["text"] and once["text"] != body["text"]
    assert_segments(once["segments"], single)
    srt = api.create(model=path, file=("a.wav", wav), language="de", response_format="srt")
    assert srt.startswith("1\n")
    assert_close(cues(srt), cues_of(expected), abs_s=6e-4)
    vtt = api.create(model=path, file=("a.wav", wav), language="de", response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n")
    assert_close(cues(vtt), cues_of(expected), abs_s=6e-4)


def test_translations_and_a_detected_language(ckpt, server):
    """/translations is the translate task; without a language the detected one is named."""
    path, samples = ckpt["multilingual"], clip(2)
    wav = encoded(samples, 16_000, "WAV")
    out = client(server).audio.translations.create(
        model=path, file=("a.wav", wav), response_format="verbose_json",
        extra_body={"language": "fr"}).model_dump()
    assert out["task"] == "translate" and out["language"] == "fr"
    assert_segments(out["segments"], hf_default(path, samples, language="fr",
                                                task="translate"))
    detected = client(server).audio.transcriptions.create(
        model=path, file=("a.wav", wav), response_format="verbose_json").model_dump()
    assert detected["language"] in ("en", "de", "fr") and detected["segments"]


@pytest.mark.parametrize("fields, param, named", [
    ({"response_format": "xml"}, "response_format", "is not one of json, text, srt"),
    ({"response_format": "verbose_json", "timestamp_granularities[]": "word"},
     "timestamp_granularities[]", "word timestamps are not built"),
    ({"response_format": "json", "timestamp_granularities[]": "segment"},
     "timestamp_granularities[]", "needs response_format verbose_json"),
    ({"response_format": "verbose_json", "timestamp_granularities[]": "line"},
     "timestamp_granularities[]", "is not one of segment, word"),
    ({"response_format": "srt", "stream": "true"}, "stream", "stream is not supported"),
    ({"chunking_strategy": "sometimes"}, "chunking_strategy",
     'must be "auto" or a server_vad object'),
    ({"chunking_strategy": '{"type": "client_vad"}'}, "chunking_strategy",
     'type must be "server_vad"'),
    ({"chunking_strategy[type]": "server_vad", "chunking_strategy[threshold]": "loud"},
     "chunking_strategy", "threshold must be a number"),
    ({"chunking_strategy[type]": "server_vad", "chunking_strategy[threshold]": "1.5"},
     "chunking_strategy", "threshold must be in (0, 1)"),
    ({"chunking_strategy": "auto", "chunk_length_s": "20"}, "chunking_strategy",
     "give one or the other"),
])
def test_bad_values_are_named(server, fields, param, named):
    files = {"file": ("a.wav", encoded(clip(1), 16_000, "WAV"))}
    r = httpx.post(server.url + "/v1/audio/transcriptions", data={"language": "de", **fields},
                   files=files, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert named in error["message"] and error["param"] == param, error


def test_the_engine(ckpt):
    """`Seq2SeqEngine.transcribe(return_timestamps=True)` on the English-only model: HF's
    default generate's tokens, text and segments; with `force_unique_generate_call`, its one
    call's."""
    from seq2serve.runtime.frontend.engine import Seq2SeqEngine

    path, samples = ckpt["english"], clip(3)
    expected, single = hf_default(path, samples), hf_offsets(path, samples)
    assert expected["decodes"] >= 2, "HF should decode the window again"
    with Seq2SeqEngine(model_path=path, device="cpu", dtype="float32") as engine:
        got = engine.transcribe(encoded(samples, 16_000, "WAV"), return_timestamps=True)
        once = engine.transcribe(samples, return_timestamps=True,
                                 force_unique_generate_call=True)
    assert got["text"] == expected["text"] and got["output_ids"] == expected["tokens"]
    assert_segments(got["segments"], expected)
    assert got["meta_info"]["decodes"] == expected["decodes"]
    assert once["text"] == single["text"] and once["output_ids"] == single["tokens"]
    assert_segments(once["segments"], single)


def hf_pipeline_chunks(path: str, samples, language: str | None = None,
                       **generate_kwargs) -> dict:
    """HF's ASR pipeline with timestamps on long audio: 30 s windows with 5 s strides, each
    decoded by generate with `return_timestamps=True` (by default again from its last whole
    segment, on zero-padded log-mel frames; `force_unique_generate_call=True` in
    `generate_kwargs`: once) with as many new tokens as the decoder's positions leave (the
    server's default), greedy unless `num_beams` is given, merged by `_decode_asr`:
    {"text", "chunks"}."""
    from transformers import (
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperTokenizer,
        pipeline,
    )

    model = WhisperForConditionalGeneration.from_pretrained(path).eval()
    pipe = pipeline("automatic-speech-recognition", model=model, device="cpu",
                    tokenizer=WhisperTokenizer.from_pretrained(path),
                    feature_extractor=WhisperFeatureExtractor(
                        feature_size=model.config.num_mel_bins),
                    chunk_length_s=30, stride_length_s=5, ignore_warning=True)
    prompt_len = 1 if language is None else 3  # <|sot|> [lang task]
    kwargs = {} if language is None else {"language": language, "task": "transcribe"}
    return pipe(samples.copy(), return_timestamps=True, generate_kwargs={
        "max_new_tokens": model.config.max_target_positions - prompt_len,
        "num_beams": 1,  # the pipeline's default is 5
        **kwargs, **generate_kwargs})


def pipeline_segments(out: dict, duration: float) -> list[tuple[float, float, str]]:
    """HF's chunks as segments: an end None (no closing timestamp) at the audio's end, a
    start None (no opening one) at the end of the segment before."""
    segs, end = [], 0.0
    for c in out["chunks"]:
        a, b = c["timestamp"]
        a = end if a is None else a
        end = max(a, round(duration, 2)) if b is None else b
        segs.append((a, end, c["text"]))
    return segs


@pytest.mark.parametrize("kind, language", [("multilingual", "de"), ("english", None)])
def test_the_engine_on_long_audio_is_hfs_pipeline(ckpt, kind, language):
    """95 s (five windows): every window decoded with timestamps (again from its last
    complete segment, as HF's pipeline's generate decodes it by default; once with
    `force_unique_generate_call`) and merged as HF's pipeline with chunk_length_s=30,
    stride_length_s=5, return_timestamps=True merges them: its text, and its chunks' times
    (None included, as `pipeline_times`) and texts as the segments."""
    from seq2serve.runtime.frontend.engine import Seq2SeqEngine

    path, samples = ckpt[kind], long_clip()
    expected = hf_pipeline_chunks(path, samples, language)
    with Seq2SeqEngine(model_path=path, device="cpu", dtype="float32") as engine:
        got = engine.transcribe(samples, language=language, return_timestamps=True)
        checks = [(got, expected)]
        if kind == "multilingual":  # one model is enough for the one-decode path
            single = hf_pipeline_chunks(path, samples, language,
                                        force_unique_generate_call=True)
            assert expected != single, "HF's pipeline should decode windows again"
            once = engine.transcribe(samples, language=language, return_timestamps=True,
                                     force_unique_generate_call=True)
            assert "decodes" not in once["meta_info"]
            checks.append((once, single))
    assert got["meta_info"]["decodes"] > 5
    for out, want in checks:
        assert len(want["chunks"]) >= 3, want
        assert out["text"] == want["text"] and out["meta_info"]["windows"] == 5
        assert out["pipeline_times"] == [tuple(c["timestamp"]) for c in want["chunks"]]
        assert_close([(g["start"], g["end"], g["text"]) for g in out["segments"]],
                     pipeline_segments(want, out["duration"]))


def test_the_command_line(ckpt, server, tmp_path):
    """`seq2serve transcribe --format srt`: the endpoint's cues."""
    import subprocess
    import sys

    path, samples = ckpt["multilingual"], clip(0)
    wav = tmp_path / "a.wav"
    wav.write_bytes(encoded(samples, 16_000, "WAV"))
    served = client(server).audio.transcriptions.create(
        model=path, file=("a.wav", wav.read_bytes()), language="de", response_format="srt")
    r = subprocess.run([sys.executable, "-m", "seq2serve.runtime.cli", "transcribe", str(wav),
                        "--model-path", path, "--device", "cpu", "--dtype", "float32",
                        "--language", "de", "--format", "srt"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == served.rstrip("\n") + "\n" and cues(served)


def test_long_audio_through_the_endpoint(ckpt, server):
    """95 s of OGG (five windows) as verbose_json and srt through the `openai` client: HF's
    pipeline's text and chunks (each window decoded again from its last complete segment,
    HF's default) as the segments and cues; a stream of srt stays a 400 naming stream."""
    from seq2serve.encoders.audio_loader import AudioLimits, read_audio

    path = ckpt["multilingual"]
    ogg = encoded(long_clip(), 16_000, "OGG")
    samples = read_audio(ogg, AudioLimits(max_seconds=600))
    expected = hf_pipeline_chunks(path, samples, "de")
    want = pipeline_segments(expected, samples.shape[0] / 16_000)
    assert len(want) >= 3
    api = client(server).audio.transcriptions
    body = api.create(model=path, file=("long.ogg", ogg), language="de",
                      response_format="verbose_json").model_dump()
    assert body["text"] == expected["text"]
    assert body["duration"] == pytest.approx(samples.shape[0] / 16_000, abs=1e-3)
    assert_close([(s["start"], s["end"], s["text"]) for s in body["segments"]], want)
    assert [s["id"] for s in body["segments"]] == list(range(len(want)))
    srt = api.create(model=path, file=("long.ogg", ogg), language="de", response_format="srt")
    assert_close(cues(srt), [(a, b, t.strip()) for a, b, t in want], abs_s=6e-4)
    r = httpx.post(server.url + "/v1/audio/transcriptions", timeout=60,
                   data={"language": "de", "response_format": "srt", "stream": "true"},
                   files={"file": ("long.ogg", ogg)})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream", r.text


def test_chunking_strategy_through_the_endpoint(ckpt, server):
    """chunking_strategy="auto" and a server_vad object as the openai client sends them (the
    object as bracketed form fields), verbose_json: HF's default generate with timestamps on
    each of Silero's windows, the texts joined and the segments moved on by the window's
    start; no speech: no text, no segments (tests/test_audio_vad.py has the rest)."""
    pytest.importorskip("silero_vad")
    from seq2serve.runtime.frontend.audio_chunks import Window, speech_windows
    from seq2serve.tests.test_audio_vad import (
        NEW,
        RATE,
        auto_regions,
        hf_timed,
        silero_regions,
        vad_clips,
    )

    path, clips = ckpt["multilingual"], vad_clips()
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    wav, samples = clips["long"]
    windows = speech_windows(auto_regions(samples))
    got = c.audio.transcriptions.create(model=path, file=("long.wav", wav), language="de",
                                        chunking_strategy="auto",
                                        response_format="verbose_json",
                                        extra_body={"max_tokens": NEW})
    text, want = hf_timed(path, samples, windows)
    assert got.text == text and len(want) >= 2 and want[-1][0] > 30
    assert_close([(s.start, s.end, s.text) for s in got.segments], want)
    short_wav, short = clips["short"]
    [(start, end)] = silero_regions(short, threshold=0.7, speech_pad_ms=100,
                                    min_silence_duration_ms=200)
    vad = {"type": "server_vad", "threshold": 0.7, "prefix_padding_ms": 100,
           "silence_duration_ms": 200}
    got = c.audio.transcriptions.create(model=path, file=("short.wav", short_wav),
                                        language="de", chunking_strategy=vad,
                                        response_format="verbose_json",
                                        extra_body={"max_tokens": NEW})
    text, want = hf_timed(path, short, [Window(start, end, 0, 0)])
    assert got.text == text and got.duration == 4.5
    assert_close([(s.start, s.end, s.text) for s in got.segments], want)
    assert want and want[0][0] >= round(start / RATE, 3) > 1.4
    silent = c.audio.transcriptions.create(model=path, file=("s.wav", clips["silent"][0]),
                                           chunking_strategy="auto",
                                           response_format="verbose_json")
    assert silent.text == "" and silent.segments == []
