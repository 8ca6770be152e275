"""Synthetic workloads for benchmarks: random token ids (and random images, or 30 s audio
clips for a speech model), distinct per request so that no cache can serve one request from
another's work."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Workload:
    num_requests: int
    input_len: int  # encoder tokens (T5) or prompt tokens (decoder-only, Mllama)
    output_len: int
    image_size: int = 0  # a square image of this many pixels a side (Mllama's 1120: 4 tiles)
    seed: int = 0


@dataclass
class BenchRequest:
    input_ids: list[int]  # the encoder's tokens; a speech model's decoder prompt
    image: object | None = None  # PIL image
    audio: np.ndarray | None = None  # a speech model's encoder input: 16 kHz float32 samples


def make_requests(wl: Workload, vocab_size: int, is_encoder_decoder: bool,
                  image_token_id: int | None = None, bos: int = 128000,
                  eos: int = 1) -> list[BenchRequest]:
    """An encoder-decoder model with an image token (Florence-2) gets an image and a prompt
    of `input_len` tokens (BOS 0 ... EOS, without the image's placeholders) per request."""
    rng = random.Random(wl.seed)
    reqs = []
    for i in range(wl.num_requests):
        if is_encoder_decoder and image_token_id is not None:
            # (below the image token, Florence-2's last id: never a placeholder in the prompt)
            top = min(vocab_size, 32000, image_token_id)
            ids = [rng.randrange(3, top) for _ in range(wl.input_len - 2)]
            reqs.append(BenchRequest([0] + ids + [eos], image=random_image(
                wl.seed * 100003 + i, wl.image_size)))
        elif is_encoder_decoder:  # a source ending with the model's EOS (T5's: 1)
            ids = [rng.randrange(3, min(vocab_size, 32000)) for _ in range(wl.input_len - 1)]
            reqs.append(BenchRequest(ids + [eos]))
        elif image_token_id is not None:
            ids = [rng.randrange(1000, 100000) for _ in range(wl.input_len - 2)]
            reqs.append(BenchRequest([image_token_id, bos] + ids, image=random_image(
                wl.seed * 100003 + i, wl.image_size)))
        else:
            reqs.append(BenchRequest([bos] + [rng.randrange(1000, 100000)
                                              for _ in range(wl.input_len - 1)]))
    return reqs


def model_requests(mc, n: int, input_len: int, output_len: int,
                   image_size: int | None = None) -> list[BenchRequest]:
    """`n` requests for the model of ModelConfig `mc`: with a random image where it reads one
    (default size: Mllama's 1120, four tiles; else 768, Florence-2's processor size)."""
    info = mc.arch.frontend_info()
    if info.get("has_audio"):
        return audio_requests(mc.model_path, n)
    image_token = info.get("image_token_id")
    size = image_size or (1120 if info.get("tokens_per_tile") else 768)
    wl = Workload(n, input_len, output_len, image_size=size if image_token is not None else 0)
    eos = mc.eos_token_ids[0] if mc.eos_token_ids else 1
    return make_requests(wl, mc.vocab_size, mc.is_encoder_decoder, image_token, eos=eos)


def random_image(seed: int, size: int):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((size, size, 3)) * 255).astype("uint8"))


CLIP_SECONDS = 30.0  # one whole Whisper window: the encoder's fixed 1,500 positions
AUDIO_LANGUAGE = "en"


def audio_requests(model_dir: str, n: int, seed: int = 0,
                   seconds: float = CLIP_SECONDS) -> list[BenchRequest]:
    """`n` distinct clips (`synthetic_clip`), each with Whisper's usual decoder prompt:
    start of transcript, English, transcribe, no timestamps (an English-only model's: start
    and no timestamps), as `Seq2SeqEngine.transcribe` and /v1/audio/transcriptions make it."""
    from seq2serve.runtime.frontend.transcription import WhisperPrompt

    whisper = WhisperPrompt.from_model(model_dir)
    prompt = whisper.tokens(AUDIO_LANGUAGE if whisper.is_multilingual else None)
    return [BenchRequest(list(prompt), audio=synthetic_clip(seed * 100003 + i, seconds))
            for i in range(n)]


def synthetic_clip(seed: int, seconds: float = CLIP_SECONDS, rate: int = 16_000) -> np.ndarray:
    """Three tones with a slow tremolo and some noise, different per seed, in [-1, 1]:
    deterministic audio whose log-mel is not constant (the features are computed from it as
    in serving)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    x = sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 6)) for f in rng.uniform(100, 3000, 3))
    x *= 0.6 + 0.4 * np.sin(2 * np.pi * rng.uniform(0.1, 2) * t)
    return (x / 4 + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)


def wav_clips(n: int, seconds: float, seed: int = 0) -> list[bytes]:
    """`n` distinct `synthetic_clip`s as 16-bit WAV files (what a client uploads to
    /v1/audio/transcriptions), the same for a seed in every process."""
    import io

    import soundfile

    out = []
    for i in range(n):
        buf = io.BytesIO()
        soundfile.write(buf, synthetic_clip(seed * 100003 + i, seconds), 16_000,
                        format="WAV", subtype="PCM_16")
        out.append(buf.getvalue())
    return out
