"""Synthetic audio a voice-activity detector takes for speech, deterministic from a seed: a
glottal pulse train (its pitch gliding, 110-150 Hz) through the formant filters of one of six
vowels (/a i u e o ae/'s first three formants), a new vowel every ~120 ms, each syllable
faded in and out, on a -2 spectral tilt. Silero VAD gives it speech probabilities near 1
(pure tones and noise stay near 0), so tests can place speech and silence where they want
it; Silero itself still says where the speech is (the tests' oracle)."""

from __future__ import annotations

import numpy as np

RATE = 16_000
# (F1, F2, F3) in Hz of six vowels (Peterson & Barney's averages, men)
VOWELS = ((730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480),
          (570, 840, 2410), (660, 1720, 2410))


def speech_like(seconds: float, seed: int = 0, pitch: float = 130.0) -> np.ndarray:
    """`seconds` of vowel-like syllables at 16 kHz, peak 0.3, float32."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    t = np.arange(n) / RATE
    f0 = pitch * (1 + 0.15 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, 6))
                  + 0.05 * np.sin(2 * np.pi * 4.3 * t))
    pulses = (np.diff(np.floor(np.cumsum(f0) / RATE), prepend=0) > 0).astype(float)
    out, start = np.zeros(n), 0
    while start < n:
        length = min(int(rng.uniform(0.7, 1.3) * 0.12 * RATE), n - start)
        f = np.fft.rfftfreq(length, 1 / RATE)
        vowel = VOWELS[rng.integers(len(VOWELS))]
        shape = sum(0.8 ** i / np.sqrt(1 + ((f ** 2 - F ** 2) / (f * (60 + 40 * i) + 1e-9)) ** 2)
                    for i, F in enumerate(vowel))
        shape = shape * (np.maximum(f, 50) / 100) ** -2.0 * f / 1000
        y = np.fft.irfft(np.fft.rfft(pulses[start:start + length]) * shape, length)
        out[start:start + length] = (y / (np.abs(y).max() + 1e-9) * np.hanning(length) ** 0.5
                                     * rng.uniform(0.5, 1.0))
        start += length
    return (0.3 * out / np.abs(out).max()).astype(np.float32)


def speech_and_silence(layout: list[tuple[str, float]], seed: int = 0) -> np.ndarray:
    """Speech ("speech", seconds) and digital silence ("silence", seconds) in order."""
    parts = [speech_like(s, seed + i) if kind == "speech" else np.zeros(int(s * RATE), np.float32)
             for i, (kind, s) in enumerate(layout)]
    return np.concatenate(parts)
