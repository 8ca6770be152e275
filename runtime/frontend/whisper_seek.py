"""HF's re-decoding of a Whisper window from its last complete segment (the sequential loop of
`WhisperGenerationMixin.generate`, which plain `generate(return_timestamps=True)` runs even
on one window of at most 30 s; `force_unique_generate_call=True` turns it off). Pure: token
ids in, segments and the next seek out; no model, no tokenizer.

A window's log-mel features are 3,000 frames (10 ms each; two a timestamp token). Its first
decode reads them from frame 0 (`seek` 0). Its generated tokens (the end of text left off)
are cut into segments by HF's `_retrieve_segment`:

- with a pair of consecutive timestamps somewhere: a segment per pair (from the timestamp
  after one pair to the first of the next). A single last timestamp (text, then one
  timestamp: the model says no speech follows) closes the last segment and ends the window.
  Otherwise (text after the last pair, or a pair at the very end) the tokens after the last
  pair are dropped, the last segment keeps both of its pair's timestamps, and the window is
  decoded again from the first timestamp of that pair: `seek` moves there (2 frames a
  timestamp step), and the encoder reads the frames from `seek` on, zero-padded (0.0 in
  the log-mel space, HF's `_get_input_segment`) back to 3,000;
- without a pair: the whole decode is one segment from `seek`, ending at its last timestamp
  (unless that is `<|0.00|>`) or at the window's end, and the window is done.

The times are `seek` in seconds plus the timestamps' (HF's `time_offset`); the tokens are the
decodes' own (their timestamps count from their own `seek`). HF's `sequences` are the
segments' tokens end to end. Where HF would seek by 0 frames (a last pair at `<|0.00|>`: it
decodes the same frames again, forever) the window ends instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

WINDOW_FRAMES = 3000  # log-mel frames of a 30 s window (N_SAMPLES / HOP_LENGTH)
FRAMES_PER_STAMP = 2  # the encoder's stride: a timestamp step (20 ms) is two frames
TIME_PRECISION = 0.02  # seconds per timestamp step
FRAME_SECONDS = 0.01  # seconds per frame (HF's time_precision_features)


@dataclass(frozen=True)
class SeekSegment:
    start: float  # seconds from the window's start
    end: float
    tokens: list[int]  # its tokens as decoded (timestamps relative to `seek`)
    seek: int  # the frame its decode started at (OpenAI's segment `seek`)


@dataclass
class WindowSeek:
    """One window's decodes so far: its segments and where the next decode starts (`seek`,
    frames); `done` once `seek` reaches the window's end."""

    begin: int  # the first timestamp token (<|0.00|>)
    eos: int
    seek: int = 0
    segments: list[SeekSegment] = field(default_factory=list)
    decodes: int = 0

    @property
    def done(self) -> bool:
        return self.seek >= WINDOW_FRAMES

    @property
    def sequence(self) -> list[int]:
        """HF's `sequences` for the window: the segments' tokens end to end."""
        return [t for s in self.segments for t in s.tokens]

    def add(self, output_ids: Sequence[int]) -> None:
        """The generated tokens of the decode from `seek`: its segments kept, `seek` moved."""
        ids = list(output_ids)
        if ids and ids[-1] == self.eos:
            ids.pop()
        new, offset = retrieve_segments(ids, self.begin, self.seek)
        self.segments += new
        self.decodes += 1
        self.seek = WINDOW_FRAMES if offset <= 0 else self.seek + offset


def retrieve_segments(ids: Sequence[int], begin: int,
                      seek: int = 0) -> tuple[list[SeekSegment], int]:
    """HF's `_retrieve_segment` for one decode's tokens (no end of text) from frame `seek` of
    a 3,000-frame window: (its segments, how many frames `seek` moves on)."""
    frames = WINDOW_FRAMES - seek
    offset = seek * TIME_PRECISION / FRAMES_PER_STAMP  # HF's time_offset
    stamp = [t >= begin for t in ids]
    single_ending = stamp[-2:] == [False, True]
    cuts = [i + 1 for i in range(len(ids) - 1) if stamp[i] and stamp[i + 1]]
    if not cuts:
        # the window's end, in steps: HF computes it in float32 (and truncates), which for
        # some frame counts is one step less than exact arithmetic gives
        last = int(np.float32(frames) * np.float32(FRAME_SECONDS) / np.float32(TIME_PRECISION))
        stamps = [t for t in ids if t >= begin]
        if stamps and stamps[-1] != begin:
            last = stamps[-1] - begin
        return [SeekSegment(_time(offset, 0), _time(offset, last), list(ids), seek)], frames
    if single_ending:
        cuts.append(len(ids))
    else:
        cuts[-1] += 1  # the last segment keeps its pair's second timestamp
    out, previous = [], 0
    for i, cut in enumerate(cuts):
        piece = list(ids[previous:cut])
        end = piece[-1] if i < len(cuts) - 1 or single_ending else piece[-2]
        out.append(SeekSegment(_time(offset, piece[0] - begin), _time(offset, end - begin),
                               piece, seek))
        previous = cut
    if single_ending:
        return out, frames
    return out, (ids[previous - 2] - begin) * FRAMES_PER_STAMP


def _time(offset: float, steps: int) -> float:
    """HF's float64 `time_offset + steps * time_precision`, to the 10 ms a frame is."""
    return round(offset + steps * TIME_PRECISION, 2)
