"""OpenAI's /v1/audio/transcriptions and /v1/audio/translations through the unmodified `openai`
client, against HF `generate` on tiny random Whisper checkpoints (tests/whisper_checkpoints.py)
in float32: the text of HF's tokens, greedy and with beams, json, text and streamed; bad
requests get a 4xx naming the field."""

from __future__ import annotations

import httpx
import pytest
import torch

from seq2serve.tests.server_helpers import ServerProcess
from seq2serve.tests.whisper_checkpoints import (
    clip,
    encoded,
    long_clip,
    tiny_checkpoints,
    write_whisper_checkpoint,
)

pytest.importorskip("soundfile")
openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoints(tmp_path_factory.mktemp("whisper-api"))


@pytest.fixture(scope="module")
def servers(ckpt):
    m = ServerProcess(ckpt["multilingual"], "--max-audio-bytes", "2000000",
                      "--max-audio-seconds", "100")
    e = ServerProcess(ckpt["english"])
    try:
        yield {"multilingual": m, "english": e}
    finally:
        m.kill()
        e.kill()


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def hf_text(path: str, samples, max_new_tokens: int | None = None, **kwargs) -> str:
    """HF generate's text for `samples`: its tokens (HF's Whisper generate returns those after
    the forced prompt), decoded without special tokens, as the server's detokenizer does.
    Without `max_new_tokens`: what the decoder's positions leave after the prompt, the
    server's default."""
    from transformers import (
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperTokenizer,
    )

    model = WhisperForConditionalGeneration.from_pretrained(path).eval()
    extractor = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)
    features = extractor(samples, sampling_rate=16_000, return_tensors="pt").input_features
    prompt_len = 4 if "language" in kwargs else 2  # <|sot|> [lang task] <|notimestamps|>
    room = model.config.max_target_positions - prompt_len
    with torch.no_grad():
        out = model.generate(features, max_new_tokens=max_new_tokens or room, **kwargs)[0]
    return WhisperTokenizer.from_pretrained(path).decode(out.tolist(), skip_special_tokens=True)


def test_transcriptions_and_translations_are_hfs_text(ckpt, servers):
    """json and text, transcribe and translate, a multilingual and an English-only model,
    each with the server's default length (the decoder's positions less the prompt)."""
    wav = encoded(clip(0, rate=44_100), 44_100, "WAV")
    from seq2serve.encoders.audio_loader import read_audio

    samples = read_audio(wav)
    m = client(servers["multilingual"])
    got = m.audio.transcriptions.create(model=ckpt["multilingual"], file=("a.wav", wav),
                                        language="de")
    expected = hf_text(ckpt["multilingual"], samples, language="de", task="transcribe")
    assert got.text == expected and expected.strip()
    assert got.usage is not None and got.usage.output_tokens > 0
    plain = m.audio.transcriptions.create(model=ckpt["multilingual"], file=("a.wav", wav),
                                          language="de", response_format="text")
    assert plain == expected
    translated = m.audio.translations.create(model=ckpt["multilingual"],
                                             file=("a.wav", wav),
                                             extra_body={"language": "french"})
    assert translated.text == hf_text(ckpt["multilingual"], samples, language="french",
                                      task="translate")
    flac = encoded(clip(3), 16_000, "FLAC")
    english = client(servers["english"]).audio.transcriptions.create(
        model=ckpt["english"], file=("b.flac", flac))
    assert english.text == hf_text(ckpt["english"], read_audio(flac))


def test_beams_max_tokens_and_a_stream(ckpt, servers):
    """num_beams (an extension field) is HF's beam search; a stream's deltas add up to the
    text of its done event, which is the unstreamed text."""
    samples = clip(2)
    ogg = encoded(samples, 16_000, "OGG")
    m = client(servers["multilingual"])
    beams = m.audio.transcriptions.create(model=ckpt["multilingual"], file=("c.ogg", ogg),
                                          language="en",
                                          extra_body={"num_beams": 3, "max_tokens": 12})
    from seq2serve.encoders.audio_loader import read_audio

    assert beams.text == hf_text(ckpt["multilingual"], read_audio(ogg), 12, language="en",
                                 task="transcribe", num_beams=3)
    greedy = m.audio.transcriptions.create(model=ckpt["multilingual"], file=("c.ogg", ogg),
                                           language="en", extra_body={"max_tokens": 12})
    assert greedy.text != beams.text, "this clip tells beam search from greedy"
    whole = m.audio.transcriptions.create(model=ckpt["multilingual"], file=("c.ogg", ogg),
                                          language="en", extra_body={"max_tokens": 20})
    events = list(m.audio.transcriptions.create(model=ckpt["multilingual"],
                                                file=("c.ogg", ogg), language="en",
                                                stream=True, extra_body={"max_tokens": 20}))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    [done] = [e for e in events if e.type == "transcript.text.done"]
    assert "".join(deltas) == done.text == whole.text and len(deltas) > 1


def eos_early_checkpoint(src: str, out, samples) -> str:
    """`src` (the English-only checkpoint) with end of text made the greedy choice where its
    fourth token was (its tied embedding row twice that token's): its greedy output ends
    there unless end of text is banned."""
    import shutil

    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    shutil.copytree(src, out)
    model = WhisperForConditionalGeneration.from_pretrained(src).eval()
    features = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)(
        samples, sampling_rate=16_000, return_tensors="pt").input_features
    with torch.no_grad():
        fourth = model.generate(features, max_new_tokens=8)[0, 3].item()
        emb = model.model.decoder.embed_tokens.weight
        emb[model.config.eos_token_id] = 2 * emb[fourth]
    model.save_pretrained(out)
    return str(out)


def test_min_tokens_is_hfs_min_new_tokens(ckpt, tmp_path):
    """min_tokens (an extension field, as bench serving --audio-seconds sends it) bans end of
    text before it, as HF's min_new_tokens: on a checkpoint whose greedy output ends early,
    min = max gives exactly that many tokens, HF's."""
    from seq2serve.encoders.audio_loader import read_audio

    wav = encoded(clip(5), 16_000, "WAV")
    samples = read_audio(wav)
    path = eos_early_checkpoint(ckpt["english"], tmp_path / "eos", samples)
    server = ServerProcess(path)
    try:
        c = client(server)
        free = c.audio.transcriptions.create(model=path, file=("f.wav", wav),
                                             extra_body={"max_tokens": 16})
        got = c.audio.transcriptions.create(model=path, file=("f.wav", wav),
                                            extra_body={"max_tokens": 16, "min_tokens": 16})
    finally:
        server.kill()
    assert free.usage.output_tokens < 16, "end of text comes early unless banned"
    assert got.usage.output_tokens == 16
    assert got.text == hf_text(path, samples, 16, min_new_tokens=16)
    assert free.text == hf_text(path, samples, 16)


@pytest.mark.parametrize("fields, files, status, named", [
    ({"model": "m"}, None, 400, "file is required"),
    ({"language": "de"}, {"file": ("x.wav", b"not audio at all")}, 400, "audio"),
    ({"language": "de", "prompt": "said <|en|> then"}, "wav", 400, "special token '<|en|>'"),
    ({"language": "de", "prompt": "the ant " * 40}, "wav", 400, "the prompt is too long"),
    ({"language": "de", "response_format": "srt"}, "wav", 400, "needs timestamps"),
    ({"language": "de", "response_format": "xml"}, "wav", 400, "is not one of"),
    ({"language": "klingon"}, "wav", 400, "is not one of this model's"),
    ({"language": "de", "max_tokens": "999"}, "wav", 400, "max_tokens must be in"),
    ({"language": "de", "max_tokens": "8", "min_tokens": "9"}, "wav", 400,
     "min_tokens must be in [0, 8]"),
    ({"language": "de", "stream": "true", "num_beams": "2"}, "wav", 400, "stream cannot"),
    ({"language": "de", "temperature": "hot"}, "wav", 400, "temperature must be a number"),
    ({"language": "de"}, "big", 413, "--max-audio-bytes"),
    ({"language": "de", "chunk_length_s": "45"}, "wav", 400, "chunk_length_s must be in"),
    ({"language": "de", "stride_length_s": "15"}, "wav", 400, "stride_length_s must be"),
    ({"language": "de", "model": "other"}, "wav", 404, "not found"),
])
def test_bad_requests_are_named(servers, fields, files, status, named):
    if files == "wav":
        files = {"file": ("a.wav", encoded(clip(1), 16_000, "WAV"))}
    elif files == "big":  # over the server's --max-audio-bytes (2,000,000): 3.8 MB
        files = {"file": ("a.wav", encoded(clip(1, rate=48_000), 48_000, "WAV", "FLOAT"))}
    url = servers["multilingual"].url + "/v1/audio/transcriptions"
    r = httpx.post(url, data=fields, files=files or {"unrelated": ("u.txt", b"x")}, timeout=30)
    assert r.status_code == status, r.text
    assert named in r.json()["error"]["message"], r.text
    assert httpx.get(servers["multilingual"].url + "/health").status_code == 200


def test_a_model_without_audio_and_a_body_that_is_no_form(servers):
    """JSON instead of a form is a 415; the English-only model refuses to translate."""
    url = servers["english"].url + "/v1/audio"
    r = httpx.post(url + "/transcriptions", json={"file": "x"}, timeout=30)
    assert r.status_code == 415 and "multipart/form-data" in r.json()["error"]["message"]
    r = httpx.post(url + "/translations", timeout=30,
                   files={"file": ("a.wav", encoded(clip(1), 16_000, "WAV"))})
    assert r.status_code == 400 and "English-only" in r.json()["error"]["message"], r.text


def test_the_engine_transcribes_as_the_endpoint(ckpt, servers):
    """Seq2SeqEngine.transcribe: the endpoint's text for the same file and language."""
    from seq2serve.runtime.frontend.engine import Seq2SeqEngine

    flac = encoded(clip(4), 16_000, "FLAC")
    served = client(servers["multilingual"]).audio.transcriptions.create(
        model=ckpt["multilingual"], file=("d.flac", flac), language="de")
    with Seq2SeqEngine(model_path=ckpt["multilingual"], device="cpu", dtype="float32") as e:
        got = e.transcribe(flac, language="de")
        with pytest.raises(ValueError, match="is not one of this model's"):
            e.transcribe(flac, language="klingon")
    assert got["text"] == served.text and got["output_ids"]


def test_the_transcribe_command(ckpt, servers, tmp_path):
    """`seq2serve transcribe FILES`: one line of text per file, the endpoint's (95 s of
    audio too); a language
    the model does not have is an error naming it, exit status 2."""
    import json
    import subprocess
    import sys

    files = [tmp_path / "a.wav", tmp_path / "b.mp3", tmp_path / "long.ogg"]
    files[0].write_bytes(encoded(clip(0), 16_000, "WAV"))
    files[1].write_bytes(encoded(clip(5, rate=22_050), 22_050, "MP3"))
    files[2].write_bytes(encoded(long_clip(), 16_000, "OGG"))  # 95 s: five windows
    m = client(servers["multilingual"])
    served = [m.audio.transcriptions.create(model=ckpt["multilingual"], language="de",
                                            file=(f.name, f.read_bytes())).text for f in files]
    cmd = [sys.executable, "-m", "seq2serve.runtime.cli", "transcribe", *map(str, files),
           "--model-path", ckpt["multilingual"], "--device", "cpu", "--dtype", "float32"]
    r = subprocess.run([*cmd, "--language", "de", "--json"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["text"] for x in lines] == served and [x["file"] for x in lines] == \
        [str(f) for f in files]
    r = subprocess.run([*cmd, "--language", "klingon"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "is not one of this model's" in r.stderr, r.stderr[-2000:]


def test_language_detection_is_hfs(ckpt, servers, tmp_path):
    """No language for a multilingual model: the language HF's detect_language picks (named
    in the json answer; in the engine's result with every language's log-prob), and the text
    of HF generate given no language (it detects it the same way). The engine's part uses a
    checkpoint whose detection differs by clip, so a fixed answer would fail."""
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    from seq2serve.encoders.audio_loader import read_audio
    from seq2serve.runtime.frontend.engine import Seq2SeqEngine
    from seq2serve.runtime.frontend.transcription import WhisperPrompt

    def hf_language(path: str, samples) -> str:
        model = WhisperForConditionalGeneration.from_pretrained(path).eval()
        extractor = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)
        features = extractor(samples, sampling_rate=16_000,
                             return_tensors="pt").input_features
        code_of = {v: k.strip("<|>") for k, v in
                   WhisperPrompt.from_model(path).lang_to_id.items()}
        with torch.no_grad():
            return code_of[model.detect_language(features)[0].item()]

    def hf_detecting(path: str, samples) -> str:  # the task given: HF's prompt then has it
        return hf_text(path, samples, max_new_tokens=60, task="transcribe")

    path = ckpt["multilingual"]
    wav = encoded(clip(0), 16_000, "WAV")
    got = client(servers["multilingual"]).audio.transcriptions.create(model=path,
                                                                      file=("a.wav", wav))
    samples = read_audio(wav)
    assert got.language == hf_language(path, samples)
    assert got.text == hf_detecting(path, samples)

    varied = str(write_whisper_checkpoint("multilingual", tmp_path / "varied", seed=2))
    clips = [clip(0), clip(2)]
    expected = [hf_language(varied, c) for c in clips]
    assert len(set(expected)) == 2, "the clips should be told apart"
    with Seq2SeqEngine(model_path=varied, device="cpu", dtype="float32") as e:
        outs = [e.transcribe(c) for c in clips]
        stats = e.stats()
    # each clip encoded once: its detection's requests and its transcription share the output
    assert stats["encoder_inputs"] == len(clips), stats
    for out, language, c in zip(outs, expected, clips):
        assert out["language"] == language
        assert out["text"] == hf_detecting(varied, c)
        scores = out["language_logprobs"]
        assert len(scores) == 3 and max(scores.values()) == scores[language]


def test_a_prompt_is_hfs_prompt_ids(ckpt, servers):
    """`prompt` (the text before this audio) is HF's `prompt_ids`: `<|startofprev|>` and the
    text's tokens before the forced ones; the same text as HF generate with them, different
    from the text without a prompt; the engine's `transcribe(prompt=...)` the same."""
    from transformers import (
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperTokenizer,
    )

    from seq2serve.encoders.audio_loader import read_audio
    from seq2serve.runtime.frontend.engine import Seq2SeqEngine

    path, text = ckpt["multilingual"], "she sat in the inner tent"
    wav = encoded(clip(2), 16_000, "WAV")
    model = WhisperForConditionalGeneration.from_pretrained(path).eval()
    tokenizer = WhisperTokenizer.from_pretrained(path)
    features = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)(
        read_audio(wav), sampling_rate=16_000, return_tensors="pt").input_features
    with torch.no_grad():
        out = model.generate(features, max_new_tokens=12, language="en", task="transcribe",
                             prompt_ids=tokenizer.get_prompt_ids(text, return_tensors="pt"))
    expected = tokenizer.decode(out[0].tolist(), skip_special_tokens=True)
    m = client(servers["multilingual"])
    got = m.audio.transcriptions.create(model=path, file=("a.wav", wav), language="en",
                                        prompt=text, extra_body={"max_tokens": 12})
    plain = m.audio.transcriptions.create(model=path, file=("a.wav", wav), language="en",
                                          extra_body={"max_tokens": 12})
    assert got.text == expected and plain.text != expected
    with Seq2SeqEngine(model_path=path, device="cpu", dtype="float32") as e:
        assert e.transcribe(wav, language="en", prompt=text,
                            sampling_params={"max_new_tokens": 12})["text"] == expected


def hf_pipeline_text(path: str, samples, language: str, task: str = "transcribe",
                     num_beams: int = 1, max_new_tokens: int | None = None,
                     prompt: str | None = None, chunk_length_s: float = 30,
                     stride_length_s: float = 5) -> str:
    """HF's ASR pipeline with its chunking (30 s windows, 5 s strides) and its merge, each
    window decoded with `max_new_tokens`, by default the server's (the decoder's positions
    less the prompt)."""
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
                    chunk_length_s=chunk_length_s, stride_length_s=stride_length_s,
                    ignore_warning=True)
    room = model.config.max_target_positions - 4
    extra = {} if prompt is None else {
        "prompt_ids": pipe.tokenizer.get_prompt_ids(prompt, return_tensors="pt")}
    return pipe(samples.copy(), generate_kwargs={
        "language": language, "task": task, "max_new_tokens": max_new_tokens or room,
        "num_beams": num_beams, **extra})["text"]


def hf_windows(path: str, samples, language: str) -> list[list[int]]:
    """HF generate's tokens for each of the pipeline's windows (its own `chunk_iter`)."""
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration
    from transformers.pipelines.automatic_speech_recognition import chunk_iter

    model = WhisperForConditionalGeneration.from_pretrained(path).eval()
    extractor = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)
    room = model.config.max_target_positions - 4
    out = []
    for item in chunk_iter(samples, extractor, 480_000, 80_000, 80_000):
        with torch.no_grad():
            out.append(model.generate(item["input_features"], language=language,
                                      max_new_tokens=room)[0].tolist())
    return out


def test_long_audio_is_hfs_chunked_pipeline(ckpt, servers):
    """95 s: five windows, sent as one batch and merged, give the text of HF's pipeline with
    chunk_length_s=30, stride_length_s=5 (json; text, a stream's one delta and translate
    with beams, each window's length capped by max_tokens). The windows' tokens differ and
    the merge drops their overlaps (the text is not the windows' texts joined), so the
    oracle checks the merge; past --max-audio-seconds (100 here) is a 400 naming it."""
    from transformers import WhisperTokenizer

    from seq2serve.encoders.audio_loader import AudioLimits, read_audio

    path = ckpt["multilingual"]
    ogg = encoded(long_clip(), 16_000, "OGG")
    samples = read_audio(ogg, AudioLimits(max_seconds=600))
    assert 94 < samples.shape[0] / 16_000 < 96
    expected = hf_pipeline_text(path, samples, "de")
    per_window = hf_windows(path, samples, "de")
    joined = WhisperTokenizer.from_pretrained(path).decode(
        [t for w in per_window for t in w], skip_special_tokens=True)
    assert len(per_window) == 5 and len(set(map(tuple, per_window))) >= 4
    assert expected.strip() and expected != joined and len(expected) < len(joined)

    m = client(servers["multilingual"])
    got = m.audio.transcriptions.create(model=path, file=("long.ogg", ogg), language="de")
    assert got.text == expected and got.usage.output_tokens > 0
    short = hf_pipeline_text(path, samples, "de", max_new_tokens=24)
    assert short != expected
    assert m.audio.transcriptions.create(model=path, file=("long.ogg", ogg), language="de",
                                         response_format="text",
                                         extra_body={"max_tokens": 24}) == short
    events = list(m.audio.transcriptions.create(model=path, file=("long.ogg", ogg),
                                                language="de", stream=True,
                                                extra_body={"max_tokens": 24}))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    [done] = [e for e in events if e.type == "transcript.text.done"]
    assert "".join(deltas) == done.text == short
    translated = m.audio.translations.create(
        model=path, file=("long.ogg", ogg),
        extra_body={"language": "de", "num_beams": 2, "max_tokens": 24})
    assert translated.text == hf_pipeline_text(path, samples, "de", "translate", num_beams=2,
                                               max_new_tokens=24)

    too_long = encoded(long_clip(6), 16_000, "OGG")  # 114 s
    r = httpx.post(servers["multilingual"].url + "/v1/audio/transcriptions", timeout=60,
                   data={"language": "de"}, files={"file": ("x.ogg", too_long)})
    assert r.status_code == 400, r.text
    assert "over the limit of 100 s (max_audio_seconds)" in r.json()["error"]["message"]


def test_the_engine_transcribes_long_audio_as_the_pipeline(ckpt):
    """Seq2SeqEngine.transcribe on 95 s: HF's pipeline's text with a language given, and
    without one the language HF's detect_language gives the first window (faster-whisper's
    choice: one language per file) and the pipeline's text in it, with the windows split
    over several batches (max_batch_inputs 2); a prompt (previous text) goes before every
    window's forced tokens, as the pipeline's prompt_ids; generate's audio_data stays one
    window; other chunkings (chunk_length_s, stride_length_s) are the pipeline's with them."""
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    from seq2serve.runtime.frontend.engine import Seq2SeqEngine
    from seq2serve.runtime.frontend.transcription import WhisperPrompt

    path = ckpt["multilingual"]
    samples = long_clip()
    model = WhisperForConditionalGeneration.from_pretrained(path).eval()
    features = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)(
        samples[:480_000], sampling_rate=16_000, return_tensors="pt").input_features
    code_of = {v: k.strip("<|>") for k, v in WhisperPrompt.from_model(path).lang_to_id.items()}
    with torch.no_grad():
        language = code_of[model.detect_language(features)[0].item()]
    with Seq2SeqEngine(model_path=path, device="cpu", dtype="float32",
                       max_batch_inputs=2) as e:
        given = e.transcribe(samples, language="fr")
        detected = e.transcribe(samples, sampling_params={"max_new_tokens": 24})
        prompted = e.transcribe(samples, language="fr", prompt="she sat in the inner tent",
                                sampling_params={"max_new_tokens": 12})
        shorter = e.transcribe(samples, language="fr", chunk_length_s=20, stride_length_s=4,
                               sampling_params={"max_new_tokens": 12})
        with pytest.raises(ValueError, match="one 30 s window"):
            e.generate(audio_data=samples, decoder_input_ids=[1])
    assert given["text"] == hf_pipeline_text(path, samples, "fr")
    assert given["meta_info"]["windows"] == 5
    assert detected["language"] == language
    assert detected["text"] == hf_pipeline_text(path, samples, language, max_new_tokens=24)
    assert prompted["text"] == hf_pipeline_text(path, samples, "fr", max_new_tokens=12,
                                                prompt="she sat in the inner tent")
    assert prompted["text"] != hf_pipeline_text(path, samples, "fr", max_new_tokens=12)
    assert shorter["meta_info"]["windows"] == 8  # one every 12 s
    assert shorter["text"] == hf_pipeline_text(path, samples, "fr", max_new_tokens=12,
                                               chunk_length_s=20, stride_length_s=4)


def test_bench_serving_sends_clips_to_transcriptions(servers):
    """`bench serving --audio-seconds`: WAV clips to /v1/audio/transcriptions, streamed (and
    with beams answered whole), every answer exactly --output-len tokens; the offline engine
    on the same clips and length for --compare-offline."""
    from seq2serve.runtime.bench.serving import measure, warmup_workload, workload
    from seq2serve.runtime.bench.serving_offline import compare_offline

    url = servers["multilingual"].url
    res = measure(url, 4, 0, 6, 2, None, audio_seconds=2.0, warmup=None)
    assert (res["completed"], res["failed"], res["output_tokens"]) == (4, 0, 24), res["errors"]
    # a warm-up round of two clips the load does not repeat (the encoder cache cannot answer)
    assert (res["warmup"]["completed"], res["warmup"]["output_tokens"]) == (2, 12)
    assert not set(warmup_workload(2, 0, 0, 2.0)) & set(workload(4, 0, audio_seconds=2.0))
    # (inter-token gaps only where a clip's text arrived in more than one delta)
    assert 0 < res["ttft"]["p50_ms"] <= res["e2e"]["p50_ms"] and res["audio_seconds"] == 2.0
    beams = measure(url, 2, 0, 5, 2, None, num_beams=2, audio_seconds=2.0)
    assert (beams["completed"], beams["output_tokens"]) == (2, 10), beams["errors"]
    offline = compare_offline(url, workload(4, 0, audio_seconds=2.0), 6, 2,
                              {"device": "cpu", "dtype": "float32"},
                              warmup_prompts=warmup_workload(2, 0, 0, 2.0))
    assert offline["output_tokens"] == 24
    with pytest.raises(ValueError, match="audio-seconds must be in"):
        workload(1, 0, audio_seconds=31)
