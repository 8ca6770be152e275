"""Audio as an encoder input: `AudioFeatures` (Whisper's payload: one 30 s window's samples)
and `AudioProcessor`, which makes it from what a caller sends.

The payload carries the decoded 16 kHz samples, not features: the model computes the log-mel
spectrogram on its own device as HF's `WhisperFeatureExtractor` computes it
(`models/whisper/log_mel.py`), so a GPU server spends no frontend CPU on it. The encoder
cache keys a window by its samples, so a clip sent as a file and as its samples (or in two
encodings that decode to the same samples) is encoded once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from seq2serve.encoders.audio_loader import AudioLimits, read_audio
from seq2serve.encoders.image_loader import MediaPolicy
from seq2serve.encoders.pixel_store import read_pixels
from seq2serve.models.whisper.config import (
    CHUNK_SECONDS,
    HOP_LENGTH,
    N_FFT,
    N_SAMPLES,
    SAMPLING_RATE,
)
from seq2serve.models.whisper.model import WindowBatch

# preprocessor_config.json's settings the model's log-mel assumes (every Whisper's)
_FIXED = {"sampling_rate": SAMPLING_RATE, "n_fft": N_FFT, "hop_length": HOP_LENGTH,
          "chunk_length": CHUNK_SECONDS, "padding_value": 0.0, "dither": 0.0,
          "do_normalize": False}


@dataclass
class AudioFeatures:
    """One window of audio (at most 30 s); its cross K/V are `num_tokens` (1,500) long.

    Between processes the samples (4 bytes each: 1.9 MB for 30 s) travel as a file of the
    tokenizer manager's `PixelStore` (`stored`), as images' pixels do: the request carries
    the file's name, and the scheduler reads it only if its encoder cache misses. Pickled
    into the request instead, a window cost the frontend and the scheduler a few ms each
    (the scheduler's between decode steps)."""

    samples: torch.Tensor | None = field(repr=False)  # [n <= 480,000] float32, 16 kHz
    num_tokens: int
    key: str  # content hash of model and samples (and seek)
    seek: int = 0  # the first log-mel frame the encoder reads (`WindowBatch.seeks`)
    sample_file: str | None = None  # the PixelStore file holding the samples

    @property
    def has_data(self) -> bool:
        return self.samples is not None or (
            self.sample_file is not None and os.path.exists(self.sample_file))

    @property
    def host_data(self) -> torch.Tensor | None:
        """The samples, where the request itself carries them (what a store would keep)."""
        return self.samples

    def stored(self, path: str) -> AudioFeatures:
        """The same window with its samples left in a PixelStore file at `path`."""
        return dataclasses.replace(self, samples=None, sample_file=path)

    def read(self) -> torch.Tensor:
        if self.samples is not None:
            return self.samples
        return read_pixels(self.sample_file, torch.float32, (-1,))

    @classmethod
    def batch(cls, payloads: list[AudioFeatures], pin: bool = False) -> WindowBatch:
        """The windows zero-padded to 30 s, as HF's extractor pads them (page-locked with
        `pin`)."""
        out = torch.zeros(len(payloads), N_SAMPLES, pin_memory=pin)
        for row, p in zip(out, payloads):
            samples = p.read()
            row[:samples.numel()] = samples
        seeks = tuple(p.seek for p in payloads)
        return WindowBatch(out, seeks if any(seeks) else ())


class AudioProcessor:
    """Caller's audio -> `AudioFeatures`, under byte, duration and path limits."""

    def __init__(self, model_path: str, model_id: str, num_mel_bins: int, audio_tokens: int,
                 limits: AudioLimits | None = None, policy: MediaPolicy | None = None) -> None:
        _check_preprocessor(model_path, num_mel_bins)
        self.limits = limits or AudioLimits()
        if self.limits.max_seconds > CHUNK_SECONDS:  # would be cut off unsaid
            raise ValueError(f"max_audio_seconds {self.limits.max_seconds:g}: audio longer "
                             f"than one {CHUNK_SECONDS} s window is not cut into windows yet")
        self.model_id = model_id
        self.audio_tokens = audio_tokens
        self.policy = policy or MediaPolicy()

    def __call__(self, src: object, seek: int = 0) -> AudioFeatures:
        """`seek`: the encoder reads the window's log-mel frames from there on, zero-padded
        (Whisper's re-decoding from a segment's end: `runtime/frontend/whisper_seek.py`)."""
        samples = read_audio(src, self.limits, self.policy)
        return AudioFeatures(torch.from_numpy(samples), self.audio_tokens,
                             self.key(samples, seek), seek)

    def key(self, samples: np.ndarray, seek: int = 0) -> str:
        # SHA-256: the CPU's SHA extensions hash a 30 s window in ~1 ms (BLAKE2b took 3.5),
        # read in place (no copy of the samples)
        h = hashlib.sha256()
        h.update(self.model_id.encode())
        h.update(b"\0audio\0")
        h.update(memoryview(np.ascontiguousarray(samples, dtype=np.float32)).cast("B"))
        if seek:  # other frames, another encoder output
            h.update(f"\0seek {seek}".encode())
        return h.hexdigest()[:32]


def _check_preprocessor(model_path: str, num_mel_bins: int) -> None:
    """A ValueError naming any preprocessor_config.json setting the model's log-mel does not
    compute as written (a directory without the file gets Whisper's)."""
    path = os.path.join(model_path, "preprocessor_config.json")
    if not os.path.isfile(path):
        return
    with open(path) as f:
        cfg = json.load(f)
    for key, value in {**_FIXED, "feature_size": num_mel_bins}.items():
        if key in cfg and cfg[key] != value:
            raise ValueError(f"preprocessor_config.json: {key} {cfg[key]!r}; this Whisper "
                             f"log-mel computes {value!r}")
