"""One transcription's audio as Whisper requests, and its answer from their results; shared by
`/v1/audio/*` (`audio_serving.py`) and `Seq2SeqEngine.transcribe`.

The audio is decoded here, above the TokenizerManager, under the deployment's whole-audio
limits (`--max-audio-bytes`, `--max-audio-seconds`), and cut into HF's pipeline's windows
(`audio_chunks.py`: 30 s every 20 s). Audio of at most 30 s is one window and one request, as
before; longer audio is one batch of requests, one per window, all with the same decoder
prompt (language, task, previous text), sent together so that the scheduler batches them
with each other and with other callers' requests, and their text tokens are merged as HF's
pipeline merges them.

With timestamps (`timed`) the answer has segments, as HF's `generate(return_timestamps=True)`
gives them for one window decoded once (`force_unique_generate_call=True`:
`timestamp_segments.py`). Only audio of one window gets them: long audio's windows merged
with their timestamps (the pipeline's `_decode_asr` with `return_timestamps=True`) are not
built, and `check_timestamps` refuses it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from seq2serve.encoders.audio_loader import AudioLimits, read_audio
from seq2serve.encoders.image_loader import MediaPolicy
from seq2serve.runtime.frontend.audio_chunks import (
    SAMPLING_RATE,
    chunking,
    merge_tokens,
    text_tokens,
    windows,
)
from seq2serve.runtime.frontend.generate_request import GenerateReqInput, split_rows
from seq2serve.runtime.frontend.timestamp_segments import segments, text_ids
from seq2serve.runtime.frontend.transcription import WhisperPrompt


@dataclass(frozen=True)
class TranscriptionJob:
    windows: list[np.ndarray]  # each window's 16 kHz samples, in order (one: <= 30 s)
    num_samples: int = 0  # the whole audio's

    @classmethod
    def of(cls, audio: Any, limits: AudioLimits, policy: MediaPolicy,
           chunk_length_s: float = 30.0,
           stride_length_s: float | None = None) -> TranscriptionJob:
        """The caller's audio (file bytes, a path, or 16 kHz samples) decoded and cut (by
        default 30 s windows with 5 s strides; HF's pipeline's `chunk_length_s` and
        `stride_length_s` otherwise); a ValueError naming the problem (undecodable, empty,
        over a limit, a chunking that does not fit a window)."""
        chunk = chunking(chunk_length_s, stride_length_s)
        samples = read_audio(audio, limits, policy)
        return cls([samples[w.start:w.end] for w in windows(samples.shape[0], *chunk)],
                   samples.shape[0])

    @property
    def is_long(self) -> bool:
        return len(self.windows) > 1

    @property
    def duration(self) -> float:
        """The audio's length in seconds."""
        return self.num_samples / SAMPLING_RATE

    def check_timestamps(self) -> None:
        """A ValueError for audio past one window: its timestamps are not built."""
        if self.is_long:
            raise ValueError(f"timestamps are built for audio of at most one 30 s window; "
                             f"this audio is cut into {len(self.windows)} windows (long "
                             f"audio's timestamps are not built yet: ask for text or json)")

    @property
    def detection_audio(self) -> np.ndarray:
        """The samples a missing language is detected on: the first window's (faster-whisper
        detects on the first 30 s too; HF's pipeline detects each window's). Its encoder
        output is the first window's request's: the encoder cache serves both."""
        return self.windows[0]

    def requests(self, decoder_ids: list[int], sampling_params: dict[str, Any],
                 max_rows: int, stream: bool = False,
                 user: str | None = None) -> list[GenerateReqInput]:
        """The windows as generate requests: one request of one audio for a short clip, else
        a batch of the windows (several batches only past `max_rows`, max_batch_inputs)."""
        audio = self.windows if self.is_long else self.windows[0]
        obj = GenerateReqInput(audio_data=audio, decoder_input_ids=list(decoder_ids),
                               sampling_params=dict(sampling_params), stream=stream, user=user)
        return split_rows(obj, max_rows)

    def answer(self, results: list[dict[str, Any]], tokenizer,
               whisper: WhisperPrompt) -> dict[str, Any]:
        """The transcription ({"text", "output_ids", "meta_info"}) from the windows' results
        in order: a short clip's own result; a long one's merged text tokens, decoded (as
        the pipeline decodes them), with the windows' token counts summed."""
        if not self.is_long:
            [result] = results
            return result
        if len(results) != len(self.windows):
            raise RuntimeError(f"{len(results)} results for {len(self.windows)} windows")
        specials = set(tokenizer.all_special_ids)
        ids = merge_tokens([text_tokens(r["output_ids"], specials,
                                        whisper.no_timestamps_token_id + 1) for r in results])
        metas = [r["meta_info"] for r in results]
        reasons = [m["finish_reason"] for m in metas]
        meta = {"prompt_tokens": sum(m["prompt_tokens"] for m in metas),
                "completion_tokens": sum(m["completion_tokens"] for m in metas),
                "cached_tokens": sum(m.get("cached_tokens") or 0 for m in metas),
                # a window cut short by max_tokens cuts the text: say so
                "finish_reason": next((r for r in reasons if r and r.get("type") == "length"),
                                      reasons[-1]),
                "windows": len(self.windows)}
        return {"text": tokenizer.decode(ids), "output_ids": ids, "meta_info": meta}

    def timed(self, results: list[dict[str, Any]], tokenizer,
              whisper: WhisperPrompt) -> dict[str, Any]:
        """The answer of a request decoded with timestamps: its text without them, and its
        segments (`timestamp_segments.Segment`'s fields as a dict: start and end in seconds
        from the audio's start, text, tokens) and the audio's duration in seconds."""
        self.check_timestamps()
        [result] = results
        begin = whisper.no_timestamps_token_id + 1
        ids = result["output_ids"]
        return {**result, "text": tokenizer.decode(text_ids(ids, begin),
                                                   skip_special_tokens=True),
                "duration": self.duration,
                "segments": [asdict(s) for s in segments(ids, begin, tokenizer.decode)]}

