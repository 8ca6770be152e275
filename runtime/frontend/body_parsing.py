"""Large JSON bodies are parsed and validated in worker processes, not on the event loop.

json.loads and pydantic's validation are single C calls that hold the GIL from start to end:
a thread would not help. Issue 39 measured 2.3 s of a stalled /health for a 1.5M-entry
`logit_bias`, 2.2 s for 300,000 chat messages, 4.8 s for 1M `input_ids` lists. A body over
`INLINE_BYTES` goes to a worker process, which validates it and checks its sizes against the
per-request limits (`BodySizes`), and sends back the model, or a small error. Bodies under the
bound are validated inline by FastAPI as before (a few milliseconds at most)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
import typing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from seq2serve.runtime.frontend.openai_serving import RequestError

INLINE_BYTES = 64 << 10  # bodies up to this are validated on the event loop
# fields that hold one entry per prompt (or message) when they are lists of lists/strings
_ID_FIELDS = ("input_ids", "decoder_input_ids", "prompt", "stop_token_ids")


@dataclass(frozen=True)
class BodySizes:
    """What a worker refuses before the body reaches the event loop: a list or mapping field
    with more entries than `max_entries` (max_batch_inputs), a list of token ids longer than
    `max_ids` (the prompt token limit)."""

    max_entries: int
    max_ids: int


def check_sizes(body: BaseModel, sizes: BodySizes) -> None:
    for name, value in body:
        if not isinstance(value, (list, dict)) or not value:
            continue
        flat_ids = name in _ID_FIELDS and isinstance(value, list) and isinstance(value[0], int)
        limit, limit_name = ((sizes.max_ids, "the prompt token limit") if flat_ids
                             else (sizes.max_entries, "max_batch_inputs"))
        if len(value) > limit:
            raise RequestError(f"{name} has {len(value)} entries, over this server's limit of "
                               f"{limit} ({limit_name})", param=name)


def _validate(model: type[BaseModel], raw: bytes, sizes: BodySizes) -> tuple[str, Any]:
    """In a worker: ("ok", model), ("invalid", pydantic's errors) or ("refused", (message,
    param))."""
    try:
        body = model.model_validate_json(raw)
    except ValidationError as e:
        errors = [{**err, "loc": ("body", *err["loc"]),
                   "ctx": {k: str(v) for k, v in (err.get("ctx") or {}).items()}}
                  for err in e.errors(include_url=False)[:5]]
        return "invalid", errors
    try:
        check_sizes(body, sizes)
    except RequestError as e:
        return "refused", (str(e), e.param)
    return "ok", body


def _exit_with_parent(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


class BodyParser:
    """The worker processes (forked at start, before the event loop and ZMQ exist)."""

    def __init__(self, sizes: BodySizes, workers: int = 2) -> None:
        self.sizes = sizes
        self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                        initializer=_exit_with_parent,
                                        initargs=(os.getpid(),))
        # fork every worker now, while the process is small and before the event loop and
        # ZMQ exist: the pool forks on demand, one more whenever none is idle, so `workers`
        # tasks that overlap make it fork them all (a worker forked later, under load, copies
        # a grown heap: +270 MB of the server tree's RSS in the 20,000-request soak)
        list(self.pool.map(time.sleep, [0.2] * workers))

    async def parse(self, model: type[BaseModel], raw: bytes) -> BaseModel:
        loop = asyncio.get_running_loop()
        kind, value = await loop.run_in_executor(self.pool, _validate, model, raw, self.sizes)
        if kind == "invalid":
            raise RequestValidationError(value)
        if kind == "refused":
            raise RequestError(value[0], param=value[1])
        return value

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def off_loop_route(parser: BodyParser) -> type[APIRoute]:
    """A route class whose JSON body, when over INLINE_BYTES, is validated by `parser`; the
    endpoint is then called with the model (the OpenAPI schema is the route's own)."""

    class OffLoopRoute(APIRoute):
        def get_route_handler(self):
            inline = super().get_route_handler()
            models = {name: hint for name, hint in typing.get_type_hints(self.endpoint).items()
                      if isinstance(hint, type) and issubclass(hint, BaseModel)}
            if len(models) != 1:
                return inline
            [(body_name, model)] = models.items()
            request_name = self.dependant.request_param_name
            endpoint = self.endpoint

            async def handler(request):
                raw = await request.body()  # kept: the inline handler reads it again
                if len(raw) <= INLINE_BYTES:
                    return await inline(request)
                kwargs = {body_name: await parser.parse(model, raw)}
                if request_name:
                    kwargs[request_name] = request
                result = await endpoint(**kwargs)
                if isinstance(result, Response):
                    return result
                return JSONResponse(jsonable_encoder(result))

            return handler

    return OffLoopRoute
