"""Whisper against Hugging Face in float32 on tiny random checkpoints (a multilingual one and
an English-only one, tests/whisper_checkpoints.py): audio files through `Seq2SeqEngine` give
HF `generate`'s tokens exactly, greedy and beam search, with HF's forced prompt and its
suppress / begin-suppress tokens; the audio front end (decoding, resampling, limits) and the
log-mel features against independent references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seq2serve.encoders.audio_features import AudioProcessor
from seq2serve.encoders.audio_loader import AudioLimits, read_audio
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.frontend.engine import Seq2SeqEngine
from seq2serve.runtime.frontend.transcription import WhisperPrompt
from seq2serve.tests.whisper_checkpoints import (
    clip,
    encoded,
    hf_models,
    tiny_checkpoints,
)

pytest.importorskip("soundfile")
pytest.importorskip("soxr")

MAX_NEW = 12
GREEDY = {"max_new_tokens": MAX_NEW, "temperature": 0}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoints(tmp_path_factory.mktemp("whisper"))


@pytest.fixture(scope="module")
def hf(ckpt):
    return hf_models(ckpt)


def hf_generate(hf, kind: str, samples: np.ndarray, **kwargs) -> torch.Tensor:
    model, extractor = hf[kind]
    features = extractor(samples, sampling_rate=16_000, return_tensors="pt").input_features
    with torch.no_grad():
        return model.generate(features, max_new_tokens=MAX_NEW, **kwargs)


@pytest.fixture(scope="module")
def engines(ckpt):
    with Seq2SeqEngine(model_path=ckpt["multilingual"], device="cpu", dtype="float32",
                       max_audio_seconds=29, max_audio_bytes=2_000_000) as m, \
            Seq2SeqEngine(model_path=ckpt["english"], device="cpu", dtype="float32") as e:
        yield {"multilingual": m, "english": e}


def test_greedy_matches_hf_for_files_of_every_format(ckpt, hf, engines):
    """WAV at 44.1 kHz, FLAC at 16 kHz, OGG and MP3 at 22.05 kHz, and raw samples: each
    decoded and resampled to 16 kHz (the oracle gets the same samples), as one batch."""
    files = [encoded(clip(0, rate=44_100), 44_100, "WAV"), encoded(clip(1), 16_000, "FLAC"),
             encoded(clip(2, rate=22_050), 22_050, "OGG"),
             encoded(clip(3, rate=22_050), 22_050, "MP3"), clip(4)]
    for kind, language, task in (("multilingual", "de", "transcribe"),
                                 ("multilingual", "french", "translate"),
                                 ("english", None, "transcribe")):
        prompt = WhisperPrompt.from_model(ckpt[kind]).tokens(language, task)
        got = engines[kind].generate(audio_data=files, decoder_input_ids=prompt,
                                     sampling_params=GREEDY)
        hf_args = {} if language is None else {"language": language, "task": task}
        expected = [hf_generate(hf, kind, read_audio(f), **hf_args)[0].tolist() for f in files]
        assert [r["output_ids"] for r in got] == expected, (kind, language, task)
        assert len({tuple(e) for e in expected}) >= 3, "outputs should differ by clip"
        cfg = ModelConfig.from_path(ckpt[kind])
        for r in got:  # HF's suppress and begin-suppress tokens, banned here too
            assert not set(r["output_ids"]) & set(cfg.suppressed_token_ids)
            assert r["output_ids"][0] not in cfg.begin_suppressed_token_ids


def test_without_a_decoder_prompt_and_streamed(ckpt, hf, engines):
    """An English-only model's default prompt is HF's; a multilingual one needs a language.
    A stream's pieces add up to the result."""
    got = engines["english"].generate(audio_data=clip(3), sampling_params=GREEDY)
    assert got["output_ids"] == hf_generate(hf, "english", clip(3))[0].tolist()
    chunks = list(engines["english"].generate(audio_data=clip(3), sampling_params=GREEDY,
                                              stream=True))
    assert [t for c in chunks for t in c["output_ids"]] == got["output_ids"]
    assert "".join(c["text"] for c in chunks) == got["text"]
    with pytest.raises(ValueError,
                       match=r"give decoder_input_ids: .*names a language.*detect it"):
        engines["multilingual"].generate(audio_data=clip(3), sampling_params=GREEDY)


def test_beam_search_matches_hf(ckpt, hf, engines):
    """The best hypothesis and its score. (HF's Whisper generate reads num_return_sequences
    k as k copies of the input, each searched for its best: k equal results, unlike the
    runtime's k best of one search, so only k = 1 is compared.)"""
    prompt = WhisperPrompt.from_model(ckpt["multilingual"]).tokens("en")
    eot = hf["multilingual"][0].generation_config.eos_token_id
    for seed in (0, 2, 5):
        samples = clip(seed)
        out = hf_generate(hf, "multilingual", samples, language="en", task="transcribe",
                          num_beams=3, length_penalty=0.8, return_dict_in_generate=True,
                          output_scores=True)
        got = engines["multilingual"].generate(
            audio_data=samples, decoder_input_ids=prompt,
            sampling_params={"max_new_tokens": MAX_NEW, "num_beams": 3,
                             "length_penalty": 0.8})
        seq = out.sequences[0].tolist()
        assert seq[:len(prompt)] == prompt
        tokens = seq[len(prompt):]
        end = tokens.index(eot) + 1 if eot in tokens else len(tokens)
        assert got["output_ids"] == tokens[:end], seed
        assert got["meta_info"]["beam_score"] == pytest.approx(out.sequences_scores[0].item(),
                                                              abs=1e-4)


def test_a_repeated_clip_is_encoded_once_as_a_file_or_as_samples(ckpt, engines, tmp_path):
    """The encoder cache keys audio by its decoded samples: a float WAV of the samples (read
    from a path: the engine's caller may name files) and the samples themselves are one
    entry."""
    engine = engines["multilingual"]
    prompt = WhisperPrompt.from_model(ckpt["multilingual"]).tokens("en")
    samples = clip(7)
    path = tmp_path / "clip.wav"
    path.write_bytes(encoded(samples, 16_000, "WAV", "FLOAT"))
    assert engine.flush_cache()
    before = engine.stats()["encoder_inputs"]
    first = engine.generate(audio_data=str(path), decoder_input_ids=prompt,
                            sampling_params=GREEDY)
    again = engine.generate(audio_data=samples, decoder_input_ids=prompt,
                            sampling_params=GREEDY)
    assert again["output_ids"] == first["output_ids"]
    assert again["meta_info"]["encoder_cache_hit"]
    assert engine.stats()["encoder_inputs"] - before == 1
    engine.check_integrity()


def test_audio_reaches_the_scheduler_as_a_store_file_or_inline_when_it_has_no_room(
        ckpt, engines, monkeypatch):
    """A window's samples travel as a PixelStore file: a repeat is a cache hit, and after the
    scheduler drops it (flush_cache) it reads the file again and answers as before. With no
    room in the store the samples travel in the request: the same answer, nothing pinned."""
    engine = engines["multilingual"]
    tm = engine.tokenizer_manager
    prompt = WhisperPrompt.from_model(ckpt["multilingual"]).tokens("en")
    samples = -clip(11)  # used by no other test
    gen = lambda: engine.generate(audio_data=samples, decoder_input_ids=prompt,  # noqa: E731
                                  sampling_params=GREEDY)
    assert engine.flush_cache()
    before = engine.stats()["encoder_inputs"]
    a, b = gen(), gen()
    assert engine.flush_cache()
    c = gen()
    assert [x["meta_info"]["encoder_cache_hit"] for x in (a, b, c)] == [False, True, False]
    assert a["output_ids"] == b["output_ids"] == c["output_ids"]
    assert engine.stats()["encoder_inputs"] - before == 2
    assert tm.pixel_store.num_files >= 1 and not tm.pixel_store.pins

    def full(key, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tm.pixel_store, "put", full)
    assert engine.flush_cache()
    d = gen()
    assert d["output_ids"] == a["output_ids"] and not d["meta_info"]["encoder_cache_hit"]
    assert not tm.pixel_store.pins
    engine.check_integrity()


def test_bad_audio_and_wrong_inputs_are_named(ckpt, engines):
    engine = engines["multilingual"]
    prompt = WhisperPrompt.from_model(ckpt["multilingual"]).tokens("en")
    for audio, message in ((b"", "the audio file is empty"),
                           (b"RIFF\x00\x00garbage" * 10, "cannot be decoded"),
                           (clip(0, seconds=29.5),
                            r"29.50 s long, over the limit of 29 s \(max_audio_seconds\)"),
                           (b"RIFF" * 500_001,
                            r"2000004 bytes, over the limit of 2000000 bytes \(max_audio_bytes\)"),
                           (np.zeros((2, 100), np.float32), "1-D array")):
        with pytest.raises(ValueError, match=message):
            engine.generate(audio_data=audio, decoder_input_ids=prompt, sampling_params=GREEDY)
    with pytest.raises(ValueError, match="input is audio: give audio_data"):
        engine.generate(input_ids=[1, 2], decoder_input_ids=prompt)
    with pytest.raises(ValueError, match="exactly one of"):
        engine.generate(input_ids=[1, 2], audio_data=clip(0))
    with pytest.raises(ValueError, match="names a language: give one .of de, en, fr.*detect it"):
        WhisperPrompt.from_model(ckpt["multilingual"]).tokens(None)
    with pytest.raises(ValueError, match="English-only"):
        WhisperPrompt.from_model(ckpt["english"]).tokens("de")
    with pytest.raises(ValueError, match="tp_size 2 does not divide the model's 3 attention"):
        from seq2serve.models.loader import check_tensor_parallel

        check_tensor_parallel(ModelConfig.from_path(ckpt["english"]), 2)


def test_prompts_are_hfs_init_tokens(ckpt, hf):
    """The forced prompt is the one HF's Whisper generate builds from generation_config.json
    for the language and task (its beam search returns it in front of the tokens). (HF's
    tokenizer's `prefix_tokens` would not do as an oracle: it numbers languages by their
    place in Whisper's 99-language table, which a tiny vocabulary does not have.)"""
    for kind, language, task in (("multilingual", "de", "transcribe"),
                                 ("multilingual", "fr", "translate"),
                                 ("english", None, "transcribe")):
        prompt = WhisperPrompt.from_model(ckpt[kind]).tokens(language, task)
        hf_args = {} if language is None else {"language": language, "task": task}
        out = hf_generate(hf, kind, clip(1), num_beams=2, return_dict_in_generate=True,
                          **hf_args)
        assert out.sequences[0, :len(prompt)].tolist() == prompt, (kind, language, task)


def test_audio_decoding_resampling_and_limits(tmp_path):
    t = np.arange(44_100) / 44_100
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    expected = 0.5 * np.sin(2 * np.pi * 440 * np.arange(16_000) / 16_000)
    for fmt, tol in (("WAV", 2e-3), ("FLAC", 2e-3), ("OGG", 0.05), ("MP3", 0.1)):
        got = read_audio(encoded(tone, 44_100, fmt))
        assert got.dtype == np.float32 and got.ndim == 1
        n = min(len(got), 16_000)
        assert abs(n - 16_000) < 1200, fmt  # lossy codecs may pad a frame
        if fmt in ("WAV", "FLAC"):  # a real resampler: the tone at 16 kHz, away from the ends
            assert np.abs(got[500:15_500] - expected[500:15_500]).max() < tol, fmt
    stereo = np.stack([tone, -tone], axis=1)  # averaged to silence
    assert np.abs(read_audio(encoded(stereo, 44_100, "WAV"))).max() < 1e-3
    path = tmp_path / "a.wav"
    path.write_bytes(encoded(tone, 44_100, "WAV"))
    with pytest.raises(ValueError, match="local audio paths are not allowed"):
        read_audio(str(path))
    with pytest.raises(ValueError, match="over the limit of 1000 bytes.*max_audio_bytes"):
        read_audio(encoded(tone, 44_100, "WAV"), AudioLimits(max_bytes=1000))
    with pytest.raises(ValueError, match="over the limit of 0.5 s"):
        read_audio(encoded(tone, 44_100, "WAV"), AudioLimits(max_seconds=0.5))
    with pytest.raises(ValueError, match="no samples"):
        read_audio(encoded(np.zeros(0, np.float32), 16_000, "WAV"))


def test_decoding_from_memory_is_libsndfiles_reading_and_leaves_no_descriptor_open():
    """`read_audio` hands libsndfile an in-memory file's descriptor (no Python callbacks per
    block): the samples are those libsndfile reads from a file-like object, and neither a
    good file nor a corrupt one leaves a descriptor behind."""
    import io
    import os

    import soundfile

    rng = np.random.default_rng(0)
    noise = (0.3 * rng.standard_normal(16_000 * 3)).astype(np.float32)
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    for fmt, subtype in (("WAV", "PCM_16"), ("WAV", "PCM_24"), ("WAV", "FLOAT"),
                         ("FLAC", None), ("OGG", None), ("MP3", None)):
        data = encoded(noise, 16_000, fmt, subtype)
        expected, rate = soundfile.read(io.BytesIO(data), dtype="float32")
        assert rate == 16_000
        np.testing.assert_array_equal(read_audio(data), expected, err_msg=f"{fmt} {subtype}")
    for bad in (b"RIFF" + b"\0" * 40, b"not audio at all"):
        with pytest.raises(ValueError, match="cannot be decoded"):
            read_audio(bad)
    if fds is not None:
        assert len(os.listdir("/proc/self/fd")) == fds


def test_max_running_requests_windows_decode_together_in_the_default_pools(ckpt):
    """The cross pool planned for `max_running_requests` holds that many windows' pages: a
    window's 1,500 positions take 94 pages of 16 (1,504 slots), and a pool of 3 x 1,500 slots
    ran only two at once (whisper-large-v3 served 127 of 128 on an H200)."""
    clips = [clip(40 + i, 3.0) for i in range(3)]
    with Seq2SeqEngine(model_path=ckpt["english"], device="cpu", dtype="float32",
                       max_running_requests=3) as engine:
        outs = engine.generate(audio_data=clips, sampling_params={
            "max_new_tokens": 3, "min_new_tokens": 3, "temperature": 0})
        stats = engine.stats()
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [3, 3, 3]
    assert stats["max_batch_by_mode"]["decode"] == 3, stats["max_batch_by_mode"]


def test_audio_over_one_window_is_refused_at_start(ckpt):
    with pytest.raises(ValueError, match="max_audio_seconds 45: .* not cut into windows yet"):
        AudioProcessor(ckpt["english"], "m", 80, 1500, AudioLimits(max_seconds=45))


def test_log_mel_equals_hfs_extractor(ckpt):
    """The model's log-mel of a padded batch: bit for bit HF's extractor (its torch path,
    one clip at a time), and within 1e-4 of its independent numpy path."""
    from transformers import WhisperFeatureExtractor

    from seq2serve.encoders.audio_features import AudioFeatures
    from seq2serve.models.whisper.log_mel import LogMel

    clips = [clip(3, seconds=7.3), clip(4, seconds=30), clip(5, seconds=0.2)]
    for mels in (80, 128):
        log_mel = LogMel(mels)
        log_mel.init_buffers(torch.device("cpu"))
        batch = AudioFeatures.batch([AudioFeatures(torch.from_numpy(c), 1500, "k")
                                     for c in clips])
        ours = log_mel(batch.samples)
        ex = WhisperFeatureExtractor(feature_size=mels)
        hf = torch.stack([ex(c, sampling_rate=16_000, return_tensors="pt").input_features[0]
                          for c in clips])
        assert ours.shape == (3, mels, 3000)
        assert torch.equal(ours, hf)
        reference = ex._np_extract_fbank_features(batch.samples.numpy(), "cpu")
        assert np.abs(ours.numpy() - reference).max() < 1e-4


def test_a_preprocessor_config_that_differs_is_named(ckpt, tmp_path):
    import json
    import shutil

    path = tmp_path / "m"
    shutil.copytree(ckpt["english"], path)
    (path / "preprocessor_config.json").write_text(json.dumps({"feature_size": 80,
                                                               "hop_length": 320}))
    with pytest.raises(ValueError, match="hop_length 320; this Whisper log-mel computes 160"):
        AudioProcessor(str(path), "m", 80, 1500)


def test_an_audio_batch_splits_into_rows_like_prompts():
    from seq2serve.runtime.frontend.generate_request import GenerateReqInput, split_rows

    audios = [clip(s, seconds=0.1) for s in range(3)]
    obj = GenerateReqInput(audio_data=audios, decoder_input_ids=[[1], [2], [3]])
    chunks = split_rows(obj, 2)
    assert [len(c.audio_data) for c in chunks] == [2, 1]
    assert [c.decoder_input_ids for c in chunks] == [[[1], [2]], [[3]]]
    is_batch, items = chunks[1].normalize()
    assert is_batch and items[0]["audio_data"] is audios[2] and items[0]["input_ids"] == []
    assert not GenerateReqInput(audio_data=audios[0]).normalize()[0]
