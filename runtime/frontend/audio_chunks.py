"""Long audio as Whisper's 30 s windows, and the windows' tokens merged back into one text:
HF's ASR pipeline's chunking (`pipeline(..., chunk_length_s=30, stride_length_s=5)`: its
`chunk_iter`) and its merge without timestamps (`_decode_asr` over the windows' text tokens,
`_find_longest_common_sequence`); other chunk lengths and strides (`chunking`) as the
pipeline takes them; or windows cut at silences from speech regions (`speech_windows`,
`chunking_strategy`). Pure functions of sample counts and token ids; no model.

Consecutive windows overlap by the two strides (10 s by default): each starts 20 s after the
one before. The merge slides each window's tokens over what came before, takes the offset
where the most tokens agree (ties to the longer overlap), and cuts both at the middle of that
overlap: the left window is trusted for its first half, the right one for its second.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

SAMPLING_RATE = 16_000
CHUNK_SAMPLES = 30 * SAMPLING_RATE  # one Whisper window
STRIDE_SAMPLES = 5 * SAMPLING_RATE  # HF's stride_length_s=5, on each side


@dataclass(frozen=True)
class Window:
    """One window of the audio: samples [start, end); its first `stride_left` and last
    `stride_right` samples are shared with the windows before and after it."""

    start: int
    end: int
    stride_left: int
    stride_right: int


def windows(num_samples: int, chunk: int = CHUNK_SAMPLES, stride_left: int = STRIDE_SAMPLES,
            stride_right: int = STRIDE_SAMPLES) -> list[Window]:
    """The windows HF's `chunk_iter` cuts `num_samples` samples into: one every
    `chunk - stride_left - stride_right` samples until one reaches the end (a last one no
    longer than its left stride, all of it already in the one before, is dropped). Audio of
    at most one chunk is one window."""
    step = chunk - stride_left - stride_right
    if step < 1:
        raise ValueError(f"a chunk of {chunk} samples leaves no step after strides of "
                         f"{stride_left} and {stride_right}")
    out = []
    for start in range(0, num_samples, step):
        is_last = start + chunk >= num_samples
        window = Window(start, min(start + chunk, num_samples), stride_left if start else 0,
                        0 if is_last else stride_right)
        if window.end - window.start > window.stride_left:
            out.append(window)
        if is_last:
            break
    return out


def speech_windows(regions: Sequence[tuple[int, int]],
                   chunk: int = CHUNK_SAMPLES) -> list[Window]:
    """Windows of at most `chunk` samples cut at silences (`chunking_strategy`): consecutive
    speech regions ([start, end) samples, in order, not overlapping, as a voice-activity
    detector gives them) joined while the span from the first one's start to the last one's
    end fits in a window (the silences between them stay in; those between windows are left
    out, as the audio before the first region and after the last). No strides: each window's
    text stands alone. A region longer than a window (the detector cuts them at 30 s) is cut
    every `chunk` samples."""
    out: list[Window] = []
    start = end = -1
    for s, e in regions:
        if start >= 0 and e - start <= chunk:
            end = e
            continue
        if start >= 0:
            out.append(Window(start, end, 0, 0))
        while e - s > chunk:
            out.append(Window(s, s + chunk, 0, 0))
            s += chunk
        start, end = s, e
    if start >= 0:
        out.append(Window(start, end, 0, 0))
    return out


def chunking(chunk_length_s: float = 30.0,
             stride_length_s: float | None = None) -> tuple[int, int, int]:
    """(chunk, stride_left, stride_right) in samples for HF's pipeline's `chunk_length_s` and
    `stride_length_s` (by default a sixth of the chunk on each side, as the pipeline's); a
    ValueError naming a chunk longer than Whisper's 30 s window or strides that leave it no
    step."""
    if not 0 < chunk_length_s <= CHUNK_SAMPLES / SAMPLING_RATE:
        raise ValueError(f"chunk_length_s must be in (0, 30] (Whisper's window), got "
                         f"{chunk_length_s:g}")
    stride_s = chunk_length_s / 6 if stride_length_s is None else stride_length_s
    chunk, stride = round(chunk_length_s * SAMPLING_RATE), round(stride_s * SAMPLING_RATE)
    if stride < 0 or chunk - 2 * stride < 1:
        raise ValueError(f"stride_length_s must be at least 0 and under half of "
                         f"chunk_length_s ({chunk_length_s:g} s), got {stride_s:g}")
    return chunk, stride, stride


def text_tokens(ids: Sequence[int], special_ids: Collection[int],
                timestamp_begin: int) -> list[int]:
    """A window's text tokens: its ids less the special tokens (end of text, language, task)
    and timestamps (ids from `timestamp_begin`, `<|notimestamps|>` + 1, on), which the
    pipeline's merge leaves out."""
    return [t for t in ids if t not in special_ids and t < timestamp_begin]


def merge_tokens(sequences: Sequence[Sequence[int]]) -> list[int]:
    """The windows' text tokens, in order, as one sequence (HF's merge; windows without
    text are skipped, as the pipeline skips them)."""
    seqs = [list(s) for s in sequences if len(s)]
    if not seqs:
        return []
    merged: list[int] = []
    left = seqs[0]
    for right in seqs[1:]:
        l_start, l_stop, r_start, r_stop = _best_overlap(left, right)
        merged.extend(left[:(l_start + l_stop) // 2])
        left = right[(r_start + r_stop) // 2:]
    return merged + left


def _best_overlap(left: list[int], right: list[int]) -> tuple[int, int, int, int]:
    """Where `right`'s start best lies over `left`'s end: (left_start, left_stop,
    right_start, right_stop) of the aligned spans with the highest share of equal tokens
    (at least two of them; plus i / 10,000 at overlap i, so a longer perfect match wins),
    or the empty overlap at left's end when none has two."""
    a, b = np.asarray(left), np.asarray(right)
    n, m = len(a), len(b)
    best, span = 0.0, (n, n, 0, 0)
    for i in range(1, n + m):
        l_start, l_stop = max(0, n - i), min(n, n + m - i)
        r_start, r_stop = max(0, i - n), min(m, i)
        matches = int(np.sum(a[l_start:l_stop] == b[r_start:r_stop]))
        score = matches / i + i / 10000.0  # HF's very expression: the same ties
        if matches > 1 and score > best:
            best, span = score, (l_start, l_stop, r_start, r_stop)
    return span
