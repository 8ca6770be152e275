"""Long audio's windows decoded with timestamps, merged into one text and its segments as HF's
ASR pipeline merges them with `return_timestamps=True` (`WhisperTokenizer._decode_asr`, its
`chunks`). Pure: token ids, the windows' strides in seconds, and the tokenizer's decode.

Each window's timestamps count from its own start; the merge moves them onto the audio's
clock (a window's offset: the steps before it, less its left stride) and reads the windows in
order as one stream. A segment opens at a timestamp and closes at the next one with a
different time; its text is the text tokens read since it opened, window by window, merged
over the stride overlaps as the text-only path merges them (`audio_chunks.merge_tokens`; an
empty piece is only ever the last one, where skipping it or not merges the same). The
overlaps' timestamps are set aside as the pipeline sets them aside: in a window with a right
stride, its last timestamp and the run of timestamps in that stride just before it are
skipped, each skipping the timestamp after it too (they come in pairs); in a window with a
left stride, timestamps inside that stride are skipped while text is pending from the
windows before. A segment still open at the end (no closing timestamp) ends at None (HF's).

A window decoded more than once (HF's default: again from its last complete segment,
`whisper_seek.py`) is its decodes' tokens end to end, each decode's timestamps counting from
its own seek; HF's long-form bookkeeping reads them: a timestamp smaller than the one before
starts a later decode, whose times are moved on by the segment end before it (after a pair),
or by a whole 30 s (after a single timestamp). Left out of HF's state machine: its word
timestamps and language changes (not served).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from seq2serve.runtime.frontend.audio_chunks import merge_tokens
from seq2serve.runtime.frontend.timestamp_segments import TIME_PRECISION

SEGMENT_STEPS = 1500  # a window's timestamp steps (HF's `segment_size`)


@dataclass(frozen=True)
class TimedWindow:
    """One window's generated ids and its place: its length and strides in seconds."""

    ids: Sequence[int]
    length: float
    stride_left: float = 0.0
    stride_right: float = 0.0


@dataclass
class Chunk:
    """One merged segment: times in seconds on the audio's clock (`end` None when no
    timestamp closed it), its text and its merged text tokens."""

    start: float | None
    end: float | None
    text: str
    tokens: list[int] = field(default_factory=list)


def merge_timed(windows: Sequence[TimedWindow], begin: int, special_ids: Collection[int],
                decode: Callable[[list[int]], str],
                precision: float = TIME_PRECISION) -> tuple[str, list[Chunk]]:
    """(text, chunks) of the windows in order (ids from `begin` on are timestamps; ids in
    `special_ids` are skipped), as HF's pipeline returns its text and `chunks`."""
    state = _State(decode)
    offset = 0.0
    for w in windows:
        ids = [t for t in w.ids if t not in special_ids]
        offset -= w.stride_left
        first = begin + w.stride_left / precision if w.stride_left else begin
        last = _last_kept(ids, begin, precision, w.length - w.stride_right) \
            if w.stride_right else None
        current: list[int] = []
        latest = previous = moved = 0.0  # HF's cur_max_timestamp, penultimate, prev_segments_len
        for i, token in enumerate(ids):
            if token < begin:
                current.append(token)
                continue
            stamp = float((token - begin) * precision)
            if stamp < latest:  # a later decode of the window: on from its seek
                if i >= 2 and not (ids[i - 1] >= begin and ids[i - 2] >= begin):
                    moved += precision * SEGMENT_STEPS
                else:
                    latest = previous
                    moved += previous
            previous, latest = latest, stamp
            time = round((token - begin) * precision + offset + moved, 2)
            if last is not None and token >= last:
                state.skip = True  # in the right stride: the next window says it
            elif state.skip or (state.pending and token < first):
                state.skip = False
            elif state.start is None:
                state.start = time
            elif time != state.start:  # an equal time reopens rather than closes
                state.pending.append(current)
                state.close(time)
                current = []
        offset += w.length - w.stride_right
        if current:
            state.pending.append(current)
        elif not any(state.pending):
            state.start, state.pending = None, []
    if state.pending:
        state.close(None)
    return "".join(c.text for c in state.chunks), state.chunks


class _State:
    """The merge's running state across windows: the open segment's start and the text
    pieces read since (one per window), whether the next timestamp is skipped, the chunks
    closed so far."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.start: float | None = None
        self.pending: list[list[int]] = []
        self.skip = False
        self.chunks: list[Chunk] = []

    def close(self, end: float | None) -> None:
        tokens = merge_tokens(self.pending)
        self.chunks.append(Chunk(self.start, end, self.decode(tokens), tokens))
        self.start, self.pending = None, []


def _last_kept(ids: list[int], begin: int, precision: float, right_start: float) -> int | None:
    """The smallest of a window's timestamps skipped for its right stride (those from it
    on are skipped): its last timestamp (always), or the earliest of the run of timestamps at
    its end that lie in the stride (from `right_start` seconds on)."""
    last = None
    for token in reversed(ids):
        if token >= begin:
            if last is not None and (token - begin) * precision < right_start:
                break
            last = token
    return last
