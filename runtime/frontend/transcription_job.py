"""One transcription's audio as Whisper requests, and its answer from their results; shared by
`/v1/audio/*` (`audio_serving.py`) and `Seq2SeqEngine.transcribe`.

The audio is decoded here, above the TokenizerManager, under the deployment's whole-audio
limits (`--max-audio-bytes`, `--max-audio-seconds`), and cut into HF's pipeline's windows
(`audio_chunks.py`: 30 s every 20 s). Audio of at most 30 s is one window and one request, as
before; longer audio is one batch of requests, one per window, all with the same decoder
prompt (language, task, previous text), sent together so that the scheduler batches them
with each other and with other callers' requests, and their text tokens are merged as HF's
pipeline merges them.

With timestamps (`timed`) the answer has segments: for one window as HF's
`generate(return_timestamps=True)` gives them, by default decoding the window again from its
last complete segment while a decode ends mid-segment (`redecoding`, `whisper_seek.py`: HF's
sequential loop, requests with `audio_seek`), or decoded once
(`force_unique_generate_call=True`: the segments cut as HF's tokenizer cuts them,
`timestamp_segments.py`); for long audio every window is decoded with timestamps so (HF's
pipeline calls that generate for each window) and the windows are merged with them as HF's
pipeline merges them with `return_timestamps=True` (`timed_merge.py`: its text and its
`chunks`).

With a `chunking_strategy` (`chunking_strategy.py`) the windows are cut at silences instead:
Silero VAD's speech regions (`speech_regions.py`) joined into windows of at most 30 s
(`audio_chunks.speech_windows`), the silence between windows left out. They share nothing, so
their texts are joined, not merged (`joined`), and each window's segments are its own moved
on by the window's start; a clip without speech has no windows, no requests and no text.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from seq2serve.encoders.audio_loader import AudioLimits, read_audio
from seq2serve.encoders.image_loader import MediaPolicy
from seq2serve.runtime.frontend.audio_chunks import (
    SAMPLING_RATE,
    Window,
    chunking,
    merge_tokens,
    speech_windows,
    text_tokens,
    windows,
)
from seq2serve.runtime.frontend.chunking_strategy import VadOptions
from seq2serve.runtime.frontend.generate_request import GenerateReqInput, split_rows
from seq2serve.runtime.frontend.timed_merge import TimedWindow, merge_timed
from seq2serve.runtime.frontend.timestamp_segments import segments, text_ids
from seq2serve.runtime.frontend.transcription import WhisperPrompt
from seq2serve.runtime.frontend.whisper_seek import WindowSeek


@dataclass(frozen=True)
class TranscriptionJob:
    windows: list[np.ndarray]  # each window's 16 kHz samples, in order (one: <= 30 s)
    num_samples: int = 0  # the whole audio's
    spans: tuple[Window, ...] = ()  # where each window lies (its samples and strides)
    joined: bool = False  # cut at silences (chunking_strategy): texts joined, not merged

    @classmethod
    def of(cls, audio: Any, limits: AudioLimits, policy: MediaPolicy,
           chunk_length_s: float = 30.0, stride_length_s: float | None = None,
           vad: VadOptions | None = None) -> TranscriptionJob:
        """The caller's audio (file bytes, a path, or 16 kHz samples) decoded and cut (by
        default 30 s windows with 5 s strides; HF's pipeline's `chunk_length_s` and
        `stride_length_s` otherwise; with `vad`, windows of at most 30 s cut at the
        silences Silero VAD finds); a ValueError naming the problem (undecodable, empty,
        over a limit, a chunking that does not fit a window)."""
        chunk = chunking(chunk_length_s, stride_length_s)
        samples = read_audio(audio, limits, policy)
        if vad is not None:
            from seq2serve.runtime.frontend.speech_regions import speech_regions

            spans = tuple(speech_windows(speech_regions(samples, vad)))
        else:
            spans = tuple(windows(samples.shape[0], *chunk))
        return cls([samples[w.start:w.end] for w in spans], samples.shape[0], spans,
                   joined=vad is not None)

    @property
    def is_long(self) -> bool:
        return len(self.windows) > 1

    @property
    def duration(self) -> float:
        """The audio's length in seconds."""
        return self.num_samples / SAMPLING_RATE

    @property
    def detection_audio(self) -> np.ndarray:
        """The samples a missing language is detected on: the first window's (faster-whisper
        detects on the first 30 s too; HF's pipeline detects each window's). Its encoder
        output is the first window's request's: the encoder cache serves both. None when
        no window has speech (nothing to detect, nothing to decode)."""
        return self.windows[0] if self.windows else None

    def requests(self, decoder_ids: list[int], sampling_params: dict[str, Any],
                 max_rows: int, stream: bool = False,
                 user: str | None = None) -> list[GenerateReqInput]:
        """The windows as generate requests: one request of one audio for a short clip, else
        a batch of the windows (several batches only past `max_rows`, max_batch_inputs);
        none without windows (no speech)."""
        if not self.windows:
            return []
        audio = self.windows if self.is_long else self.windows[0]
        obj = GenerateReqInput(audio_data=audio, decoder_input_ids=list(decoder_ids),
                               sampling_params=dict(sampling_params), stream=stream, user=user)
        return split_rows(obj, max_rows)

    def answer(self, results: list[dict[str, Any]], tokenizer,
               whisper: WhisperPrompt) -> dict[str, Any]:
        """The transcription ({"text", "output_ids", "meta_info"}) from the windows' results
        in order: a short clip's own result; a long one's merged text tokens, decoded (as
        the pipeline decodes them), with the windows' token counts summed. Windows cut at
        silences (`joined`): their text tokens end to end, and their texts, each decoded
        alone, joined ("" without windows)."""
        if not self.is_long and not self.joined:
            [result] = results
            return result
        if len(results) != len(self.windows):
            raise RuntimeError(f"{len(results)} results for {len(self.windows)} windows")
        specials = set(tokenizer.all_special_ids)
        pieces = [text_tokens(r["output_ids"], specials, whisper.no_timestamps_token_id + 1)
                  for r in results]
        if self.joined:
            ids = [t for p in pieces for t in p]
            text = "".join(tokenizer.decode(p) for p in pieces)
        else:
            ids = merge_tokens(pieces)
            text = tokenizer.decode(ids)
        return {"text": text, "output_ids": ids, "meta_info": self._usage(results)}

    def _usage(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        """The windows' meta_info as one: token counts summed, the finish reason."""
        metas = [r["meta_info"] for r in results]
        reasons = [m["finish_reason"] for m in metas]
        meta = {"prompt_tokens": sum(m["prompt_tokens"] for m in metas),
                "completion_tokens": sum(m["completion_tokens"] for m in metas),
                "cached_tokens": sum(m.get("cached_tokens") or 0 for m in metas),
                # a window cut short by max_tokens cuts the text: say so
                "finish_reason": next((r for r in reasons if r and r.get("type") == "length"),
                                      reasons[-1] if reasons else None),
                "windows": len(self.windows)}
        if any("decodes" in m for m in metas):
            meta["decodes"] = sum(m.get("decodes", 1) for m in metas)
        return meta

    def timed(self, results: list[dict[str, Any]], tokenizer,
              whisper: WhisperPrompt) -> dict[str, Any]:
        """The answer of a request decoded with timestamps: its text without them, and its
        segments (`timestamp_segments.Segment`'s fields as a dict: start and end in seconds
        from the audio's start, text, tokens) and the audio's duration in seconds. Long
        audio's are `long_timed`'s; windows cut at silences have each window's segments
        moved on by its start (`seek`: the window's first frame plus the decode's)."""
        if self.joined:
            begin = whisper.no_timestamps_token_id + 1
            segs = [s for r, w in zip(results, self.spans, strict=True)
                    for s in _segments(r, begin, tokenizer, w.start)]
            return {**self.answer(results, tokenizer, whisper), "duration": self.duration,
                    "segments": segs}
        if self.is_long:
            return self.long_timed(results, tokenizer, whisper)
        [result] = results
        begin = whisper.no_timestamps_token_id + 1
        segs = _segments(result, begin, tokenizer)
        return {**result, "text": tokenizer.decode(text_ids(result["output_ids"], begin),
                                                   skip_special_tokens=True),
                "duration": self.duration, "segments": segs}

    def redecoding(self, results: list[dict[str, Any]], whisper: WhisperPrompt,
                   eos: int) -> Redecoding:
        """HF's re-decoding of each window (decoded with timestamps: `results`) from its last
        complete segment, until a decode ends the window (HF's pipeline calls generate so
        for each of long audio's windows)."""
        return Redecoding(self, results, whisper.no_timestamps_token_id + 1, eos)


    def long_timed(self, results: list[dict[str, Any]], tokenizer,
                   whisper: WhisperPrompt) -> dict[str, Any]:
        """Long audio's windows decoded with timestamps, merged as HF's pipeline merges them
        with `return_timestamps=True`: its text, and its chunks as segments (start, end,
        text, tokens: the segment's merged text tokens, no timestamps). Where HF's chunk
        has no time (None) the segment takes one: no closing timestamp, the audio's end; no
        opening one (text after a closed segment whose window's timestamps were set aside),
        the end of the segment before it (0 for the first); "pipeline_times" keeps HF's
        (start, end) pairs as they are. `output_ids` are the merged segments' tokens."""
        answer = self.answer(results, tokenizer, whisper)  # the usage and finish reason
        begin = whisper.no_timestamps_token_id + 1
        timed = [TimedWindow(r["output_ids"], (w.end - w.start) / SAMPLING_RATE,
                             w.stride_left / SAMPLING_RATE, w.stride_right / SAMPLING_RATE)
                 for r, w in zip(results, self.spans, strict=True)]
        text, chunks = merge_timed(timed, begin, set(tokenizer.all_special_ids),
                                   tokenizer.decode)
        for r in results:
            r.pop("seek_segments", None)  # the merge has the pipeline's segments
        segs, previous_end = [], 0.0
        for c in chunks:
            start = previous_end if c.start is None else c.start
            previous_end = max(start, round(self.duration, 2)) if c.end is None else c.end
            segs.append({"start": start, "end": previous_end, "text": c.text,
                         "tokens": c.tokens})
        return {**answer, "text": text, "output_ids": [t for c in chunks for t in c.tokens],
                "duration": self.duration, "segments": segs,
                "pipeline_times": [(c.start, c.end) for c in chunks]}


def _segments(result: dict[str, Any], begin: int, tokenizer,
              start: int = 0) -> list[dict[str, Any]]:
    """One window's segments (its `seek_segments` popped: HF's generate's, else the
    tokenizer's of a single decode); a window from sample `start` on has its times moved on
    by it (to the ms) and its `seek` by its first 10 ms frame."""
    seeked = result.pop("seek_segments", None)
    if seeked is None:  # decoded once: the tokenizer's segments
        segs = [asdict(s) for s in segments(result["output_ids"], begin, tokenizer.decode)]
    else:  # HF's generate's segments
        segs = [{"start": s.start, "end": s.end,
                 "text": tokenizer.decode(text_ids(s.tokens, begin)),
                 "tokens": s.tokens, "seek": s.seek} for s in seeked]
    if not start:
        return segs
    offset, frames = start / SAMPLING_RATE, start // (SAMPLING_RATE // 100)
    return [{**s, "start": round(s["start"] + offset, 3), "end": round(s["end"] + offset, 3),
             "seek": frames + s.get("seek", 0)} for s in segs]


class Redecoding:
    """The windows decoded as HF's `generate(return_timestamps=True)` decodes a window: the
    first decodes' results in, then `requests` (the windows not done, again from their
    `seek`, the same prompt and sampling: one batch) and `add` (their results) until
    `requests` is empty; `results` has each window's result with HF's `sequences` as
    `output_ids` (what `long_timed` merges), the decodes' token counts summed, and the
    segments (`seek_segments`, which `timed` reads for a short clip)."""

    def __init__(self, job: TranscriptionJob, results: list[dict[str, Any]], begin: int,
                 eos: int) -> None:
        self.job = job
        self.seeks = [WindowSeek(begin, eos) for _ in job.windows]
        self.metas: list[list[dict[str, Any]]] = [[] for _ in job.windows]
        self.pending = list(range(len(job.windows)))  # the windows of the last requests
        self.add(results)

    def requests(self, decoder_ids: list[int], sampling_params: dict[str, Any],
                 max_rows: int, user: str | None = None) -> list[GenerateReqInput]:
        """The windows not yet done, each from its `seek`: a batch ([] when all are done)."""
        self.pending = [i for i, w in enumerate(self.seeks) if not w.done]
        if not self.pending:
            return []
        obj = GenerateReqInput(audio_data=[self.job.windows[i] for i in self.pending],
                               audio_seek=[self.seeks[i].seek for i in self.pending],
                               decoder_input_ids=list(decoder_ids),
                               sampling_params=dict(sampling_params), user=user)
        return split_rows(obj, max_rows)

    def add(self, results: list[dict[str, Any]]) -> None:
        if len(results) != len(self.pending):
            raise RuntimeError(f"{len(results)} results for {len(self.pending)} windows")
        for i, r in zip(self.pending, results):
            self.seeks[i].add(r["output_ids"])
            self.metas[i].append(r["meta_info"])

    def results(self) -> list[dict[str, Any]]:
        out = []
        for seek, metas in zip(self.seeks, self.metas):
            meta = {**metas[-1], "decodes": len(metas)}
            for k in ("prompt_tokens", "completion_tokens", "cached_tokens"):
                meta[k] = sum(m.get(k) or 0 for m in metas)
            out.append({"output_ids": seek.sequence, "meta_info": meta,
                        "seek_segments": seek.segments})
        return out
