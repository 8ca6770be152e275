"""Seq2SeqEngine: the Python API. It starts the same scheduler and detokenizer processes as the
HTTP server and runs the TokenizerManager on an event loop of its own (a background thread), so
it works from plain scripts, from async code and from notebooks alike."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from seq2serve.encoders.image_loader import MediaPolicy
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.frontend.document_translation import document_job
from seq2serve.runtime.frontend.florence_chat import task_request
from seq2serve.runtime.frontend.generate_request import (
    GenerateReqInput,
    results_per_prompt,
    split_rows,
)
from seq2serve.runtime.frontend.glossary import load_named, request_glossary
from seq2serve.runtime.frontend.launch import RuntimeProcesses, launch_processes
from seq2serve.runtime.frontend.prompts import chat_prompt
from seq2serve.runtime.frontend.tokenizer_manager import TokenizerManager
from seq2serve.runtime.frontend.translation import default_num_beams, with_beams
from seq2serve.runtime.frontend.translation_options import TranslationOptions

logger = logging.getLogger(__name__)

_WATCH_INTERVAL_S = 0.5


class EngineShutdownError(RuntimeError):
    """The engine was shut down (before or while the call waited)."""


class Seq2SeqEngine:
    """Serve a model in this Python process.

    >>> with Seq2SeqEngine(model_path=DIR, device="cpu") as engine:
    ...     out = engine.generate(prompt="translate English to German: Hi",
    ...                           sampling_params={"max_new_tokens": 16, "temperature": 0})
    ...     out["text"], out["output_ids"], out["meta_info"]["finish_reason"]

    A single prompt returns one dict; a list (or n > 1, or num_return_sequences > 1) returns
    a list, prompt-major; a beam search's results come best first, each with
    meta_info["beam_score"]. With `stream=True`,
    `generate` returns an iterator of chunks whose "text" pieces concatenate to the full text.
    Options are ServerArgs fields (device, dtype, attention_backend, page_size, ...).
    """

    def __init__(self, model_path: str | None = None, **kwargs: Any) -> None:
        if model_path is None:
            from seq2serve.runtime.tools.demo_checkpoint import default_demo_path

            model_path = str(default_demo_path())
        self.args = ServerArgs.from_kwargs(model_path=str(model_path), **kwargs)
        if self.args.api_server_count != 1:
            raise ValueError("api_server_count is the HTTP server's (its HTTP processes); "
                             "the engine has none")
        self.translation_beams = default_num_beams(self.args.model_path)
        self.glossaries = load_named(self.args.glossary)  # before the children start
        self._closed = self._closing = False
        self._pending: set[concurrent.futures.Future] = set()  # calls waiting (_call)
        self.procs: RuntimeProcesses = launch_processes(self.args)
        try:
            tokenizer = load_tokenizer(self.args.tokenizer_path or self.args.model_path)
            # the Python API is a trusted caller: image file paths are allowed
            policy = MediaPolicy(allow_local_paths=True, allow_remote=self.args.allow_remote_media,
                                 max_pixels=self.args.max_image_pixels)
            self.tokenizer_manager = TokenizerManager(
                self.procs.ipc, tokenizer, self.procs.info, model_id=self.args.model_path,
                media_policy=policy, limits=self.args.request_limits(),
                isolation=self.args.isolation(), media_processes=self.args.media_processes)
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever,
                                             name="seq2serve-engine-loop", daemon=True)
            self._thread.start()
            self._call(self.tokenizer_manager.start())
            self._watcher = threading.Thread(target=self._watch, name="seq2serve-watch",
                                             daemon=True)
            self._watcher.start()
        except BaseException:
            self.procs.shutdown()
            raise

    @property
    def info(self) -> dict[str, Any]:
        """What the scheduler reported at start: architecture, device, dtype, pool sizes."""
        return dict(self.procs.info)

    # --- generation --------------------------------------------------------------------------
    def generate(self, prompt: str | list[str] | None = None,
                 sampling_params: dict | list[dict] | None = None,
                 input_ids: list[int] | list[list[int]] | None = None,
                 decoder_input_ids: list[int] | list[list[int]] | None = None,
                 stream: bool = False, return_logprob: bool = False,
                 top_logprobs_num: int = 0, rid: str | list[str] | None = None,
                 image_data: Any = None, user: str | None = None,
                 logprob_start_len: int | None = None, audio_data: Any = None):
        """`image_data` (vision models) is aligned with the prompts: for each, one image or a
        list (empty for text-only); an image is a path, bytes, base64, a data URL or a PIL
        image. With `return_logprob` and `logprob_start_len` k, meta_info also has
        "input_token_logprobs": (log-prob, id) of the decoder input from position k on (the
        decoder start token, or a decoder-only prompt's first token, is position 0 and has no
        log-prob: None); max_new_tokens 0 scores without generating. `audio_data` (speech
        models: Whisper) is the encoder input in place of a prompt: one audio, or a list for a
        batch; an audio is a WAV/FLAC/OGG/MP3 file's bytes, a path, or 16 kHz samples as a 1-D
        float array, of at most one 30 s window (`transcribe` cuts longer audio). Its decoder
        prompt is `decoder_input_ids` (`WhisperPrompt.from_model(path).tokens(language,
        task)`: start, language, task, no-timestamps tokens; an English-only model's by
        default)."""
        obj = GenerateReqInput(text=prompt, input_ids=input_ids,
                               decoder_input_ids=decoder_input_ids,
                               sampling_params=sampling_params, stream=stream,
                               return_logprob=return_logprob,
                               top_logprobs_num=top_logprobs_num, rid=rid,
                               image_data=image_data, audio_data=audio_data, user=user,
                               logprob_start_len=logprob_start_len,
                               show_replica=True)  # the engine's caller runs the server
        if stream:
            return self._sync_iter(self.tokenizer_manager.generate(obj))
        # max_batch_inputs and max_images_per_call bound an HTTP body; a Python list of any
        # length goes in chunks
        chunks = split_rows(obj, self.args.max_batch_inputs, self.args.max_images_per_call)
        results = self._call(_collect_all(self.tokenizer_manager, chunks))
        return results if _returns_list(obj) else results[0]

    def embed(self, text: str | list[str] | None = None,
              input_ids: list[int] | list[list[int]] | None = None,
              user: str | None = None) -> list[float] | list[list[float]]:
        """Each input's embedding, as `/v1/embeddings` gives it: the encoder's output averaged
        over all the input's tokens (EOS included), L2-normalised; one vector for one input,
        a list for a list. Encoder-decoder text models only (ValueError naming the model
        otherwise). The encoder stage computes it in the same batches and through the same
        encoder cache as generation: an input generated from before costs no encoder pass."""
        obj = GenerateReqInput(text=text, input_ids=input_ids,
                               sampling_params={"max_new_tokens": 0}, embed=True, user=user)
        chunks = split_rows(obj, self.args.max_batch_inputs)
        results = self._call(_collect_all(self.tokenizer_manager, chunks))
        vectors = [r["meta_info"]["embedding"] for r in results]
        return vectors if _returns_list(obj) else vectors[0]

    def transcribe(self, audio: Any, language: str | None = None, task: str = "transcribe",
                   sampling_params: dict | None = None, prompt: str | None = None,
                   chunk_length_s: float = 30.0,
                   stride_length_s: float | None = None,
                   return_timestamps: bool = False,
                   force_unique_generate_call: bool = False,
                   chunking_strategy: Any = None) -> dict[str, Any]:
        """A speech model's text for one audio (a WAV/FLAC/OGG/MP3 file's bytes, a path, or
        16 kHz samples; up to `max_audio_seconds`), as `/v1/audio/transcriptions` answers it:
        {"text", "output_ids", "meta_info"}. Audio longer than 30 s is cut into HF's
        pipeline's 30 s windows with 5 s strides, decoded as one batch and merged as the
        pipeline merges them (`output_ids`: the merged text tokens; `meta_info["windows"]`:
        how many). `language`: a code ("de") or an English name; without one a multilingual
        model's is detected first (on the first window), as HF's generate does (the result
        then has "language" and every language's log-prob, "language_logprobs"); `task`:
        "transcribe" or "translate" (to English); `prompt`: text before this audio's (HF's
        `prompt_ids`, before every window's). By default greedy, up to the decoder's positions
        left after the prompt (each window's); `sampling_params` overrides (num_beams, ...).
        `chunk_length_s` (at most 30) and `stride_length_s` (by default a sixth of the chunk)
        are HF's pipeline's: other windows, cut and merged as it would. `return_timestamps`
        (HF's name): decoded with Whisper's timestamp rules, as HF's
        `generate(return_timestamps=True)` for one window, and the result has "segments"
        (`timestamp_segments.Segment`: start, end in seconds, text, tokens; "text" without
        the timestamps); longer audio's windows are each decoded so and merged as HF's
        pipeline merges them with `return_timestamps=True` (its text and its chunks as the
        segments: `TranscriptionJob.long_timed`). With timestamps each window is decoded as HF's
        default generate decodes it: again from its last complete segment while a decode
        ends mid-segment (`whisper_seek.py`; a short clip's "output_ids" are HF's
        `sequences`, the decodes' tokens end to end; `meta_info["decodes"]` counts them);
        `force_unique_generate_call` (HF's name) decodes each window once.
        `chunking_strategy` (OpenAI's: "auto" or {"type": "server_vad", "threshold",
        "prefix_padding_ms", "silence_duration_ms"}) cuts the audio at the silences Silero VAD
        finds instead: windows of at most 30 s, the silence between them skipped, their texts
        joined and their segments moved on by their starts (`meta_info["windows"]`: 0 and
        "text" "" for audio without speech, nothing decoded)."""
        from seq2serve.runtime.frontend.chunking_strategy import vad_options
        from seq2serve.runtime.frontend.transcription_job import TranscriptionJob
        from seq2serve.runtime.frontend.whisper_language import detected, detection_request

        tm = self.tokenizer_manager
        whisper = tm.whisper_prompt
        if whisper is None:
            raise ValueError("this model takes no audio: transcribe serves speech models "
                             "(Whisper)")
        if language is not None or not whisper.is_multilingual:
            whisper.tokens(language, task)  # a bad language or task: named before decoding
        if return_timestamps:
            whisper.check_timestamps("return_timestamps")
        vad = vad_options(chunking_strategy)
        if vad is not None and (chunk_length_s != 30.0 or stride_length_s is not None):
            raise ValueError("chunking_strategy cuts the audio at silences; chunk_length_s and "
                             "stride_length_s choose fixed windows: give one or the other")
        job = TranscriptionJob.of(audio, tm.audio_limits, tm.media_policy, chunk_length_s,
                                  stride_length_s, vad)
        scores = None
        if language is None and whisper.is_multilingual and job.windows:
            obj, codes = detection_request(whisper, job.detection_audio)
            language, scores = detected(self._call(_collect_all(tm, [obj])), codes)
        forced = (whisper.tokens(language, task, timestamps=return_timestamps)
                  if job.windows else [])  # no speech: nothing to decode
        if prompt is not None:
            forced = whisper.previous_ids(tm.tokenizer, prompt) + forced
        sp = {"max_new_tokens": whisper.max_target_positions - len(forced),
              "temperature": 0.0, **(sampling_params or {})}
        if return_timestamps:
            sp["timestamps"] = True
        objs = job.requests(forced, sp, self.args.max_batch_inputs)
        results = self._call(_collect_all(tm, objs))
        again = (job.redecoding(results, whisper, tm.tokenizer.eos_token_id)
                 if return_timestamps and not force_unique_generate_call else None)
        if again is not None:
            while objs := again.requests(forced, sp, self.args.max_batch_inputs):
                again.add(self._call(_collect_all(tm, objs)))
            results = again.results()
        out = (job.timed(results, tm.tokenizer, whisper) if return_timestamps
               else job.answer(results, tm.tokenizer, whisper))
        if scores is not None:
            out["language"], out["language_logprobs"] = language, scores
        return out

    async def async_generate(self, prompt: str | list[str] | None = None,
                             sampling_params: dict | list[dict] | None = None,
                             input_ids: list[int] | list[list[int]] | None = None,
                             decoder_input_ids: list[int] | list[list[int]] | None = None,
                             stream: bool = False, return_logprob: bool = False,
                             top_logprobs_num: int = 0, rid: str | list[str] | None = None,
                             image_data: Any = None, user: str | None = None,
                             logprob_start_len: int | None = None, audio_data: Any = None):
        """Like `generate`, from async code. With stream=True it returns an async iterator."""
        obj = GenerateReqInput(text=prompt, input_ids=input_ids,
                               decoder_input_ids=decoder_input_ids,
                               sampling_params=sampling_params, stream=stream,
                               return_logprob=return_logprob,
                               top_logprobs_num=top_logprobs_num, rid=rid,
                               image_data=image_data, audio_data=audio_data, user=user,
                               logprob_start_len=logprob_start_len,
                               show_replica=True)  # the engine's caller runs the server
        if stream:
            return self._async_iter(self.tokenizer_manager.generate(obj))
        chunks = split_rows(obj, self.args.max_batch_inputs, self.args.max_images_per_call)
        results = await self._acall(_collect_all(self.tokenizer_manager, chunks))
        return results if _returns_list(obj) else results[0]

    def translate(self, text: str | list[str], source_lang: str = "English",
                  target_lang: str | list[str] = "German", sampling_params: dict | None = None,
                  stream: bool = False, user: str | None = None,
                  beam_size: int | None = None, format: str = "text",
                  alternatives: int | None = None,
                  target_prefix: str | list[str] | None = None, return_scores: bool = False,
                  glossary: dict[str, str] | str | None = None):
        """Translate `text` (one document or a list) into `target_lang` (one language, or one
        per document). Languages are ISO 639-1 codes ("de"), English names ("German") or the
        model's own codes ("deu_Latn"): a model whose tokenizer names its languages (NLLB,
        M2M100, mBART-50, OPUS-MT) gets its source prefix and forced target token, a
        ValueError naming its languages for one it lacks; any other gets its prompt template
        (T5's convention when it has none). `beam_size` is sampling_params' num_beams; with
        neither, the model directory's generation_config.json `num_beams` (1 without one, and
        for a stream). `source_lang="auto"` detects each document's language: its result (a
        stream: its first chunk) has `detected_language` ({"language": ISO code,
        "confidence": 0..100, "source_lang": the model's code}; docs/translation.md).

        `format` ("text", "markdown" or "html") says how the documents are written: each is
        cut into sentences (in markdown and HTML, of its text only; a sentence over the
        model's input limit at clause boundaries), every sentence of every document is sent
        as one batch, and the translations are put back with everything else as it was
        (docs/translation.md). A short input that is one sentence is translated as it is,
        its result generate's; a longer document's result sums its pieces' token counts
        (meta_info "pieces"). With `stream`, each document's text comes in order:
        {"index", "text", "meta_info": {"finish_reason"}} chunks.

        `alternatives` k: each result gets "alternatives", the k best translations of a beam
        search of max(k, the beam count) beams, best first (generate's result dicts, each
        with its "score"), the result being the first. `target_prefix` (one string, or one
        per document): each translation starts with it (its tokens are forced after the
        decoder's start and target-language tokens); the result's text and output_ids include
        it. These two take each document as one sentence of format "text". `return_scores`:
        each result gets "score" (a beam search's `beam_score`, HF's sequences_scores; else
        the sum of the generated tokens' log-probs; a document of several pieces: its pieces'
        summed), a stream each document's last chunk's meta_info "score". See
        docs/translation.md.

        `glossary` ({"source term": "target term"}, or the name of one given to the engine's
        `glossary` option): where a source term occurs (case-insensitively, as a whole word),
        its target term appears in that sentence's translation, exactly as given; a missing
        one is placed where the model scores it best (docs/translation.md, "Glossaries"); a
        result whose translation was changed so has meta_info "glossary_placed" (terms placed).
        Not with stream, alternatives, target_prefix or return_scores."""
        sampling_params = with_beams(sampling_params, beam_size, self.translation_beams, stream)
        options = TranslationOptions(alternatives, target_prefix, return_scores)
        job = document_job(self.tokenizer_manager, self.args.model_path, text, format,
                           source_lang, target_lang, sampling_params, stream, user, options,
                           request_glossary(glossary, self.glossaries))
        if stream:
            chunks = None if job.request is None else self.tokenizer_manager.generate(job.request)
            return self._sync_iter(job.stream(chunks))
        tm = self.tokenizer_manager
        outputs = [] if job.request is None else self._call(_collect(tm.generate(job.request)))
        if job.glossary is not None:
            outputs = self._call(job.enforce(outputs, lambda obj: _collect(tm.generate(obj))))
        results = job.results(outputs)
        return results if isinstance(text, list) else results[0]

    @property
    def languages(self) -> list[dict[str, str | None]] | None:
        """The languages the model translates between (None: it takes a prompt template)."""
        langs = self.tokenizer_manager.languages
        return None if langs is None else langs.describe()

    def chat(self, messages: list[dict[str, Any]], sampling_params: dict | None = None,
             stream: bool = False, user: str | None = None):
        """One chat turn: the chat template when the tokenizer has one, else a plain join.
        Content parts may carry images ({"type": "image", "image": ...} or OpenAI's
        {"type": "image_url", ...}). Florence-2: one user message with one image and a task
        token, answered as generate(prompt=task, image_data=[image]) (`florence_chat.py`)."""
        prompt = self.chat_inputs(messages)
        return self.generate(prompt=prompt.get("text"), input_ids=prompt.get("input_ids"),
                             image_data=prompt.get("image_data") or None,
                             sampling_params=sampling_params, stream=stream, user=user)

    def chat_inputs(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """What `chat` hands to `generate` for one conversation: {"text" or "input_ids",
        "image_data"} (the chat template applied, or Florence-2's task and image)."""
        tm = self.tokenizer_manager
        return (task_request(messages, tm.info) if tm.info.get("image_prompt")
                else chat_prompt(tm.tokenizer, messages))

    def tokenize(self, text: str | list[str], add_special_tokens: bool = True):
        """Token ids of a text (a list for a list) as generate would see it as a prompt, or,
        without special tokens, as a continuation of one (`POST /tokenize`)."""
        texts, step = (text if isinstance(text, list) else [text]), self.args.max_batch_inputs
        ids = [t for i in range(0, len(texts), step) for t in
               self.tokenizer_manager.tokenize_texts(texts[i:i + step], add_special_tokens)]
        return ids if isinstance(text, list) else ids[0]

    def model_info(self) -> dict[str, Any]:
        """Where prompts go, the decoder start token, the image token, the chat role markers
        (`GET /get_model_info`)."""
        return self.tokenizer_manager.model_info()

    # --- operations --------------------------------------------------------------------------
    def check_integrity(self) -> dict[str, Any]:
        """Ask the scheduler to account for every pool slot; AssertionError if one leaked."""
        reply = self._call(self.tokenizer_manager.control("check_integrity"))
        if not reply.ok:
            raise AssertionError(reply.payload.get("error"))
        return reply.payload

    def stats(self) -> dict[str, Any]:
        """The scheduler's counters; with `dp_size` > 1 summed over the replicas, each one's
        under "replicas" and the router's under "router". "layout": where the replicas run."""
        return {**self._call(self.tokenizer_manager.control("stats")).payload,
                "layout": self.procs.layout()}

    def flush_cache(self) -> bool:
        return self._call(self.tokenizer_manager.control("flush_cache")).ok

    def shutdown(self) -> None:
        """Stop the engine; calls still waiting in other threads fail at once with
        EngineShutdownError."""
        if self._closed:
            return
        self._closing = True
        for fut in list(self._pending):
            fut.cancel()
        if hasattr(self, "_loop"):
            try:
                asyncio.run_coroutine_threadsafe(self.tokenizer_manager.close(),
                                                 self._loop).result(timeout=5)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout=5)
        self._closed = True
        self.procs.shutdown()

    def __enter__(self) -> Seq2SeqEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001 - interpreter teardown
            pass

    # --- plumbing between the caller and the engine's loop -----------------------------------
    def _call(self, coro):
        """Run `coro` on the engine's loop and wait. If the wait is interrupted (Ctrl-C, any
        BaseException), the call is cancelled, which aborts its requests, before the
        exception goes on; `shutdown()` fails every waiting caller with EngineShutdownError."""
        if self._closed:
            coro.close()
            raise EngineShutdownError("the engine has been shut down")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        self._pending.add(fut)
        try:
            return fut.result()
        except concurrent.futures.CancelledError:
            if self._closing:
                raise EngineShutdownError("the engine was shut down while this call "
                                          "waited") from None
            raise
        except BaseException:
            fut.cancel()  # cancels the task: the generator's cleanup aborts the requests
            if not self._closing:  # wait until the loop has sent the aborts
                asyncio.run_coroutine_threadsafe(_settle(), self._loop).result(timeout=10)
            raise
        finally:
            self._pending.discard(fut)

    async def _acall(self, coro):
        if self._closed:
            raise RuntimeError("the engine has been shut down")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def _sync_iter(self, agen: AsyncIterator) -> Iterator:
        try:
            while True:
                try:
                    yield self._call(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:  # the caller stopped early: close the generator, which aborts the request
            if not self._closed:
                self._call(agen.aclose())

    async def _async_iter(self, agen: AsyncIterator) -> AsyncIterator:
        try:
            while True:
                try:
                    yield await self._acall(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            if not self._closed:
                await self._acall(agen.aclose())

    def _watch(self) -> None:
        while not self._closed:
            reason = self.procs.dead_child()
            if reason is not None:
                logger.error("%s; the engine can no longer serve", reason)
                self._loop.call_soon_threadsafe(self.tokenizer_manager.mark_dead, reason)
                return
            threading.Event().wait(_WATCH_INTERVAL_S)


async def _collect(agen: AsyncIterator) -> list:
    return [item async for item in agen]


async def _collect_all(tm: TokenizerManager, objs: list[GenerateReqInput]) -> list:
    """Every chunk's results, in order; one failing chunk cancels (aborts) the others."""
    tasks = [asyncio.ensure_future(_collect(tm.generate(o))) for o in objs]
    try:
        return [r for chunk in await asyncio.gather(*tasks) for r in chunk]
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _settle() -> None:
    """A few loop iterations: cancelled calls run their cleanup (their aborts are sent)."""
    for _ in range(5):
        await asyncio.sleep(0)


def _returns_list(obj: GenerateReqInput) -> bool:
    is_batch = isinstance(obj.text, list) or isinstance(obj.audio_data, list) or (
        isinstance(obj.input_ids, list) and bool(obj.input_ids)
        and isinstance(obj.input_ids[0], list))
    return is_batch or results_per_prompt(obj.sampling_params) > 1
