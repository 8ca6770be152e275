"""OpenAI's `chunking_strategy` for `/v1/audio/transcriptions`: long audio cut at speech
boundaries found by a voice-activity detector (`speech_regions.py`) instead of HF's fixed
windows. Pure: the field's value in, `VadOptions` out.

OpenAI takes `"auto"` or a `server_vad` object `{"type": "server_vad", "threshold",
"prefix_padding_ms", "silence_duration_ms"}` (each optional; the Realtime API's server_vad
defaults: 0.5, 300 ms, 500 ms). Its `openai` Python client sends the object as bracketed form
fields (`chunking_strategy[type]=server_vad`, `chunking_strategy[threshold]=0.4`, ...);
curl users send it as one JSON field. Both are read. `"auto"` is server_vad with the
defaults (OpenAI's auto also normalizes loudness first; Silero VAD is trained across
loudness, and this server does not).

The mapping onto Silero VAD's `get_speech_timestamps`: `threshold` -> `threshold` (a 32 ms
frame is speech from this probability on), `prefix_padding_ms` -> `speech_pad_ms` (Silero pads
both ends of each region by it), `silence_duration_ms` -> `min_silence_duration_ms` (the
silence that ends a region).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FIELD = "chunking_strategy"


@dataclass(frozen=True)
class VadOptions:
    """Silero VAD's settings for one transcription, in OpenAI's server_vad terms."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"{FIELD} threshold must be in (0, 1), got {self.threshold!r}")
        for name in ("prefix_padding_ms", "silence_duration_ms"):
            value = getattr(self, name)
            if not 0 <= value <= 30_000:
                raise ValueError(f"{FIELD} {name} must be in [0, 30000] ms, got {value!r}")

    def silero_kwargs(self) -> dict[str, Any]:
        """These options as `silero_vad.get_speech_timestamps`' keyword arguments."""
        return {"threshold": self.threshold, "speech_pad_ms": self.prefix_padding_ms,
                "min_silence_duration_ms": self.silence_duration_ms}


def vad_options(value: Any) -> VadOptions | None:
    """The options a `chunking_strategy` asks for: None for None (HF's fixed windows), else
    "auto", a server_vad mapping, or that mapping as JSON text; a ValueError naming the
    field otherwise."""
    if value is None or isinstance(value, VadOptions):
        return value
    if isinstance(value, str):
        if value == "auto":
            return VadOptions()
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(f'{FIELD} must be "auto" or a server_vad object (JSON), got '
                             f"{value!r}") from None
    if not isinstance(value, Mapping):
        raise ValueError(f'{FIELD} must be "auto" or a server_vad object, got {value!r}')
    if value.get("type") != "server_vad":
        raise ValueError(f'{FIELD} type must be "server_vad", got {value.get("type")!r}')
    unknown = sorted(set(value) - {"type", "threshold", "prefix_padding_ms",
                                   "silence_duration_ms"})
    if unknown:
        raise ValueError(f"{FIELD} has unknown keys: {', '.join(unknown)}")
    kwargs = {}
    for name, kind in (("threshold", float), ("prefix_padding_ms", int),
                       ("silence_duration_ms", int)):
        if value.get(name) is not None:
            kwargs[name] = _number(name, value[name], kind)
    return VadOptions(**kwargs)


def form_value(fields: Mapping[str, str]) -> Any:
    """The field from a multipart form's text fields: `chunking_strategy` itself, or the
    `chunking_strategy[key]` fields the `openai` client sends an object as (then a dict of
    them); None without either."""
    prefix = f"{FIELD}["
    nested = {k[len(prefix):-1]: v for k, v in fields.items()
              if k.startswith(prefix) and k.endswith("]")}
    whole = fields.get(FIELD)
    if whole not in (None, "") and nested:
        raise ValueError(f"{FIELD} is given twice: as a field and as {FIELD}[...] fields")
    return nested or (whole if whole not in (None, "") else None)


def _number(name: str, value: Any, kind: type) -> float | int:
    if isinstance(value, bool):
        raise ValueError(f"{FIELD} {name} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{FIELD} {name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{FIELD} {name} must be a finite number, got {value!r}")
    if kind is int:
        if number != int(number):
            raise ValueError(f"{FIELD} {name} must be a whole number of ms, got {value!r}")
        return int(number)
    return number
