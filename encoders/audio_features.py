"""Audio as an encoder input: `AudioFeatures` (Whisper's payload, one 30 s window of log-mel
features) and `AudioProcessor`, which makes it from what a caller sends.

The features are exactly HF's: the checkpoint's own `WhisperFeatureExtractor` (its
preprocessor_config.json; a model directory without one gets the extractor's defaults with
the model's mel count) pads the samples to 30 s and computes the log-mel spectrogram (its
torch path: `torch.stft`, the Slaney mel filters, log10, an 8-decade floor, scaled). It runs
on the TokenizerManager's CPU threads; the extractor also takes a `device`, the step to run
it on the GPU when serving on one. The encoder cache keys a window by its decoded samples,
so a clip sent as a file and as its samples (or in two encodings that decode to the same
samples) is encoded once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import torch

from seq2serve.encoders.audio_loader import SAMPLING_RATE, AudioLimits, read_audio
from seq2serve.encoders.image_loader import MediaPolicy
from seq2serve.models.whisper.model import WindowBatch


@dataclass
class AudioFeatures:
    """One window of audio as the encoder reads it; its cross K/V are `num_tokens` (1,500)
    long. The features travel with the request (Whisper's are 80 or 128 x 3,000 float32:
    0.9-1.5 MB)."""

    features: torch.Tensor | None = field(repr=False)  # [mels, 3000] float32
    num_tokens: int
    key: str  # content hash of model and decoded samples

    @property
    def has_data(self) -> bool:
        return self.features is not None

    @classmethod
    def batch(cls, payloads: list[AudioFeatures]) -> WindowBatch:
        return WindowBatch(torch.stack([p.features for p in payloads]))


class AudioProcessor:
    """Caller's audio -> `AudioFeatures`, under byte, duration and path limits."""

    def __init__(self, model_path: str, model_id: str, num_mel_bins: int, audio_tokens: int,
                 limits: AudioLimits | None = None, policy: MediaPolicy | None = None) -> None:
        from transformers import WhisperFeatureExtractor

        try:
            self.extractor = WhisperFeatureExtractor.from_pretrained(model_path)
        except OSError:  # no preprocessor_config.json: Whisper's fixed settings
            self.extractor = WhisperFeatureExtractor(feature_size=num_mel_bins)
        if self.extractor.feature_size != num_mel_bins:
            raise ValueError(f"preprocessor_config.json: feature_size "
                             f"{self.extractor.feature_size} differs from config.json's "
                             f"num_mel_bins {num_mel_bins}")
        if self.extractor.sampling_rate != SAMPLING_RATE:
            raise ValueError(f"preprocessor_config.json: sampling_rate "
                             f"{self.extractor.sampling_rate}; Whisper's is {SAMPLING_RATE}")
        self.limits = limits or AudioLimits()
        window = self.extractor.chunk_length
        if self.limits.max_seconds > window:  # the extractor would cut the rest off unsaid
            raise ValueError(f"max_audio_seconds {self.limits.max_seconds:g}: audio longer "
                             f"than one {window} s window is not cut into windows yet")
        self.model_id = model_id
        self.audio_tokens = audio_tokens
        self.policy = policy or MediaPolicy()

    def __call__(self, src: object) -> AudioFeatures:
        samples = read_audio(src, self.limits, self.policy)
        return AudioFeatures(self.log_mel(samples), self.audio_tokens, self.key(samples))

    def log_mel(self, samples: np.ndarray) -> torch.Tensor:
        out = self.extractor(samples, sampling_rate=SAMPLING_RATE, return_tensors="pt")
        return out.input_features[0].to(torch.float32)

    def key(self, samples: np.ndarray) -> str:
        h = hashlib.blake2b(digest_size=16)
        h.update(self.model_id.encode())
        h.update(b"\0audio\0")
        h.update(samples.tobytes())
        return h.hexdigest()
