"""A window's generated tokens with timestamps as segments (start, end, text, tokens), as HF's
`WhisperTokenizer.decode(..., output_offsets=True)` cuts them (`_compute_offsets`), for one
generate call: a segment runs from a timestamp to the next pair of timestamps (or to the last
timestamp), its text is its tokens less the timestamps, and a timestamp token is 0.02 s after
the one before it (`<|0.00|>` is `TimestampTokens.begin`). Tokens before the first timestamp,
or after the last, belong to no segment. Pure: no model, the tokenizer passed in to decode."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

TIME_PRECISION = 0.02  # seconds per timestamp token


@dataclass(frozen=True)
class Segment:
    start: float  # seconds
    end: float
    text: str
    tokens: list[int]  # its tokens, the timestamps at its ends included (OpenAI's segments')


def segments(ids: Sequence[int], begin: int, decode: Callable[[list[int]], str],
             offset: float = 0.0) -> list[Segment]:
    """The segments of `ids` (a window's generated tokens; ids from `begin` on are
    timestamps); `decode` turns text tokens into text; `offset` (seconds) is added to every
    time. No segment without a pair of timestamps or two timestamps in all."""
    stamp = [t >= begin for t in ids]
    cuts = [i + 1 for i in range(len(ids) - 1) if stamp[i] and stamp[i + 1]]
    where = [i for i, s in enumerate(stamp) if s]
    if not cuts and len(where) <= 1:
        return []
    if where[-1] + 1 not in cuts:  # the last timestamp closes the last segment
        cuts.append(where[-1] + 1)
    out, start = [], where[0]
    for cut in cuts:
        piece = list(ids[start:cut])
        if len(piece) > 1:
            text = decode([t for t in piece if t < begin])
            out.append(Segment(offset + _seconds(piece[0] - begin),
                               offset + _seconds(piece[-1] - begin), text, piece))
        start = cut
    return out


def text_ids(ids: Sequence[int], begin: int) -> list[int]:
    """`ids` less their timestamps (what the text is decoded from)."""
    return [t for t in ids if t < begin]


def _seconds(index: int) -> float:
    return round(index * TIME_PRECISION, 2)
