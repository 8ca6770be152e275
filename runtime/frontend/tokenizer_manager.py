"""The TokenizerManager: runs on asyncio in the caller's process. Validates and tokenizes
requests, sends them to the scheduler, and hands each caller its detokenized results."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio
from PIL import Image

from seq2serve.encoders.encoder_input import ImageFeatures, cross_spans
from seq2serve.encoders.image_loader import MediaPolicy
from seq2serve.encoders.pixel_store import PixelStore
from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.server_args import CacheIsolation, RequestLimits
from seq2serve.runtime.frontend import image_prompts
from seq2serve.runtime.frontend.florence_answers import FlorenceAnswers, TaskAnswer
from seq2serve.runtime.frontend.generate_request import (
    GenerateReqInput,
    invalid_text,
    rows_per_prompt,
)
from seq2serve.runtime.frontend.languages import TranslationLanguages
from seq2serve.runtime.frontend.media_worker import prepared
from seq2serve.runtime.frontend.min_length import runtime_min_new_tokens
from seq2serve.runtime.frontend.prompts import role_markers
from seq2serve.runtime.frontend.replica_replies import merge_replies
from seq2serve.runtime.frontend.request_ids import client_rid, scoped_rid, server_tag
from seq2serve.runtime.frontend.scheduler_link import SchedulerLink
from seq2serve.runtime.memory.host_memory import release_freed_memory
from seq2serve.runtime.messages.io_struct import (
    BatchTokenOutput,
    ControlReply,
    ControlRequest,
    TokenizedRequest,
    TokenOutput,
)
from seq2serve.runtime.messages.ipc import IpcNames, socket
from seq2serve.runtime.messages.model_limits import ModelLimits

logger = logging.getLogger(__name__)
# messages the receive loop takes without yielding to the streams (bounds one turn of the loop)
_DRAIN = 64


class EngineDeadError(RuntimeError):
    """A child process of the runtime died; no request can be served any more."""


@dataclass
class _ReqState:
    rid: str  # the runtime's key: the client's rid under its user (request_ids.py)
    index: int
    show_replica: bool = False  # data parallelism: meta_info.replica (the operator's only)
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    scored_ids: list[int] | None = None  # the decoder input from logprob_start_len on
    input_logprobs: list[float | None] | None = None
    created: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    last_token: float | None = None
    finished: bool = False
    held: Any = None  # an error that came behind outputs merged into one piece (_next)
    # a Florence-2 task's answer: its text decoded here (florence_answers.py), then parsed
    answer: TaskAnswer | None = None
    parsed: dict | None = None


class MediaTurn:
    """A part's turn to queue its images on the media threads or workers (`media_parts`):
    after the part before it has queued its own. All of a call's parts are tokenized at once,
    on as many threads, and each queued its images as its thread got to it, so parts' images
    could interleave in the queue and a part wait on images of later parts (seen on the CI
    host: images did not start in their parts' order; how much it cost there was within the
    noise, on 2 media threads). In turn, the media threads take a call's images in its
    parts' order."""

    def __init__(self, before: MediaTurn | None) -> None:
        self.before = before
        self.done = threading.Event()

    def wait(self) -> None:
        if self.before is not None:
            self.before.done.wait()

    def queued(self) -> None:
        self.done.set()

    @staticmethod
    def chain(n: int) -> list[MediaTurn]:
        turns: list[MediaTurn] = []
        for _ in range(n):
            turns.append(MediaTurn(turns[-1] if turns else None))
        return turns


class TokenizerManager:
    def __init__(self, ipc: IpcNames, tokenizer, info: dict[str, Any], model_id: str,
                 media_policy: MediaPolicy | None = None,
                 limits: RequestLimits | None = None,
                 isolation: CacheIsolation | None = None,
                 server: int | None = None, servers: int = 1, media_processes: int = 0) -> None:
        self.ipc = ipc
        # with several HTTP processes: this one's index, which prefixes its request keys and
        # control tags so that the detokenizer sends their outputs here (request_ids.py)
        self.server, self.servers = server, servers
        self.tokenizer = tokenizer
        self.info = info
        self.model_id = model_id
        self.is_encoder_decoder = info["is_encoder_decoder"]
        # Florence-2: its task answers' special tokens kept, and parsed by HF's processor
        self.answers = (FlorenceAnswers.load(model_id, tokenizer, info)
                        if info.get("image_prompt") else None)
        self.media_policy = media_policy or MediaPolicy()
        self.limits = limits or RequestLimits()
        self.isolation = isolation or CacheIsolation()  # the router's too
        self.image_processor = None
        self._processor_args = None  # the ImageProcessor's arguments (a media worker's too)
        self.media_pool = None  # decodes images and audio side by side
        self.audio_processor = None
        self.audio_limits = None  # a speech model's: the whole audio's (bytes, seconds)
        self.whisper_prompt = None  # a speech model's default decoder prompt
        self._previous_text_token = None  # Whisper's <|startofprev|>: a prompt may begin so
        if info.get("has_audio"):
            from seq2serve.encoders.audio_features import AudioProcessor
            from seq2serve.encoders.audio_loader import AudioLimits
            from seq2serve.runtime.frontend.audio_chunks import CHUNK_SAMPLES, SAMPLING_RATE
            from seq2serve.runtime.frontend.transcription import WhisperPrompt

            # the whole audio's limits (a transcription's, cut into windows above); the
            # processor's input is one window
            self.audio_limits = AudioLimits(self.limits.max_audio_bytes,
                                            self.limits.max_audio_seconds)
            window = AudioLimits(self.limits.max_audio_bytes, CHUNK_SAMPLES / SAMPLING_RATE)
            self.audio_processor = AudioProcessor(model_id, model_id, info["num_mel_bins"],
                                                  info["audio_tokens"], window,
                                                  self.media_policy)
            self.whisper_prompt = WhisperPrompt.from_model(model_id)
            self._previous_text_token = tokenizer.convert_tokens_to_ids("<|startofprev|>")
        if info.get("has_vision"):
            import torch

            from seq2serve.encoders.image_processor import ImageProcessor

            dtype = getattr(torch, info.get("dtype", "float32"))
            self._processor_args = dict(
                model_path=model_id, model_id=model_id,
                tokens_per_tile=info.get("tokens_per_tile"), pixel_dtype=dtype,
                stages=info.get("image_stages"), extra_tokens=info.get("image_extra_tokens", 0),
                max_grid=info.get("image_max_grid"))
            self.image_processor = ImageProcessor(**self._processor_args)
        if info.get("has_vision") or info.get("has_audio"):
            # decoding and preprocessing images, and decoding and hashing audio, is CPU work
            # that releases the GIL enough to run side by side
            self.media_pool = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1),
                                                 thread_name_prefix="seq2serve-media")
        # the languages a translation model's tokenizer names (None: a prompt template's)
        self.languages = TranslationLanguages.of(tokenizer) if self.is_encoder_decoder else None
        # no token covers more characters than this: a longer prompt is refused untokenized
        self.max_token_chars = max(map(len, tokenizer.get_vocab()), default=1)
        self.states: dict[str, _ReqState] = {}
        # the pixels of images (and the samples of audio windows) in flight, and recent ones:
        # the scheduler reads them from here when its encoder cache misses
        self.pixel_store = (PixelStore() if self.image_processor is not None
                            or self.audio_processor is not None else None)
        # images in worker processes instead of the media threads (media_processes), started
        # with the receive loop (after an HTTP process has forked its body parsers)
        self.media_workers = None
        self._media_processes = media_processes if self.image_processor is not None else 0
        if media_processes and self.image_processor is None:
            logger.warning("media_processes=%d: this model takes no images, so no media "
                           "worker is started", media_processes)
        self.control_waiters: dict[str, asyncio.Future] = {}
        self.dead_reason: str | None = None
        self.draining = False  # shutting down: running requests finish, new ones are refused
        self.metrics = None  # a ServerMetrics when serving HTTP
        self._started = False

    @functools.cached_property
    def model_limits(self) -> ModelLimits:
        return ModelLimits.from_info(self.info)

    async def start(self) -> None:
        """Open the sockets and start the receive loop in the running event loop."""
        if self._started:
            return
        if self._media_processes:
            from seq2serve.runtime.frontend.media_workers import MediaWorkers

            folder = os.path.join(self.pixel_store.root, "from-workers")
            self.media_workers = await asyncio.get_running_loop().run_in_executor(
                None, lambda: MediaWorkers(self._media_processes, self._processor_args,
                                           self.media_policy, self.answers is not None, folder))
        self._started = True
        ctx = zmq.asyncio.Context()
        # to the scheduler, or to each data-parallel replica's through the router
        self.link = SchedulerLink(ctx, self.ipc.scheduler_inputs, self.isolation)
        self.recv_from_detokenizer = socket(ctx, zmq.PULL, self.ipc.tokenizer_input, bind=True)
        self._loop_task = asyncio.get_running_loop().create_task(self._handle_loop())

    # --- requests ----------------------------------------------------------------------------
    def tokenize(self, obj: GenerateReqInput) -> tuple[bool, list[TokenizedRequest]]:
        """Validate and tokenize; one TokenizedRequest per prompt and sample (n). A beam search
        is one TokenizedRequest per prompt, whose `beam_rids` name its k results (k > 1)."""
        is_batch, reqs, _ = self._tokenize(obj)
        return is_batch, reqs

    def _tokenize(self, obj: GenerateReqInput
                  ) -> tuple[bool, list[TokenizedRequest], dict[str, TaskAnswer]]:
        """`tokenize`, and the results that answer a Florence-2 task, by rid."""
        is_batch, items = self._checked_items(obj)
        reqs, answers = self._tokenize_items(obj, items, obj.group or uuid.uuid4().hex)
        return is_batch or sum(len(r.result_rids) for r in reqs) > 1, reqs, answers

    def _checked_items(self, obj: GenerateReqInput) -> tuple[bool, list[dict[str, Any]]]:
        """The call's prompts (`GenerateReqInput.normalize`), checked against the limits that
        hold for the call as a whole (its rows, its images), before any is tokenized."""
        is_batch, items = obj.normalize()
        if obj.embed:
            self._check_embedding(obj, items)
        rows = sum(rows_per_prompt(item["sampling_params"]) for item in items)
        if rows > self.limits.max_batch_inputs:
            raise ValueError(f"{rows} inputs (rows: prompts x n x num_beams) in one request, "
                             f"over this server's limit of {self.limits.max_batch_inputs} "
                             f"(max_batch_inputs)")
        self._check_image_counts([item["image_data"] for item in items])
        return is_batch, items

    def _tokenize_items(self, obj: GenerateReqInput, items: list[dict[str, Any]], group: str,
                        turn: MediaTurn | None = None
                        ) -> tuple[list[TokenizedRequest], dict[str, TaskAnswer]]:
        """The TokenizedRequests of `items` (all the call's prompts, or a part of them:
        `media_parts`), their images and audio preprocessed, and the results that answer a
        Florence-2 task, by rid. `group`: the call's (the scheduler admits callers fairly,
        not prompts)."""
        per_item, sizes = self._sized_images([item["image_data"] for item in items], turn)
        per_item = [imgs + audio for imgs, audio in zip(per_item, self._audio(items))]
        reqs = []
        tasks: dict[str, tuple] = {}  # result rid -> (task, image size, stop strings)
        for item, images, size in zip(items, per_item, sizes):
            sp = SamplingParams.from_dict(item["sampling_params"])
            sp.validate(self.info["vocab_size"])
            cap = self.limits.max_new_tokens
            if cap is not None and "max_new_tokens" not in (item["sampling_params"] or {}):
                sp.max_new_tokens = min(sp.max_new_tokens, cap)  # a default, not a request
            self._check_limits(sp)
            _check_beams(sp, obj)
            enc, dec, forced = self._token_ids(item, item["decoder_forced"])
            image_prompt = self.info.get("image_prompt", False)  # Florence-2
            if image_prompt:
                enc = image_prompts.prompt_after_image(enc, images, self.info["image_token_id"])
            given = _sets(item["sampling_params"], "min_new_tokens")
            sp.min_new_tokens = runtime_min_new_tokens(sp, given, len(dec), forced,
                                                       self.info.get("min_length", 0))
            spans = None
            if self.image_processor is not None and not self.is_encoder_decoder:
                spans = cross_spans(dec, self.info["image_token_id"],
                                    [img.num_tokens for img in images])
            self._check_lengths(enc, dec, sp, sum(img.num_tokens for img in images))
            if image_prompt:  # the prompt travels with its image, one encoder input
                enc, images = [], image_prompts.pack(enc, images)
            k = obj.logprob_start_len
            if k is not None and k > len(dec):
                raise ValueError(f"logprob_start_len {k} is past the decoder input's "
                                 f"{len(dec)} tokens")
            base_rid = scoped_rid(obj.user, item["rid"] or uuid.uuid4().hex, self.server)
            task = self._task(item)
            spec = None if task is None else (task, size, list(sp.stop))
            common = dict(encoder_input_ids=enc, decoder_input_ids=dec, stream=obj.stream,
                          return_logprob=obj.return_logprob,
                          top_logprobs_num=obj.top_logprobs_num, logprob_start_len=k,
                          encoder_key=self._encoder_key(enc) if enc else None,
                          encoder_inputs=images, cross_spans=spans, user=obj.user, group=group,
                          decoder_forced=forced, embed=obj.embed)
            if sp.is_beam:  # one search, whose k results come back under k rids
                k = sp.num_return_sequences
                beam_rids = [f"{base_rid}-{i}" for i in range(k)] if k > 1 else None
                reqs.append(TokenizedRequest(rid=beam_rids[0] if beam_rids else base_rid,
                                             sampling_params=sp, beam_rids=beam_rids, **common))
                tasks.update(dict.fromkeys(reqs[-1].result_rids, spec))
                continue
            for i in range(sp.n):
                sample_sp = dataclasses.replace(sp, n=1, stop=list(sp.stop),
                                                stop_token_ids=list(sp.stop_token_ids))
                if sp.seed is not None:
                    sample_sp.seed = sp.seed + i  # n samples with one seed must differ
                reqs.append(TokenizedRequest(rid=base_rid if sp.n == 1 else f"{base_rid}-{i}",
                                             sampling_params=sample_sp, **common))
                tasks[reqs[-1].rid] = spec
        if obj.decoder_variants is not None:  # one input, several decoder prompts
            [base] = reqs
            reqs = [dataclasses.replace(base, rid=f"{base.rid}-v{i}", decoder_input_ids=list(v),
                                        sampling_params=dataclasses.replace(base.sampling_params))
                    for i, v in enumerate(obj.decoder_variants)]
            tasks = {r.rid: tasks[base.rid] for r in reqs}
            for r in reqs:
                self._check_lengths(r.encoder_input_ids, r.decoder_input_ids, r.sampling_params,
                                    sum(p.num_tokens for p in r.encoder_inputs))
        rids = [rid for r in reqs for rid in r.result_rids]
        if len(set(rids)) != len(rids):
            raise ValueError("rid must be unique among running requests")
        answers = {rid: self.answers.answer(*spec) for rid, spec in tasks.items()
                   if spec is not None}
        return reqs, answers

    def _task(self, item: dict[str, Any]) -> str | None:
        """The Florence-2 task token a text prompt is, unless the request sets
        skip_special_tokens (then its text is decoded as it says, and not parsed; a
        SamplingParams object sets every field)."""
        params = item["sampling_params"]
        if self.answers is None or "text" not in item or isinstance(params, SamplingParams) or (
                params and params.get("skip_special_tokens") is not None):
            return None
        return self.answers.task_of(item["text"])

    def _audio(self, items: list[dict[str, Any]]) -> list[list]:
        """Each prompt's audio as the encoder's input ([] where it has none): decoded and
        resampled to 16 kHz samples and hashed, several at once on the media pool, off the
        event loop (the log-mel features are the model's, computed on its device)."""
        given = [item["audio_data"] is not None for item in items]
        if self.audio_processor is None:
            if any(given):
                raise ValueError("this model takes no audio (audio_data was given)")
            return [[] for _ in items]
        if not all(given):
            raise ValueError("this model's input is audio: give audio_data, not text or "
                             "input_ids")
        from seq2serve.encoders.audio_loader import read_audio
        from seq2serve.runtime.frontend.audio_chunks import CHUNK_SAMPLES, SAMPLING_RATE

        def one(i_item):
            i, item = i_item
            try:
                samples = read_audio(item["audio_data"], self.audio_limits, self.media_policy)
                if samples.shape[0] > CHUNK_SAMPLES:
                    seconds = samples.shape[0] / SAMPLING_RATE
                    raise ValueError(f"the audio is {seconds:.2f} s long: an audio_data input "
                                     f"is one 30 s window (transcribe and /v1/audio/* cut "
                                     f"longer audio into windows)")
                return [self.audio_processor(samples, item.get("audio_seek", 0))]
            except ValueError as e:
                raise ValueError(f"audio {i}: {e}" if len(items) > 1 else str(e)) from None

        # (in order: the first bad input is the one named, as one at a time would name it)
        return list(self.media_pool.map(one, enumerate(items)))

    def tokenize_texts(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Each text's token ids: as a prompt (the special tokens generate adds, Mllama's BOS
        placement included), or, without special tokens, as a continuation of one."""
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ValueError("texts must be a list of strings")
        if len(texts) > self.limits.max_batch_inputs:
            raise ValueError(f"{len(texts)} texts in one request, over this server's limit of "
                             f"{self.limits.max_batch_inputs} (max_batch_inputs)")
        for t in texts:  # each as long as a prompt may be, before any tokenizing
            self.check_text(t)
        if add_special_tokens:
            return [self._prompt_ids(t) for t in texts]
        return [self.tokenizer(t, add_special_tokens=False).input_ids for t in texts]

    def model_info(self) -> dict[str, Any]:
        """What a client needs to build prompts and scoring requests (`/get_model_info`, the
        frontend language): where prompts go, the decoder's start token, the image token and
        each chat role's markers."""
        image_id = self.info.get("image_token_id")
        return {
            "model_path": self.model_id,
            "architecture": self.info["architecture"],
            "is_encoder_decoder": self.is_encoder_decoder,
            "decoder_start_token_id": self.info.get("decoder_start_token_id"),
            "image_token": (None if image_id is None
                            else self.tokenizer.convert_ids_to_tokens(image_id)),
            "chat_roles": role_markers(self.tokenizer),
        }

    def _images(self, per_prompt: list[list]) -> list[list[ImageFeatures]]:
        """Every prompt's images, decoded and preprocessed concurrently (all prompts at once)."""
        return self._sized_images(per_prompt)[0]

    def _check_image_counts(self, per_prompt: list[list]) -> None:
        """The images of a call's prompts (`per_prompt`) within the model's and the server's
        limits (none given: nothing to check)."""
        if not any(per_prompt):
            return
        if self.image_processor is None:
            raise ValueError("this model takes no images (image_data was given)")
        most = max(map(len, per_prompt))
        if most > self.limits.max_images:
            raise ValueError(f"{most} images in one prompt, over the limit of "
                             f"{self.limits.max_images} (max_images_per_request)")
        count = sum(map(len, per_prompt))  # per request, all prompts together
        if count > self.limits.max_images_total:
            raise ValueError(f"{count} images in one request (all its prompts), over the "
                             f"limit of {self.limits.max_images_total} (max_images_per_call)")

    def _sized_images(self, per_prompt: list[list], turn: MediaTurn | None = None
                      ) -> tuple[list[list[ImageFeatures]], list[tuple[int, int] | None]]:
        """`_images`, and each prompt's first image's (width, height) where a Florence-2
        answer may need it (None otherwise). `turn`: a part of a call queues its images after
        the part before it has queued its own (`MediaTurn`); it is marked queued whatever
        happens, so the next part never waits on a part that failed."""
        try:
            if not any(per_prompt):
                return [[] for _ in per_prompt], [None] * len(per_prompt)
            self._check_image_counts(per_prompt)
            flat = [(i, src) for sources in per_prompt for i, src in enumerate(sources)]
            if turn is not None:
                turn.wait()
            results = self._queue_images(flat)
        finally:
            if turn is not None:
                turn.queued()
        try:
            done = iter(results())
        finally:
            # a 40-megapixel image passes through a few hundred MB of buffers in its thread;
            # measured: 32 images of 6300x6300 on two threads left 1.2 GB resident, 0.5 after
            release_freed_memory()
        per = [[next(done) for _ in sources] for sources in per_prompt]
        return ([[f for f, _ in p] for p in per],
                [p[0][1] if p else None for p in per])

    def _queue_images(self, flat: list[tuple[int, Any]]) -> Callable[[], list]:
        """Queue each (index in its prompt, source) on the media threads or workers; a
        function that waits for their (features, size), in order. A bad image is named as
        `image i`, and what was queued after it is dropped."""
        if self.media_workers is not None:
            for i, src in flat:  # (what read_image would refuse, refused before it is sent)
                if not isinstance(src, (str, bytes, bytearray, Image.Image)):
                    raise ValueError(f"image {i}: unsupported image input of type "
                                     f"{type(src).__name__}")
            futures = [self.media_workers.submit(src) for _, src in flat]
        else:
            futures = [self.media_pool.submit(prepared, src, self.media_policy,
                                              self.image_processor, self.answers is not None)
                       for _, src in flat]

        def results() -> list:
            out = []
            try:
                for (i, _), future in zip(flat, futures):
                    try:
                        out.append(future.result())
                    except ValueError as e:
                        raise ValueError(f"image {i}: {e}") from None
            finally:
                for future in futures[len(out):]:
                    future.cancel()
            return out

        return results

    def check_text(self, text: str, name: str = "text") -> None:
        """A prompt's text before tokenizing: valid Unicode, and not so long that no number
        of tokens within the limit could hold it."""
        problem = invalid_text(text, name)
        if problem:
            raise ValueError(problem)
        limit, limit_name = self.prompt_token_limit()
        if len(text) > limit * self.max_token_chars:
            raise ValueError(f"the prompt is {len(text)} characters, more than {limit} tokens "
                             f"of at most {self.max_token_chars} characters can hold "
                             f"({limit_name})")

    def prompt_ids_many(self, texts: list[str]) -> list[list[int]]:
        """Each prompt's token ids as generate makes them from its text, in one tokenizer
        call where the model takes no images (a translation's many sentences)."""
        for i, t in enumerate(texts):
            problem = invalid_text(t, f"text[{i}]")
            if problem:
                raise ValueError(problem)
        if self.image_processor is not None or not texts:
            return [self._prompt_ids(t) for t in texts]
        return self.tokenizer(list(texts)).input_ids

    def _prompt_ids(self, text: str) -> list[int]:
        self.check_text(text)
        if self.info.get("image_prompt"):
            return image_prompts.task_prompt_ids(self.tokenizer, text, self.info)
        if self.image_processor is None:
            return self.tokenizer(text).input_ids
        # exactly as HF's Mllama processor: unless the prompt has a BOS token already, one is
        # inserted after any leading <|image|> tokens; then the tokenizer adds its own
        image = self.tokenizer.convert_ids_to_tokens(self.info["image_token_id"])
        bos = self.tokenizer.bos_token or ""
        if bos and bos not in text:
            leading = 0
            while text.startswith(image):
                text, leading = text[len(image):], leading + 1
            text = image * leading + bos + text
        return self.tokenizer(text).input_ids

    def prompt_token_limit(self) -> tuple[int, str]:
        if self.limits.max_prompt_tokens is not None:
            return self.limits.max_prompt_tokens, "max_prompt_tokens"
        if self.is_encoder_decoder:
            return self.info["max_encoder_len"], "max_encoder_len"
        return self.info["context_length"], "context_length"

    def source_token_limit(self, max_new_tokens: int) -> int:
        """The most tokens a prompt (an encoder-decoder model's encoder input) may have and
        still pass every check of a request generating `max_new_tokens` (a document's
        sentences are cut to fit it): this deployment's limit, the model's, the pools'."""
        limit, _ = self.prompt_token_limit()
        lim = self.model_limits
        if self.is_encoder_decoder:
            return min(limit, lim.max_encoder_len, lim.cross_capacity_tokens)
        return min(limit, min(lim.context_length, lim.kv_capacity_tokens) - max_new_tokens)

    def _token_ids(self, item: dict[str, Any],
                   forced: int = 0) -> tuple[list[int], list[int], int]:
        """(encoder ids, decoder prompt, its forced tokens: TokenizedRequest.decoder_forced).
        Without a decoder prompt, the model's forced_bos_token_id (if any) follows the start
        token, as HF's generate forces it."""
        if "text" in item:
            ids = self._prompt_ids(item["text"])
        else:
            ids = item["input_ids"]
        if not self.is_encoder_decoder:
            if item["decoder_input_ids"] is not None:
                raise ValueError("decoder_input_ids is only for encoder-decoder models")
            return [], ids, 0
        start = self.info["decoder_start_token_id"]
        if item["decoder_input_ids"] is None and self.whisper_prompt is not None:
            return ids, self._default_whisper_prompt(), 0
        dec = list(item["decoder_input_ids"] or [])
        if item["decoder_input_ids"] is None and self.info.get("forced_bos_token_id") is not None:
            dec, forced = [self.info["forced_bos_token_id"]], 1
        if not dec or (dec[0] != start and dec[0] != self._previous_text_token):
            dec = [start] + dec  # (Whisper's previous text comes before the start token)
        return ids, dec, forced

    def _check_embedding(self, obj: GenerateReqInput, items: list[dict[str, Any]]) -> None:
        """An embedding is a text encoder's output: refuse a model without one, and what only
        generation has (a ValueError naming it)."""
        if not self.is_encoder_decoder or self.info.get("has_audio"):
            raise ValueError(f"embeddings need a model with a text encoder; "
                             f"{self.info['architecture']} has none (T5, BART and the "
                             f"translation models have)")
        for name, on in (("stream", obj.stream), ("return_logprob", obj.return_logprob),
                         ("decoder_input_ids", any(i["decoder_input_ids"] for i in items)),
                         ("max_new_tokens other than 0", any(
                             _sets(i["sampling_params"], "max_new_tokens")
                             and SamplingParams.from_dict(i["sampling_params"]).max_new_tokens
                             for i in items))):
            if on:
                raise ValueError(f"{name} cannot be combined with an embedding request")

    def _default_whisper_prompt(self) -> list[int]:
        """A speech model's prompt when the caller gives none: an English-only model's
        (start, no timestamps), as HF's generate; a multilingual one's names a language."""
        try:
            return self.whisper_prompt.tokens()
        except ValueError as e:
            raise ValueError(f"give decoder_input_ids: WhisperPrompt.from_model(path).tokens("
                             f"language, task) ({e})") from None

    def _check_limits(self, sp: SamplingParams) -> None:
        lim = self.limits
        if lim.max_new_tokens is not None and sp.max_new_tokens > lim.max_new_tokens:
            raise ValueError(f"max_new_tokens (max_tokens) {sp.max_new_tokens} is over this "
                             f"server's limit of {lim.max_new_tokens} (max_new_tokens_limit)")
        if sp.n > lim.max_n:
            raise ValueError(f"n {sp.n} is over this server's limit of {lim.max_n} (max_n)")
        chars = sum(map(len, sp.stop))
        if chars > lim.max_stop_chars:
            raise ValueError(f"the stop strings have {chars} characters in all, over this "
                             f"server's limit of {lim.max_stop_chars} (max_stop_chars)")

    def _check_lengths(self, enc: list[int], dec: list[int], sp: SamplingParams,
                       image_tokens: int = 0) -> None:
        cap = self.limits.max_prompt_tokens
        prompt = len(enc) if enc else len(dec)
        if cap is not None and prompt > cap:
            raise ValueError(f"the prompt is {prompt} tokens, over this server's limit of "
                             f"{cap} (max_prompt_tokens)")
        self.model_limits.check(enc, dec, sp.max_new_tokens, image_tokens)

    def _encoder_key(self, ids: list[int]) -> str:
        h = hashlib.blake2b(digest_size=16)
        h.update(self.model_id.encode())
        h.update(b"\0tokens\0")
        h.update(",".join(map(str, ids)).encode())
        return h.hexdigest()

    async def generate(self, obj: GenerateReqInput) -> AsyncIterator[dict[str, Any]]:
        """Yield result dicts: for `stream`, one per new piece of any prompt (with "index");
        otherwise one final dict per prompt/sample, in order. Cancelling aborts them."""
        self._check_alive()
        await self.start()
        loop = asyncio.get_running_loop()
        # tokenizing (and decoding images) is CPU work: off the event loop, so that a huge
        # prompt does not stall other requests and /health
        _, items = await loop.run_in_executor(None, self._checked_items, obj)
        group = obj.group or uuid.uuid4().hex
        states: list[_ReqState] = []  # one per result (a beam request has k), prompt-major
        sent: list[TokenizedRequest] = []  # as sent (images by their PixelStore files)
        # every part's preprocessing is queued at once (the media threads never wait for a
        # part to be sent); each part goes as soon as it and the ones before it are ready
        slices = media_parts(items, obj.decoder_variants is None)
        parts = [loop.run_in_executor(None, self._tokenize_items, obj, items[part], group, turn)
                 for part, turn in zip(slices, MediaTurn.chain(len(slices)))]
        try:
            for part in parts:
                reqs, answers = await part
                self._register(states, reqs, answers, obj.show_replica)
                start = len(sent)
                for r in reqs:  # (in `sent` one by one: a failure releases what was stored)
                    sent.append(self._on_the_wire(r))
                wire = sent[start:]
                # one message (per replica) a part: the scheduler admits a call's requests
                # together (a select's choices share one extend forward); a call with images
                # or audio on many prompts is sent in parts as they are preprocessed, so
                # that the device works on the first while the host prepares the next
                self.link.send(wire)
            if obj.stream:
                async for chunk in self._stream(states, obj.return_logprob):
                    yield chunk
            else:
                for s in states:
                    yield await self._collect(s, obj.return_logprob)
        finally:
            for s in states:
                if not s.finished and self.dead_reason is None:
                    self.link.abort(s.rid)
                self.states.pop(s.rid, None)
            self.link.finished(sent)
            for r in sent:
                self._release(r)
            for part in parts:  # (those after a failed one: nothing of theirs was stored or
                part.add_done_callback(_retrieved)  # sent; their errors are dropped)

    def _register(self, states: list[_ReqState], reqs: list[TokenizedRequest],
                  answers: dict[str, TaskAnswer], show_replica: bool) -> None:
        """States for `reqs`' results, after the call's `states` so far (their index counts
        on), registered to receive outputs; a rid already running is refused."""
        rids = [rid for r in reqs for rid in r.result_rids]
        if len(set(rids)) != len(rids) or any(rid in self.states for rid in rids):
            raise ValueError("rid must be unique among running requests")
        new = [_ReqState(rid=rid, index=len(states) + i, show_replica=show_replica,
                         answer=answers.get(rid)) for i, rid in enumerate(rids)]
        for s, r in zip(new, reqs):  # (scoring refuses beams: one result per request)
            if r.logprob_start_len is not None:
                s.scored_ids = r.decoder_input_ids[r.logprob_start_len:]
        for s in new:
            self.states[s.rid] = s
        states += new

    def _on_the_wire(self, r: TokenizedRequest) -> TokenizedRequest:
        """The request as sent: every image's pixels and audio window's samples in the
        PixelStore (written once per input, pinned until the request ends), the request
        carrying only the files' names. Where the store has no room, the data travels in the
        request itself (slower, never refused for it)."""
        if not r.encoder_inputs or self.pixel_store is None:
            return r
        stored = []
        try:
            for p in r.encoder_inputs:
                stored.append(p.stored(self.pixel_store.put(p.key, p.host_data)))
        except OSError as e:  # no room: nothing of this request stays pinned
            for p in stored:
                self.pixel_store.release(p.key)
            logger.warning("the media store has no room (%s): request %s sends its encoder "
                           "inputs inline", e, r.rid)
            return r
        return dataclasses.replace(r, encoder_inputs=stored)

    def _release(self, r: TokenizedRequest) -> None:
        if self.pixel_store is None:
            return
        for p in r.encoder_inputs:
            if p.host_data is None:  # (sent inline where the store had no room)
                self.pixel_store.release(p.key)

    async def _next(self, s: _ReqState) -> TokenOutput:
        """The request's next piece: every output that has come for it since the last one,
        merged. Under load the event loop falls behind the scheduler, and a stream then
        gets several steps' tokens in one event (one JSON body, one pass through the ASGI
        stack) instead of one event per token; a token is never held back for this."""
        out = self._take(s, s.held if s.held is not None else await s.queue.get())
        s.held = None
        if out.finished_reason is not None or s.queue.empty():
            return out
        pieces = [out]
        while out.finished_reason is None and not s.queue.empty():
            nxt = s.queue.get_nowait()
            if isinstance(nxt, EngineDeadError) or nxt.error is not None:
                s.held = nxt  # raised by the next call, after what came before it
                break
            out = self._take(s, nxt)
            pieces.append(out)
        return _merged(pieces) if len(pieces) > 1 else out

    def _take(self, s: _ReqState, out: TokenOutput | EngineDeadError) -> TokenOutput:
        if isinstance(out, EngineDeadError):
            raise out
        if out.error is not None:
            s.finished = True
            raise ValueError(out.error)
        if s.answer is not None:  # a Florence-2 task's: decoded here, its tokens kept
            a, reason = s.answer, out.finished_reason
            matched = (reason or {}).get("matched")
            out = dataclasses.replace(out, text=a.add(out.new_token_ids, reason is not None,
                                                      matched if isinstance(matched, str)
                                                      else None))
            if reason is not None:
                s.parsed = self.answers.parse(s.text + out.text, a.task, a.image_size)
        s.text += out.text
        s.output_ids += out.new_token_ids
        if out.new_token_ids:
            self._observe(s, out)
        if out.new_logprobs:
            s.logprobs += out.new_logprobs
        if out.new_top_logprobs:
            s.top_logprobs += out.new_top_logprobs
        if out.input_logprobs is not None:
            s.input_logprobs = out.input_logprobs
        s.finished = out.finished_reason is not None
        return out

    def _observe(self, s: _ReqState, out: TokenOutput) -> None:
        now = time.monotonic()
        m = self.metrics
        n = len(out.new_token_ids)
        bulk = n > 1 and "decode_seconds" in out.extra  # a whole non-streamed answer at once
        if s.first_token is None:
            s.first_token = now
            if bulk:  # when the first token really came: the scheduler timed the rest
                s.first_token = now - out.extra["decode_seconds"]
            if m is not None:
                m.on_first_token(s.first_token - s.created)
        if m is not None:
            gap = out.extra["decode_seconds"] if bulk else now - (s.last_token or now)
            m.on_tokens(n - 1 if bulk else n, gap)
            if out.finished_reason is not None:
                m.on_finish(out.prompt_tokens, now - s.created)
        s.last_token = now

    async def _collect(self, s: _ReqState, logprob: bool) -> dict[str, Any]:
        while True:
            out = await self._next(s)
            if s.finished:
                result = {"text": s.text, "output_ids": list(s.output_ids),
                          "meta_info": self._meta(s, out, logprob)}
                if s.parsed is not None:
                    result["parsed"] = s.parsed
                return result

    async def _stream(self, states: list[_ReqState], logprob: bool):
        if len(states) == 1:  # the common case: no task per piece
            s = states[0]
            while not s.finished:
                yield self._chunk(s, await self._next(s), logprob)
            return
        pending = {asyncio.ensure_future(self._next(s)): s for s in states}
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    s = pending.pop(fut)
                    yield self._chunk(s, fut.result(), logprob)
                    if not s.finished:
                        pending[asyncio.ensure_future(self._next(s))] = s
        finally:
            for fut in pending:
                fut.cancel()

    def _chunk(self, s: _ReqState, out: TokenOutput, logprob: bool) -> dict[str, Any]:
        chunk = {"index": s.index, "text": out.text, "output_ids": list(out.new_token_ids),
                 "meta_info": self._meta(s, out, logprob)}
        if logprob:
            chunk["logprobs"] = out.new_logprobs or []
            chunk["top_logprobs"] = out.new_top_logprobs or []
        if s.parsed is not None and out.finished_reason is not None:
            chunk["parsed"] = s.parsed  # the whole answer's, on its last piece
        return chunk

    def _meta(self, s: _ReqState, out: TokenOutput, logprob: bool) -> dict[str, Any]:
        meta = {
            "id": client_rid(s.rid),
            "prompt_tokens": out.prompt_tokens,
            "completion_tokens": out.completion_tokens,
            "finish_reason": out.finished_reason,
            "cached_tokens": out.cached_tokens,
            "encoder_cache_hit": out.encoder_cache_hit,
            "e2e_latency": time.monotonic() - s.created,
        }
        if out.cache_hits is not None:  # shared isolation: public and private hits
            meta["cache_hits"] = out.cache_hits
        if s.first_token is not None:
            meta["ttft"] = s.first_token - s.created
        if self.link.router is not None and s.show_replica:  # data parallelism: where it ran
            meta["replica"] = self.link.replica_of.get(s.rid)
        meta.update(out.extra)  # the scheduler's timings, at the end
        if logprob and s.finished:
            meta["output_token_logprobs"] = list(zip(s.logprobs, s.output_ids))
            meta["output_top_logprobs"] = list(s.top_logprobs)
            if s.scored_ids is not None and s.input_logprobs is not None:
                meta["input_token_logprobs"] = list(zip(s.input_logprobs, s.scored_ids))
        return meta

    async def abort(self, rid: str, user: str | None = None) -> None:
        """Abort `user`'s request `rid` (nothing happens when that user has none). With
        several HTTP processes the request may run in another one: the abort goes to each
        process's key of it (the scheduler ignores keys it does not hold)."""
        await self.start()
        if self.server is None:
            self.link.abort(scoped_rid(user, rid))
            return
        for server in range(self.servers):
            self.link.abort(scoped_rid(user, rid, server))

    async def control(self, kind: str, timeout: float = 60.0) -> ControlReply:
        """Ask the scheduler; with data parallelism every replica, their replies merged (with
        "replicas": each one's, and for stats "router": the router's counts)."""
        self._check_alive()
        await self.start()
        replies = await asyncio.gather(*(self._control_one(kind, i, timeout)
                                         for i in range(self.link.replicas)))
        if self.link.router is None:
            return replies[0]
        merged = merge_replies(kind, replies[0].tag, list(replies))
        if kind == "stats":
            merged.payload["router"] = self.link.router.stats()
        return merged

    async def _control_one(self, kind: str, replica: int, timeout: float) -> ControlReply:
        tag = server_tag(uuid.uuid4().hex, self.server)
        fut = asyncio.get_running_loop().create_future()
        self.control_waiters[tag] = fut
        self.link.control(replica, ControlRequest(kind, tag))
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self.control_waiters.pop(tag, None)

    async def close(self) -> None:
        if self.media_workers is not None:
            self.media_workers.close()
        if self.pixel_store is not None:
            self.pixel_store.close()
        if self._started:
            self._loop_task.cancel()
            self.link.close()
            self.recv_from_detokenizer.close()

    # --- the receive loop --------------------------------------------------------------------
    async def _handle_loop(self) -> None:
        """Hand each output to its request's queue. Every message already waiting is taken
        before the streams run (up to `_DRAIN` of them): when the loop has fallen behind the
        scheduler, a stream then finds several steps' tokens and sends them as one event
        (`_next`), so the cost per token falls as the load rises instead of the backlog
        growing; when it keeps up, each message is handed out as it comes."""
        sock = self.recv_from_detokenizer
        # a blocking view of the same socket: its non-blocking receive returns at once (the
        # asyncio socket's would resolve a future on the loop's next turn, after the streams)
        waiting = zmq.Socket.shadow(sock.underlying)
        while True:
            self._dispatch(await sock.recv_pyobj())
            for _ in range(_DRAIN):
                try:
                    msg = waiting.recv_pyobj(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._dispatch(msg)

    def _dispatch(self, msg) -> None:
        if isinstance(msg, BatchTokenOutput):
            for out in msg.outputs:
                s = self.states.get(out.rid)
                if s is not None:
                    s.queue.put_nowait(out)
        elif isinstance(msg, ControlReply):
            fut = self.control_waiters.get(msg.tag)
            if fut is not None and not fut.done():
                fut.set_result(msg)

    def mark_dead(self, reason: str) -> None:
        """Called when a child process died: fail every waiting caller now."""
        if self.dead_reason is not None:
            return
        self.dead_reason = reason
        for s in self.states.values():
            s.queue.put_nowait(EngineDeadError(reason))
        for fut in self.control_waiters.values():
            if not fut.done():
                fut.set_exception(EngineDeadError(reason))

    def _check_alive(self) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        if self.draining:
            raise EngineDeadError("the server is shutting down")


def _retrieved(future: asyncio.Future) -> None:
    """Mark a future's error as seen (a part nobody waits for any more)."""
    if not future.cancelled():
        future.exception()


MEDIA_PART = 16  # prompts with images or audio a part of a call (`media_parts`)


def media_parts(items: list[dict[str, Any]], may_split: bool = True) -> list[slice]:
    """A call's prompts in the parts it is tokenized and sent in: one part, unless more than
    MEDIA_PART prompts carry images or audio (`may_split`: the call allows it). Preprocessing
    an image takes milliseconds of host (a 768x768 image for Florence-2: ~20 ms of one core
    with HF's PIL processor); sent in parts, a call of hundreds of images keeps the device
    busy with the first while the host prepares the rest, instead of idle until all are
    ready."""
    if (not may_split or len(items) <= MEDIA_PART
            or not any(item.get("image_data") or item.get("audio_data") for item in items)):
        return [slice(None)]
    return [slice(i, i + MEDIA_PART) for i in range(0, len(items), MEDIA_PART)]


def _check_beams(sp: SamplingParams, obj: GenerateReqInput) -> None:
    if not sp.is_beam:
        return
    for name, on in (("stream", obj.stream), ("return_logprob", obj.return_logprob)):
        if on:
            raise ValueError(f"{name} cannot be combined with num_beams > 1: a beam search "
                             f"result is known only when it ends")


def _merged(pieces: list[TokenOutput]) -> TokenOutput:
    """Consecutive outputs of one request as one: the last one's counts and finish, every
    piece's tokens, text and log-probs (the first-output-only fields kept from the piece that
    had them). Built once for the lot: a stream behind by a dozen steps merges a dozen."""
    def joined(name: str):
        values = [getattr(p, name) for p in pieces]
        if all(v is None for v in values):
            return None
        return [x for v in values if v for x in v]

    last = pieces[-1]
    return dataclasses.replace(
        last, new_token_ids=[t for p in pieces for t in p.new_token_ids],
        text="".join(p.text for p in pieces),
        new_logprobs=joined("new_logprobs"), new_top_logprobs=joined("new_top_logprobs"),
        input_logprobs=next((p.input_logprobs for p in reversed(pieces)
                             if p.input_logprobs is not None), None),
        detokenize=next((p.detokenize for p in reversed(pieces) if p.detokenize), None))


def _sets(params: Any, name: str) -> bool:
    """Whether a prompt's sampling params set `name` (a SamplingParams object sets all)."""
    return params is not None and (not isinstance(params, dict) or name in params)
