"""OpenAI's `POST /v1/audio/transcriptions` and `/v1/audio/translations` for speech models
(Whisper): a multipart form with the audio `file`, answered with its text.

Form fields: `file` (required), `model`, `language` (a code such as "de" or an English name;
without one a multilingual model's is detected first, as HF's generate does, and the json
answer names it), `response_format` (json, text, or with timestamps verbose_json, srt, vtt:
`transcription_formats.py`), `timestamp_granularities[]` (segment; word is refused, not
built), `temperature` (0 by default: greedy),
`stream` (OpenAI's `transcript.text.delta` and `transcript.text.done` events), and the
extensions `num_beams` / `beam_size` (beam search), `max_tokens` (default: what the
decoder's positions leave after the prompt) and `force_unique_generate_call` (below).
`/translations` is Whisper's translate task (to English). `prompt` is text before the
audio's, as HF's `prompt_ids` (`<|startofprev|>` and its tokens before the forced ones).
OpenAI fields this server does not implement yet (`include[]`, word timestamps) are refused
naming the field; other fields are ignored, as OpenAI-compatible
servers do. Timestamps are decoded with Whisper's timestamp rules as HF's
`generate(return_timestamps=True)` decodes a window: by default again from its last complete
segment while a decode ends mid-segment (HF's default, `whisper_seek.py`), once with the
extension `force_unique_generate_call=true`; longer audio's windows are each decoded so and
merged as HF's pipeline merges them with `return_timestamps=True` (`timed_merge.py`); a
stream of them is a 400.

Audio longer than 30 s (up to `--max-audio-seconds`) is cut into HF's pipeline's 30 s windows
with 5 s strides (the extension fields `chunk_length_s`, at most 30, and `stride_length_s`
choose others, as the pipeline's arguments of those names), decoded as one batch with the
same prompt (a missing language detected on the first window) and merged as the pipeline
merges them (`transcription_job.py`). Its stream is one delta, the merged text, once every
window is done (a window's text is final only when the next one is merged in, and the
windows decode side by side, ending about together); `max_tokens` is each window's.
OpenAI's `chunking_strategy` ("auto", or a server_vad object: as JSON text or as the
`openai` client's `chunking_strategy[key]` fields; `chunking_strategy.py`) cuts the audio
at silences instead (Silero VAD, `speech_regions.py`): windows of at most 30 s, their texts
joined; audio without speech is answered with no text and nothing decoded.
"""

from __future__ import annotations

import asyncio

from fastapi import Request
from fastapi.responses import Response
from starlette.datastructures import UploadFile

from seq2serve.runtime.frontend.audio_chunks import chunking
from seq2serve.runtime.frontend.chunking_strategy import (
    FIELD,
    VadOptions,
    form_value,
    vad_options,
)
from seq2serve.runtime.frontend.generate_request import GenerateReqInput
from seq2serve.runtime.frontend.openai_serving import (
    OpenAIServing,
    RequestError,
    _sse,
    sse_response,
)
from seq2serve.runtime.frontend.transcription import WhisperPrompt
from seq2serve.runtime.frontend.transcription_formats import (
    FORMATS,
    TIMESTAMP_FORMATS,
    formatted,
)
from seq2serve.runtime.frontend.transcription_job import TranscriptionJob
from seq2serve.runtime.frontend.translation import with_beams
from seq2serve.runtime.frontend.whisper_language import detected, detection_request

GRANULARITIES = ("timestamp_granularities[]", "timestamp_granularities")  # (either spelling)
# OpenAI's fields that ask for what is not built yet (issue 43): refused when given
NOT_YET = {
    "include[]": "token log-probs of transcriptions are not built yet",
}


class AudioServing:
    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving
        self.tm = serving.tm

    def prompt(self) -> WhisperPrompt:
        """The model's forced-prompt settings (read once by the tokenizer manager)."""
        if self.tm.whisper_prompt is None:
            raise RequestError("this model takes no audio: /v1/audio/* serves speech models "
                               "(Whisper)", param="model")
        return self.tm.whisper_prompt

    async def handle(self, request: Request, task: str):
        form = await _form(request)
        try:  # (an uploaded file past 1 MB is spooled to a temporary file until closed)
            return await self._answer(request, form, task)
        finally:
            await form.close()

    async def _answer(self, request: Request, form, task: str):
        endpoint = f"/v1/audio/{'transcriptions' if task == 'transcribe' else 'translations'}"
        audio = form.get("file")
        if not isinstance(audio, UploadFile):
            raise RequestError("file is required: the audio file, as a multipart form field",
                               param="file")
        self.serving.check_model(_text(form, "model"))
        for name, why in NOT_YET.items():
            if form.get(name) not in (None, ""):
                raise RequestError(f"{name} is not supported by {endpoint}: {why}",
                                   param=name.rstrip("[]"))
        fmt = _text(form, "response_format") or "json"
        if fmt not in FORMATS:
            raise RequestError(f"response_format {fmt!r} is not one of {', '.join(FORMATS)}",
                               param="response_format")
        _check_granularities(form, fmt)
        stream = _flag(form, "stream")
        once = _flag(form, "force_unique_generate_call")  # HF's: no re-decoding
        timestamps = fmt in TIMESTAMP_FORMATS
        if stream and timestamps:
            raise RequestError(f"stream is not supported with response_format {fmt!r} "
                               f"(segments come whole); stream json or text",
                               param="stream")
        whisper = self.prompt()
        if timestamps:
            try:
                whisper.check_timestamps(f"response_format {fmt!r}")
            except ValueError as e:
                raise RequestError(str(e), param="response_format") from None
        language, user = _text(form, "language"), _text(form, "user")
        try:
            whisper.tokens(language, task)  # a bad language or task: named before the audio
        except ValueError as e:
            if not (language is None and whisper.is_multilingual):
                raise RequestError(str(e), param="language") from None
        data = await audio.read()
        limit = self.tm.limits.max_audio_bytes
        if len(data) > limit:
            raise RequestError(f"the audio file is {len(data)} bytes, over the limit of "
                               f"{limit} (--max-audio-bytes)", status=413, param="file")
        chunk_s = _number(form, "chunk_length_s", float)
        stride_s = _number(form, "stride_length_s", float)
        vad = _chunking_strategy(form)
        if vad is not None and (chunk_s is not None or stride_s is not None):
            raise RequestError(f"{FIELD} cuts the audio at silences; chunk_length_s and "
                               f"stride_length_s choose fixed windows: give one or the other",
                               param=FIELD)
        chunk_s = 30.0 if chunk_s is None else chunk_s
        for name, stride in (("chunk_length_s", None), ("stride_length_s", stride_s)):
            try:  # the chunk alone, then with its strides
                chunking(chunk_s, stride)
            except ValueError as e:
                raise RequestError(str(e), param=name) from None
        try:  # decoding is CPU work: off the event loop
            job = await asyncio.get_running_loop().run_in_executor(
                None, TranscriptionJob.of, data, self.tm.audio_limits, self.tm.media_policy,
                chunk_s, stride_s, vad)
        except ValueError as e:
            raise RequestError(str(e), param="file") from None
        detected_language = None
        if language is None and whisper.is_multilingual and job.windows:  # as HF's generate
            obj, codes = detection_request(whisper, job.detection_audio, user)
            language, _ = detected(await self.serving.collect(obj, request), codes)
            detected_language = language
        try:
            decoder_ids = whisper.tokens(language, task, timestamps=timestamps)
        except ValueError as e:
            if job.windows:
                raise RequestError(str(e), param="language") from None
            decoder_ids = []  # no speech: nothing is decoded, no language detected
        previous = _text(form, "prompt")
        if previous is not None:  # the text before this audio, as HF's prompt_ids
            try:
                decoder_ids = whisper.previous_ids(self.tm.tokenizer, previous) + decoder_ids
            except ValueError as e:
                raise RequestError(str(e), param="prompt") from None
        room = whisper.max_target_positions - len(decoder_ids)
        if room < 1:
            raise RequestError(f"the prompt is too long: with the forced tokens it takes "
                               f"{len(decoder_ids)} of the decoder's "
                               f"{whisper.max_target_positions} positions", param="prompt")
        max_tokens = _number(form, "max_tokens", int)
        if max_tokens is not None and not 0 < max_tokens <= room:
            raise RequestError(f"max_tokens must be in [1, {room}] (the decoder's "
                               f"{whisper.max_target_positions} positions less the prompt)",
                               param="max_tokens")
        sp = {"max_new_tokens": max_tokens or room,
              "temperature": _number(form, "temperature", float) or 0.0,
              "timestamps": timestamps}
        # SGLang's and vLLM's `min_tokens`: end of text banned before it (a fixed length: what
        # `bench serving --audio-seconds` asks for)
        min_tokens = _number(form, "min_tokens", int)
        if min_tokens is not None:
            if not 0 <= min_tokens <= sp["max_new_tokens"]:
                raise RequestError(f"min_tokens must be in [0, {sp['max_new_tokens']}] (at "
                                   f"most max_tokens)", param="min_tokens")
            sp["min_new_tokens"] = min_tokens
        num_beams = _number(form, "num_beams", int)
        if num_beams is not None:
            sp["num_beams"] = num_beams
        try:
            sp = with_beams(sp, _number(form, "beam_size", int), 1, stream)
        except ValueError as e:
            raise RequestError(str(e), param="num_beams") from None
        objs = job.requests(decoder_ids, sp, self.tm.limits.max_batch_inputs,
                            stream=stream and not job.is_long, user=user)
        if stream and not job.is_long and objs:
            return await self._stream(objs[0])
        results = await _collect_all(self.serving, objs, request)
        again = (job.redecoding(results, whisper, self.tm.tokenizer.eos_token_id)
                 if timestamps and not once else None)
        if again is not None:  # HF's default: the window again from its last whole segment
            while objs := again.requests(decoder_ids, sp, self.tm.limits.max_batch_inputs,
                                         user):
                again.add(await _collect_all(self.serving, objs, request))
            results = again.results()
        result = (job.timed(results, self.tm.tokenizer, whisper) if timestamps
                  else job.answer(results, self.tm.tokenizer, whisper))
        if stream:  # long audio: the merged text, once every window is done
            return sse_response(_whole_text_events(result["text"]))
        body, media_type = formatted(
            result, fmt, task=task, language=detected_language or whisper.language_code(language),
            duration=job.duration, temperature=sp["temperature"],
            detected=detected_language is not None)
        return Response(body, media_type=media_type)

    async def _stream(self, obj: GenerateReqInput):
        first, agen = await self.serving._first(self.tm.generate(obj))

        async def events():
            text, chunk = [], first
            while chunk is not None:
                if chunk["text"]:
                    text.append(chunk["text"])
                    yield _sse({"type": "transcript.text.delta", "delta": chunk["text"]})
                chunk = await anext(agen, None)
            yield _sse({"type": "transcript.text.done", "text": "".join(text)})
            yield "data: [DONE]\n\n"

        return sse_response(events())


def _chunking_strategy(form) -> VadOptions | None:
    """OpenAI's `chunking_strategy`: one text field ("auto" or a JSON object), or the
    `chunking_strategy[key]` fields the `openai` client sends an object as; None without."""
    fields = {}
    for name, value in form.multi_items():
        if name == FIELD or name.startswith(f"{FIELD}["):
            if isinstance(value, UploadFile):
                raise RequestError(f"{name} must be a text field, not a file", param=FIELD)
            fields[name] = value
    try:
        return vad_options(form_value(fields))
    except ValueError as e:
        raise RequestError(str(e), param=FIELD) from None


def _check_granularities(form, fmt: str) -> None:
    """OpenAI's `timestamp_granularities[]`: segment (with verbose_json, as OpenAI's);
    word timestamps are not built."""
    for name in GRANULARITIES:
        for value in form.getlist(name):
            if isinstance(value, UploadFile):
                raise RequestError(f"{name} must be a text field, not a file", param=name)
            if value == "word":
                raise RequestError(f"{name} 'word' is not supported: word timestamps are not "
                                   f"built (segment is)", param=name)
            if value != "segment":
                raise RequestError(f"{name} {value!r} is not one of segment, word", param=name)
            if fmt != "verbose_json":
                raise RequestError(f"{name} needs response_format verbose_json (got {fmt!r})",
                                   param=name)


async def _collect_all(serving: OpenAIServing, objs: list[GenerateReqInput],
                       request: Request) -> list[dict]:
    """Every request's results in order; one failing cancels (aborts) the others."""
    tasks = [asyncio.ensure_future(serving.collect(o, request)) for o in objs]
    try:
        return [r for results in await asyncio.gather(*tasks) for r in results]
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _whole_text_events(text: str):
    if text:
        yield _sse({"type": "transcript.text.delta", "delta": text})
    yield _sse({"type": "transcript.text.done", "text": text})
    yield "data: [DONE]\n\n"


async def _form(request: Request):
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise RequestError("send the audio as multipart/form-data (a `file` field and the "
                           "options as fields)", status=415)
    try:
        return await request.form(max_files=1, max_fields=64)
    except Exception as e:  # noqa: BLE001 - python-multipart's errors are many kinds
        raise RequestError(f"the multipart form could not be read: {e}") from None


def _text(form, name: str) -> str | None:
    value = form.get(name)
    if isinstance(value, UploadFile):
        raise RequestError(f"{name} must be a text field, not a file", param=name)
    return value if value not in (None, "") else None


def _flag(form, name: str) -> bool:
    value = _text(form, name)
    if value is None:
        return False
    if value.lower() not in ("true", "false", "1", "0"):
        raise RequestError(f"{name} must be true or false, got {value!r}", param=name)
    return value.lower() in ("true", "1")


def _number(form, name: str, kind: type):
    value = _text(form, name)
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        raise RequestError(f"{name} must be a{'n integer' if kind is int else ' number'}, "
                           f"got {value!r}", param=name) from None

