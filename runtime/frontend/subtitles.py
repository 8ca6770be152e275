"""Segments as subtitle files: SubRip (`srt`) and WebVTT (`vtt`), as OpenAI's
`response_format` answers them (whisper's own writers: the text stripped, `-->` inside it
written `->`, hours always written)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Segments = Sequence[Mapping[str, Any]]  # each with "start", "end" (seconds) and "text"


def srt(segments: Segments) -> str:
    """1-numbered cues, `HH:MM:SS,mmm --> HH:MM:SS,mmm`, a blank line after each."""
    return "".join(f"{i}\n{_span(s, ',')}\n{_cue(s['text'])}\n\n"
                   for i, s in enumerate(segments, 1))


def vtt(segments: Segments) -> str:
    """`WEBVTT`, then cues `HH:MM:SS.mmm --> HH:MM:SS.mmm`, a blank line after each."""
    return "WEBVTT\n\n" + "".join(f"{_span(s, '.')}\n{_cue(s['text'])}\n\n"
                                    for s in segments)


def _span(segment: Mapping[str, Any], decimal: str) -> str:
    return f"{_clock(segment['start'], decimal)} --> {_clock(segment['end'], decimal)}"


def _clock(seconds: float, decimal: str) -> str:
    ms = round(seconds * 1000)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{ms:03d}"


def _cue(text: str) -> str:
    return text.strip().replace("-->", "->")
