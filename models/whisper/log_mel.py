"""Whisper's log-mel spectrogram on the model's device: HF `WhisperFeatureExtractor`'s torch
path (`_torch_extract_fbank_features`), batched. Each window is 30 s of 16 kHz samples padded
with zeros (as the extractor pads them); a Hann-windowed STFT (400 points, hop 160, centred,
the last frame dropped), power spectrum, the extractor's own Slaney mel filters
(`transformers.audio_utils.mel_filter_bank`, computed once, float32), log10 floored at
1e-10 and at 8 decades below the window's peak, then (x + 4) / 4."""

from __future__ import annotations

import torch
from torch import nn

from seq2serve.models.whisper.config import HOP_LENGTH, N_FFT, SAMPLING_RATE


class LogMel(nn.Module):
    def __init__(self, num_mel_bins: int) -> None:
        super().__init__()
        self.num_mel_bins = num_mel_bins
        # float32 whatever the model's dtype: set by init_buffers, after the model's .to(dtype)
        self.filters: torch.Tensor | None = None  # [N_FFT // 2 + 1, mels]
        self.window: torch.Tensor | None = None  # [N_FFT] Hann

    def init_buffers(self, device: torch.device) -> None:
        from transformers.audio_utils import mel_filter_bank

        filters = mel_filter_bank(num_frequency_bins=1 + N_FFT // 2,
                                  num_mel_filters=self.num_mel_bins, min_frequency=0.0,
                                  max_frequency=8000.0, sampling_rate=SAMPLING_RATE,
                                  norm="slaney", mel_scale="slaney")
        self.filters = torch.from_numpy(filters).to(device, torch.float32)
        self.window = torch.hann_window(N_FFT, device=device)

    def forward(self, samples: torch.Tensor) -> torch.Tensor:
        """[windows, 480,000] float32 samples -> [windows, mels, 3,000] float32 features."""
        stft = torch.stft(samples, N_FFT, HOP_LENGTH, window=self.window, return_complex=True)
        power = (stft[..., :-1].abs() ** 2).contiguous()
        log_spec = torch.clamp(self.filters.T @ power, min=1e-10).log10()
        peak = log_spec.amax(dim=(1, 2), keepdim=True)  # each window's own
        return (torch.maximum(log_spec, peak - 8.0) + 4.0) / 4.0
