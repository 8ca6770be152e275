"""Whisper's timestamp tokens as a checkpoint's generation_config.json describes them: what the
timestamp rules (`runtime/executor/timestamp_rules.py`, HF's `WhisperTimeStampLogitsProcessor`)
need of the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TimestampTokens:
    no_timestamps: int  # `<|notimestamps|>`: never generated while timestamps are on
    eos: int  # the end of text: allowed where only a timestamp or the end may come
    # the largest first timestamp, as an index from `<|0.00|>` (None: any)
    max_initial_index: int | None = None

    @property
    def begin(self) -> int:
        """`<|0.00|>`: every id from here on is a timestamp (0.02 s apart)."""
        return self.no_timestamps + 1

    @classmethod
    def from_generation_config(cls, gen: dict[str, Any], vocab_size: int,
                               fallback_eos: int | None) -> TimestampTokens | None:
        """From generation_config.json's `no_timestamps_token_id`, `eos_token_id` (else the
        model's) and `max_initial_timestamp_index`, as HF's processor reads them; None for a
        model without timestamp tokens (no such key, or no id after it in the vocabulary)."""
        no_ts = gen.get("no_timestamps_token_id")
        if not isinstance(no_ts, int) or no_ts + 1 >= vocab_size:
            return None
        eos = gen.get("eos_token_id", gen.get("bos_token_id", fallback_eos))
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        if eos is None:
            return None
        cap = gen.get("max_initial_timestamp_index")
        return cls(no_timestamps=no_ts, eos=int(eos),
                   max_initial_index=None if cap is None else int(cap))
