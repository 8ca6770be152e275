"""Turning what a caller sends as audio into 16 kHz mono float32 samples, safely.

Accepted: raw bytes of a WAV, FLAC, OGG (Vorbis, Opus) or MP3 file, a local file path (only
where the `MediaPolicy` allows local paths, as for images), or samples already decoded (a 1-D
float array at 16 kHz). Decoding is libsndfile's (`soundfile`, whose wheels bundle
libsndfile 1.2 with MP3); resampling is soxr's (the SoX resampler, "HQ" quality: a linear-phase
band-limited filter), chosen over scipy's `resample_poly` because it is one small maintained
wheel made for this (scipy is a 40 MB dependency the runtime has no other use for) and its
sample-rate ratios are exact for any rate (44.1 kHz -> 16 kHz is 160/441 either way).
Anything undecodable, empty, over the byte limit or longer than the duration limit is a
ValueError naming the problem (the HTTP layer makes it a 400, or a 413 for bytes).
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from seq2serve.encoders.image_loader import MediaPolicy

SAMPLING_RATE = 16_000  # Whisper's


@dataclass(frozen=True)
class AudioLimits:
    max_bytes: int = 25 << 20  # an encoded file (OpenAI's limit for /v1/audio)
    max_seconds: float = 30.0  # one Whisper window (long audio is not cut into windows yet)


def read_audio(src: object, limits: AudioLimits | None = None,
               policy: MediaPolicy | None = None) -> np.ndarray:
    """The audio as 16 kHz mono float32 samples in [-1, 1] (a 1-D array)."""
    limits = limits or AudioLimits()
    policy = policy or MediaPolicy()
    if isinstance(src, np.ndarray):
        samples = _checked_samples(src)
    else:
        samples = _decode(_audio_bytes(src, limits, policy))
    seconds = samples.shape[0] / SAMPLING_RATE
    if seconds > limits.max_seconds:
        raise ValueError(f"the audio is {seconds:.2f} s long, over the limit of "
                         f"{limits.max_seconds:g} s (max_audio_seconds)")
    return samples


def _audio_bytes(src: object, limits: AudioLimits, policy: MediaPolicy) -> bytes:
    if isinstance(src, (bytes, bytearray, memoryview)):
        data = bytes(src)
    elif isinstance(src, (str, os.PathLike)):
        data = _read_local(os.fspath(src), limits, policy)
    else:
        raise ValueError(f"unsupported audio input of type {type(src).__name__} (give the "
                         f"file's bytes, a path, or 16 kHz samples as a 1-D float array)")
    if not data:
        raise ValueError("the audio file is empty")
    if len(data) > limits.max_bytes:
        raise ValueError(f"the audio file is {len(data)} bytes, over the limit of "
                         f"{limits.max_bytes} bytes (max_audio_bytes)")
    return data


def _read_local(path: str, limits: AudioLimits, policy: MediaPolicy) -> bytes:
    real = os.path.realpath(path)
    if policy.local_media_dir is not None:
        root = os.path.realpath(policy.local_media_dir)
        if os.path.commonpath([real, root]) != root:
            raise ValueError(f"local audio paths must be under {policy.local_media_dir}")
    elif not policy.allow_local_paths:
        raise ValueError("local audio paths are not allowed on this server")
    if not os.path.isfile(real):
        raise ValueError(f"no audio file at {path!r}")
    if os.path.getsize(real) > limits.max_bytes:
        raise ValueError(f"the audio file is {os.path.getsize(real)} bytes, over the limit "
                         f"of {limits.max_bytes} bytes (max_audio_bytes)")
    with open(real, "rb") as f:
        return f.read()


def _decode(data: bytes) -> np.ndarray:
    import soundfile
    import soxr

    try:
        with _readable(data) as src:
            samples, rate = soundfile.read(src, dtype="float32", always_2d=True,
                                           closefd=False)
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as e:
        raise ValueError(f"the audio cannot be decoded (WAV, FLAC, OGG or MP3 expected): "
                         f"{e}") from None
    if samples.shape[0] == 0:
        raise ValueError("the audio has no samples")
    mono = samples.mean(axis=1) if samples.shape[1] > 1 else samples[:, 0]
    if rate != SAMPLING_RATE:
        mono = soxr.resample(mono, rate, SAMPLING_RATE, quality="HQ")
    return np.ascontiguousarray(mono, dtype=np.float32)


@contextlib.contextmanager
def _readable(data: bytes) -> Iterator[int | io.BytesIO]:
    """The bytes as libsndfile should read them: an in-memory file's descriptor (Linux's
    memfd), which libsndfile reads in C with the GIL released. From a BytesIO it calls back
    into Python for every block it reads, and each callback waits for the GIL: on a server
    whose event loop and other decoder threads hold it, a 30 s WAV took ~120 ms a clip
    instead of ~3 (the twenty-first session; a single API server decoded a fifth as fast as
    four). Elsewhere, the BytesIO."""
    if not hasattr(os, "memfd_create"):
        yield io.BytesIO(data)
        return
    fd = os.memfd_create("seq2serve-audio", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


def _checked_samples(src: np.ndarray) -> np.ndarray:
    if src.ndim != 1:
        raise ValueError(f"audio samples must be a 1-D array (16 kHz mono), got shape "
                         f"{src.shape}")
    if src.shape[0] == 0:
        raise ValueError("the audio has no samples")
    if not np.issubdtype(src.dtype, np.floating):
        raise ValueError(f"audio samples must be floats in [-1, 1], got {src.dtype}")
    if not np.isfinite(src).all():
        raise ValueError("audio samples must be finite")
    return np.ascontiguousarray(src, dtype=np.float32)
