"""The HTTP API's handlers: OpenAI-compatible completions and chat, SGLang's /generate, and
/v1/translations. Each turns its body into a GenerateReqInput for the TokenizerManager and
shapes the results (whole, or as server-sent events ending with `data: [DONE]`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from seq2serve.runtime.frontend.document_translation import document_job
from seq2serve.runtime.frontend.florence_chat import ChatTaskError, task_request
from seq2serve.runtime.frontend.generate_request import GenerateReqInput
from seq2serve.runtime.frontend.glossary import Glossary, request_glossary
from seq2serve.runtime.frontend.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    TranslationRequest,
)
from seq2serve.runtime.frontend.prompts import chat_prompt
from seq2serve.runtime.frontend.refused_fields import first_refusal
from seq2serve.runtime.frontend.response_format import (
    GrammarFieldError,
    grammar_fields,
    is_grammar_error,
)
from seq2serve.runtime.frontend.tokenizer_manager import EngineDeadError, TokenizerManager
from seq2serve.runtime.frontend.tool_calls import ToolCallStream, message_of
from seq2serve.runtime.frontend.tool_use import ToolRequestError, ToolUse, tool_use
from seq2serve.runtime.frontend.translation import default_num_beams, with_beams
from seq2serve.runtime.frontend.translation_options import TranslationOptions

_DISCONNECT_POLL_S = 0.2


class RequestError(ValueError):
    """Bad input: answered with this HTTP status and an OpenAI-style error body."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.kind = status, param, kind


class ClientDisconnected(Exception):
    pass


def error_body(message: str, kind: str = "invalid_request_error",
               param: str | None = None, code: Any = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# one encoder for every event (json.dumps builds a new one per call when given options)
_to_json = json.JSONEncoder(ensure_ascii=False).encode


def _sse(obj: Any) -> str:
    return f"data: {_to_json(obj)}\n\n"


def sse_response(events: AsyncIterator[str]) -> StreamingResponse:
    """A stream of server-sent events that, if the request fails after the 200 was sent (the
    scheduler died, the request was refused late), ends with an OpenAI-style error event and
    `data: [DONE]` instead of a silently closed connection."""
    async def guarded():
        try:
            async for event in events:
                yield event
        except EngineDeadError as e:
            yield _sse(error_body(str(e), kind="service_unavailable", code=503))
            yield "data: [DONE]\n\n"
        except ValueError as e:
            yield _sse(error_body(str(e), code=400))
            yield "data: [DONE]\n\n"

    return StreamingResponse(guarded(), media_type="text/event-stream")


def text_or_ids(value: Any, param: str) -> tuple[Any, Any]:
    """An OpenAI `prompt` / `input` (a string, strings, token ids or lists of them) as
    GenerateReqInput's (text, input_ids); an empty list is a 400 naming `param`."""
    if isinstance(value, list) and not value:
        raise RequestError(f"{param} is an empty list", param=param)
    is_ids = isinstance(value, list) and isinstance(value[0], (int, list))
    return (None, value) if is_ids else (value, None)


def _finish(reason: dict | None) -> str | None:
    if reason is None:
        return None
    return "length" if reason["type"] == "length" else "stop"


class OpenAIServing:
    def __init__(self, tm: TokenizerManager, model_name: str, model_path: str) -> None:
        self.tm = tm
        self.model_name = model_name
        self.model_path = model_path
        self.translation_beams = default_num_beams(model_path)
        self.glossaries: dict[str, Glossary] = {}  # --glossary, loaded by create_app

    # --- shared ------------------------------------------------------------------------------
    def check_model(self, model: str | None) -> None:
        if model is not None and model not in (self.model_name, self.model_path):
            raise RequestError(f"model {model!r} not found; this server serves "
                               f"{self.model_name!r}", status=404, param="model",
                               kind="not_found_error")

    @staticmethod
    def sampling(body, max_tokens: int | None) -> dict[str, Any]:
        """OpenAI names -> SGLang sampling parameters (None means: the default)."""
        fields = {
            "max_new_tokens": max_tokens,
            "min_new_tokens": body.min_tokens,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "top_k": body.top_k,
            "min_p": body.min_p,
            "repetition_penalty": body.repetition_penalty,
            "frequency_penalty": body.frequency_penalty,
            "presence_penalty": body.presence_penalty,
            "stop": body.stop,
            "stop_token_ids": body.stop_token_ids,
            "ignore_eos": body.ignore_eos,
            "skip_special_tokens": body.skip_special_tokens,
            "n": body.n,
            "seed": body.seed,
            "num_beams": body.num_beams,
            "num_return_sequences": body.num_return_sequences,
            "length_penalty": body.length_penalty,
            "early_stopping": body.early_stopping,
            "no_repeat_ngram_size": body.no_repeat_ngram_size,
        }
        return {k: v for k, v in fields.items() if v is not None}

    @staticmethod
    def grammar(body) -> tuple[dict[str, str], str | None]:
        """The request's grammar as a sampling parameter, and the field it came from."""
        try:
            return grammar_fields(body)
        except GrammarFieldError as e:
            raise RequestError(str(e), param=e.param) from None

    @staticmethod
    @contextlib.contextmanager
    def grammar_errors(param: str | None) -> Iterator[None]:
        """The scheduler's refusal of a grammar as a 400 naming the field it came from."""
        try:
            yield
        except ValueError as e:
            if param is None or isinstance(e, RequestError) or not is_grammar_error(e):
                raise
            raise RequestError(str(e), param=param) from None

    @staticmethod
    def check_beams(body, logprobs: bool) -> None:
        """Refuse what a beam search cannot give, naming the OpenAI field."""
        if (body.num_beams or 1) > 1:
            for name, on in (("stream", body.stream), ("logprobs", logprobs)):
                if on:
                    raise RequestError(f"{name} cannot be combined with num_beams > 1: a beam "
                                       f"search result is known only when it ends", param=name)

    @staticmethod
    def results_per_prompt(body) -> int:
        return body.n * (body.num_return_sequences or 1)

    @staticmethod
    def refuse(body, endpoint: str) -> None:
        """A 400 naming the first field of `body` that asks for what this server does not
        implement (the bodies' `REFUSED` tables)."""
        found = first_refusal(body)
        if found is not None:
            param, why = found
            raise RequestError(f"{param} is not supported by {endpoint}: {why}", param=param)

    async def collect(self, obj: GenerateReqInput, request: Request) -> list[dict[str, Any]]:
        """All results of `obj`, aborting them if the client goes away meanwhile."""
        async def run() -> list[dict[str, Any]]:
            return [r async for r in self.tm.generate(obj)]

        task = asyncio.ensure_future(run())
        while True:
            done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()  # the generator's cleanup aborts the requests
                await asyncio.gather(task, return_exceptions=True)
                raise ClientDisconnected()

    async def _first(self, agen: AsyncIterator) -> tuple[Any, AsyncIterator]:
        """Start a stream so that bad input fails before the 200 status is sent."""
        try:
            first = await agen.__anext__()
        except StopAsyncIteration:
            first = None
        return first, agen

    def _token_text(self, token_id: int) -> str:
        return self.tm.tokenizer.decode([token_id])

    def _usage(self, results: list[dict[str, Any]], n: int) -> dict[str, int]:
        prompt = sum(r["meta_info"]["prompt_tokens"] for r in results[::n])
        completion = sum(r["meta_info"]["completion_tokens"] for r in results)
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}

    # --- /v1/completions ---------------------------------------------------------------------
    async def completions(self, body: CompletionRequest, request: Request):
        self.check_model(body.model)
        self.refuse(body, "/v1/completions")
        text, input_ids = text_or_ids(body.prompt, "prompt")
        logprobs = body.logprobs is not None
        self.check_beams(body, logprobs)
        grammar, grammar_param = self.grammar(body)
        obj = GenerateReqInput(
            text=text, input_ids=input_ids,
            sampling_params={**self.sampling(body, body.max_tokens), **grammar},
            stream=body.stream, return_logprob=logprobs, top_logprobs_num=body.logprobs or 0,
            user=body.user)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            with self.grammar_errors(grammar_param):
                return await self._stream_completions(obj, body, rid, created, logprobs)
        with self.grammar_errors(grammar_param):
            results = await self.collect(obj, request)
        choices = [{"index": i, "text": r["text"],
                    "logprobs": self._completion_logprobs(r) if logprobs else None,
                    "finish_reason": _finish(r["meta_info"]["finish_reason"])}
                   for i, r in enumerate(results)]
        return {"id": rid, "object": "text_completion", "created": created,
                "model": self.model_name, "choices": choices,
                "usage": self._usage(results, self.results_per_prompt(body))}

    def _completion_logprobs(self, r: dict[str, Any]) -> dict[str, Any]:
        pairs = r["meta_info"].get("output_token_logprobs", [])
        tops = r["meta_info"].get("output_top_logprobs", [])
        tokens = [self._token_text(t) for _, t in pairs]
        offsets, pos = [], 0
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        return {"tokens": tokens, "token_logprobs": [lp for lp, _ in pairs],
                "top_logprobs": [{self._token_text(t): lp for t, lp in top} for top in tops]
                if tops else None,
                "text_offset": offsets}

    async def _stream_completions(self, obj, body, rid, created, logprobs):
        first, agen = await self._first(self.tm.generate(obj))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        async def events():
            usage = {"prompt_tokens": 0, "completion_tokens": 0}
            chunk = first
            while chunk is not None:
                choice = {"index": chunk["index"], "text": chunk["text"], "logprobs": None,
                          "finish_reason": _finish(chunk["meta_info"]["finish_reason"])}
                if logprobs:
                    ids = chunk["output_ids"]
                    choice["logprobs"] = {
                        "tokens": [self._token_text(t) for t in ids],
                        "token_logprobs": chunk.get("logprobs", []),
                        "top_logprobs": [{self._token_text(t): lp for t, lp in top}
                                         for top in chunk.get("top_logprobs", [])] or None}
                yield _sse({"id": rid, "object": "text_completion", "created": created,
                            "model": self.model_name, "choices": [choice]})
                if chunk["meta_info"]["finish_reason"] is not None:
                    self._count_usage(usage, chunk, body.n)
                chunk = await anext(agen, None)
            if include_usage:
                usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
                yield _sse({"id": rid, "object": "text_completion", "created": created,
                            "model": self.model_name, "choices": [], "usage": usage})
            yield "data: [DONE]\n\n"

        return sse_response(events())

    @staticmethod
    def _count_usage(usage: dict[str, int], chunk: dict[str, Any], n: int) -> None:
        meta = chunk["meta_info"]
        usage["completion_tokens"] += meta["completion_tokens"]
        if chunk["index"] % n == 0:
            usage["prompt_tokens"] += meta["prompt_tokens"]

    # --- /v1/chat/completions ----------------------------------------------------------------
    async def chat(self, body: ChatCompletionRequest, request: Request):
        self.check_model(body.model)
        self.refuse(body, "/v1/chat/completions")
        if body.top_logprobs and not body.logprobs:
            raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs")
        self.check_beams(body, body.logprobs)

        def render() -> tuple[ToolUse, dict[str, Any]]:  # templates, maybe tokenizing
            tools = tool_use(body, self.tm.tokenizer, self.tm.info["architecture"])
            if self.tm.info.get("image_prompt"):  # Florence-2: a task about an image
                return tools, task_request(tools.messages, self.tm.info)
            return tools, chat_prompt(self.tm.tokenizer, tools.messages, tools.tools)

        try:
            tools, prompt = await asyncio.get_running_loop().run_in_executor(None, render)
        except (ToolRequestError, ChatTaskError) as e:
            raise RequestError(str(e), param=e.param) from None
        max_tokens = body.max_completion_tokens or body.max_tokens
        grammar, grammar_param = self.grammar(body)
        if tools.forced_schema is not None:  # tool_choice required or named: a forced call
            if grammar:
                raise RequestError(f"tool_choice {body.tool_choice!r} forces a call, which "
                                   f"cannot be combined with {grammar_param}",
                                   param="tool_choice")
            grammar, grammar_param = {"json_schema": tools.forced_schema}, "tool_choice"
        obj = GenerateReqInput(text=prompt.get("text"), input_ids=prompt.get("input_ids"),
                               image_data=prompt.get("image_data") or None,
                               sampling_params={**self.sampling(body, max_tokens), **grammar},
                               stream=body.stream, return_logprob=body.logprobs,
                               top_logprobs_num=body.top_logprobs or 0, user=body.user)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            with self.grammar_errors(grammar_param):
                return await self._stream_chat(obj, body, rid, created, tools)
        with self.grammar_errors(grammar_param):
            results = await self.collect(obj, request)
        outs = [tools.read(r["text"], _finish(r["meta_info"]["finish_reason"])) for r in results]
        choices = [{"index": i, "message": _with_task_answer(message_of(out), r),
                    "logprobs": {"content": self._chat_logprobs(
                        r["meta_info"].get("output_token_logprobs", []),
                        r["meta_info"].get("output_top_logprobs", []))}
                    if body.logprobs else None,
                    "finish_reason": out.finish_reason}
                   for i, (r, out) in enumerate(zip(results, outs))]
        return {"id": rid, "object": "chat.completion", "created": created,
                "model": self.model_name, "choices": choices,
                "usage": self._usage(results, self.results_per_prompt(body))}

    def _chat_logprobs(self, pairs, tops) -> list[dict[str, Any]]:
        def entry(token_id: int, lp: float) -> dict[str, Any]:
            text = self._token_text(token_id)
            return {"token": text, "logprob": lp, "bytes": list(text.encode())}

        out = []
        for i, (lp, t) in enumerate(pairs):
            e = entry(t, lp)
            e["top_logprobs"] = [entry(tt, tlp) for tt, tlp in tops[i]] if i < len(tops) else []
            out.append(e)
        return out

    async def _stream_chat(self, obj, body, rid, created, tools: ToolUse):
        first, agen = await self._first(self.tm.generate(obj))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        def chunk_of(choices):
            return {"id": rid, "object": "chat.completion.chunk", "created": created,
                    "model": self.model_name, "choices": choices}

        async def events():
            for i in range(body.n):
                opening = {"role": "assistant", "content": None if tools.reads_calls else ""}
                yield _sse(chunk_of([{"index": i, "delta": opening,
                                      "logprobs": None, "finish_reason": None}]))
            usage = {"prompt_tokens": 0, "completion_tokens": 0}
            calls: dict[int, ToolCallStream | None] = {}  # per choice, when tools are read
            chunk = first
            while chunk is not None:
                finish = _finish(chunk["meta_info"]["finish_reason"])
                choice = {"index": chunk["index"],
                          "delta": _with_task_answer({"content": chunk["text"]}, chunk),
                          "logprobs": None, "finish_reason": finish}
                if body.logprobs:
                    pairs = list(zip(chunk.get("logprobs", []), chunk["output_ids"]))
                    choice["logprobs"] = {"content": self._chat_logprobs(
                        pairs, chunk.get("top_logprobs", []))}
                if chunk["index"] not in calls:  # once per choice, not per chunk
                    calls[chunk["index"]] = tools.stream()
                stream = calls[chunk["index"]]
                for sent in stream.feed(choice) if stream else [choice]:
                    yield _sse(chunk_of([sent]))
                if finish is not None:
                    self._count_usage(usage, chunk, body.n)
                chunk = await anext(agen, None)
            if include_usage:
                usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
                yield _sse({**chunk_of([]), "usage": usage})
            yield "data: [DONE]\n\n"

        return sse_response(events())

    # --- /generate (SGLang native) -----------------------------------------------------------
    async def generate(self, body: GenerateRequest, request: Request,
                       show_replica: bool = False):
        obj = GenerateReqInput(**body.model_dump(), show_replica=show_replica)
        if not body.stream:
            results = await self.collect(obj, request)
            single = isinstance(body.text, str) or (
                body.input_ids is not None and body.input_ids
                and isinstance(body.input_ids[0], int))
            # one prompt with one result (not n samples or k beam results): a dict
            return results[0] if single and len(results) == 1 else results
        first, agen = await self._first(self.tm.generate(obj))

        async def events():
            # SGLang's convention: each event carries the text and ids so far
            texts: dict[int, str] = {}
            ids: dict[int, list[int]] = {}
            chunk = first
            while chunk is not None:
                i = chunk["index"]
                texts[i] = texts.get(i, "") + chunk["text"]
                ids[i] = ids.get(i, []) + chunk["output_ids"]
                event = {"index": i, "text": texts[i], "output_ids": ids[i],
                         "meta_info": chunk["meta_info"]}
                if "parsed" in chunk:  # a Florence-2 task's answer, on its last event
                    event["parsed"] = chunk["parsed"]
                yield _sse(event)
                chunk = await anext(agen, None)
            yield "data: [DONE]\n\n"

        return sse_response(events())

    # --- /v1/translations --------------------------------------------------------------------
    async def translations(self, body: TranslationRequest, request: Request):
        """Each input is a document (`format`: text, markdown, html): its pieces, those of every
        document together, go as one batch; the results are put back into the documents
        (`document_translation.py`). `usage` counts the pieces sent (a repeated one once).
        `alternatives`, `target_prefix` and `return_scores`: `translation_options.py`."""
        self.check_model(body.model)
        texts = body.input if isinstance(body.input, list) else [body.input]
        if not texts:
            raise RequestError("input is an empty list", param="input")
        for i, t in enumerate(texts):
            if not t:
                raise RequestError(f"input[{i}] is empty", param="input")
        self.refuse(body, "/v1/translations")
        sp = {k: v for k, v in (("max_new_tokens", body.max_tokens),
                                ("temperature", body.temperature),
                                ("top_p", body.top_p), ("seed", body.seed), ("stop", body.stop),
                                ("num_beams", body.num_beams),
                                ("length_penalty", body.length_penalty),
                                ("no_repeat_ngram_size", body.no_repeat_ngram_size))
              if v is not None}
        sp.setdefault("temperature", 0.0)  # translation wants the most likely output
        sp = with_beams(sp, body.beam_size, self.translation_beams, body.stream)
        options = TranslationOptions(body.alternatives, body.target_prefix, body.return_scores)
        try:
            glossary = request_glossary(body.glossary, self.glossaries)
            # segments and tokenizes each document: off the event loop
            job = await asyncio.get_running_loop().run_in_executor(
                None, lambda: document_job(self.tm, self.model_path, body.input, body.format,
                                           body.source_lang, body.target_lang, sp,
                                           body.stream, body.user, options, glossary))
        except ValueError as e:
            raise RequestError(str(e), param=_translation_param(str(e))) from None
        rid, created = f"trans-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            chunks = None
            if job.request is not None:
                first, agen = await self._first(self.tm.generate(job.request))
                chunks = _chained(first, agen)

            async def events():
                async for e in job.stream(chunks):
                    meta = e["meta_info"]
                    data = {"index": e["index"], "delta": e["text"],
                            "finish_reason": _finish(meta["finish_reason"])}
                    if "score" in meta:  # return_scores: with a document's last event
                        data["score"] = meta["score"]
                    if "detected_language" in e:  # source_lang auto: a document's first event
                        data["detected_language"] = e["detected_language"]
                    yield _sse({"id": rid, "object": "translation.chunk", "created": created,
                                "model": self.model_name, "data": [data]})
                yield "data: [DONE]\n\n"

            return sse_response(events())
        results = [] if job.request is None else await self.collect(job.request, request)
        results = await job.enforce(results, lambda obj: self.collect(obj, request))
        return {"id": rid, "object": "translation", "created": created, "model": self.model_name,
                "data": [_translation_data(i, r, body) for i, r in enumerate(job.results(results))],
                "usage": self._usage(results, body.alternatives or 1)}


def _with_task_answer(message: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """A chat message (or a stream's last delta) with a Florence-2 task's parsed answer as
    `task_answer` (what /generate calls `parsed`; not `parsed`, which the openai client's
    `chat.completions.parse` fills with its structured output)."""
    if "parsed" in result:
        message["task_answer"] = result["parsed"]
    return message


def _translation_data(index: int, result: dict[str, Any], body: TranslationRequest
                      ) -> dict[str, Any]:
    data = {"index": index, "translation": result["text"],
            "finish_reason": _finish(result["meta_info"]["finish_reason"])}
    if body.return_scores:
        data["score"] = result["score"]
    if body.alternatives is not None:
        data["alternatives"] = [{"translation": a["text"], "score": a["score"]}
                                for a in result["alternatives"]]
    if "detected_language" in result:  # source_lang auto
        data["detected_language"] = result["detected_language"]
    return data


def _translation_param(message: str) -> str:
    """The field a translation's ValueError is about (its message starts with it: a whole
    word, so that "num_return_sequences ..." is not about "n")."""
    for name in ("source_lang", "target_lang", "format", "n", "num_return_sequences",
                 "alternatives", "target_prefix", "return_scores", "glossary"):
        if re.match(rf"{name}\b", message):
            return name
    return "input"


async def _chained(first: Any, rest: AsyncIterator) -> AsyncIterator:
    """`first` (None: nothing), then the rest; closing this closes the rest (which aborts
    its requests)."""
    try:
        if first is not None:
            yield first
            async for item in rest:
                yield item
    finally:
        await rest.aclose()


def json_error(status: int, message: str, kind: str = "invalid_request_error",
               param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, kind, param, code=status), status_code=status)
