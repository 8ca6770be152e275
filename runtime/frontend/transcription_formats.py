"""A transcription's answer in the `response_format` OpenAI's `/v1/audio/*` endpoints take:
`json`, `text`, and, from a result decoded with timestamps (`TranscriptionJob.timed`),
`verbose_json`, `srt` and `vtt`.

`verbose_json` is OpenAI's shape: task, language, duration, text, segments and (as `json`)
usage. Each segment has id, seek (the log-mel frame its decode began at: 0 unless the
window was decoded again from a segment's end), start, end, text, tokens (one window's: with the
timestamps at its ends; long audio's: its merged text tokens), temperature and
compression_ratio (OpenAI's: the text's UTF-8 bytes over their zlib-compressed bytes);
`avg_logprob` and `no_speech_prob` are left out (not computed: beam search returns no
log-probs, and no-speech detection is not built).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from seq2serve.runtime.frontend.subtitles import srt, vtt

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
TIMESTAMP_FORMATS = ("srt", "vtt", "verbose_json")  # decoded with the timestamp rules


def formatted(result: dict[str, Any], fmt: str, *, task: str, language: str | None,
              duration: float, temperature: float,
              detected: bool = False) -> tuple[str, str]:
    """(body, media type) of `result` in `fmt` (one of FORMATS)."""
    if fmt == "text":
        return result["text"], "text/plain"
    if fmt == "srt":
        return srt(result["segments"]), "application/x-subrip"
    if fmt == "vtt":
        return vtt(result["segments"]), "text/vtt"
    meta = result["meta_info"]
    usage = {"type": "tokens", "input_tokens": meta["prompt_tokens"],
             "output_tokens": meta["completion_tokens"],
             "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"]}
    if fmt == "json":
        body = {"text": result["text"], "usage": usage}
        if detected:
            body["language"] = language
    else:
        body = {"task": "translate" if task == "translate" else "transcribe",
                "language": language, "duration": round(duration, 3), "text": result["text"],
                "segments": [_segment(i, s, temperature)
                             for i, s in enumerate(result["segments"])],
                "usage": usage}
    return json.dumps(body, ensure_ascii=False), "application/json"


def _segment(i: int, s: dict[str, Any], temperature: float) -> dict[str, Any]:
    return {"id": i, "seek": s.get("seek", 0), "start": s["start"], "end": s["end"],
            "text": s["text"], "tokens": s["tokens"], "temperature": temperature,
            "compression_ratio": compression_ratio(s["text"])}


def compression_ratio(text: str) -> float:
    """OpenAI whisper's: UTF-8 bytes over zlib-compressed bytes (high: repetitive text)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0
