"""The HTTP server: FastAPI + uvicorn in front of a TokenizerManager.

Lifecycle: `run_server` starts the scheduler and detokenizer processes, then serves. Ctrl-C or
SIGTERM drains: new requests and /health get 503 while running requests finish (at most
`--shutdown-grace` seconds; a second signal stops at once); then uvicorn stops, then the
children, and the process exits 0. If a child dies, the server logs it, /health answers 503 and
open streams end with an error event for a second, then the process exits non-zero. With
`--api-server-count N` (N > 1) this process supervises N HTTP processes on the same port
instead of serving itself (`api_servers.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from seq2serve.encoders.image_loader import MediaPolicy
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.frontend.api_servers import RuntimeView, run_api_servers, shared_port
from seq2serve.runtime.frontend.audio_serving import AudioServing
from seq2serve.runtime.frontend.body_limit import BodySizeLimit
from seq2serve.runtime.frontend.body_parsing import BodyParser, BodySizes, off_loop_route
from seq2serve.runtime.frontend.embeddings_serving import embeddings
from seq2serve.runtime.frontend.glossary import load_named
from seq2serve.runtime.frontend.http_drain import DrainingServer
from seq2serve.runtime.frontend.http_middleware import ADMIN_SCOPE, AuthAndCount
from seq2serve.runtime.frontend.http_protocol import header_deadline_protocol
from seq2serve.runtime.frontend.language_detection import detect_response
from seq2serve.runtime.frontend.launch import RuntimeProcesses, launch_processes
from seq2serve.runtime.frontend.metrics import ServerMetrics
from seq2serve.runtime.frontend.openai_protocol import (
    AbortBody,
    ChatCompletionRequest,
    CompletionRequest,
    DetectRequest,
    EmbeddingRequest,
    GenerateRequest,
    TokenizeRequest,
    TranslationRequest,
)
from seq2serve.runtime.frontend.openai_serving import (
    ClientDisconnected,
    OpenAIServing,
    RequestError,
    json_error,
)
from seq2serve.runtime.frontend.tokenizer_manager import EngineDeadError, TokenizerManager
from seq2serve.runtime.memory.collector import freeze_heap
from seq2serve.runtime.messages.ipc import IpcNames

logger = logging.getLogger(__name__)

_WATCH_INTERVAL_S = 0.5
# after a child dies: how long /health keeps answering 503 and streams get their error events
# before the server exits (clients see why, instead of a refused connection)
_DEAD_GRACE_S = 1.0


def create_app(args: ServerArgs, procs: RuntimeProcesses, on_child_death=None,
               server: int | None = None) -> FastAPI:
    """The app of one HTTP process (`server`: its index when there are several; `procs` is
    then their view of the runtime's processes, `api_servers.RuntimeView`)."""
    tokenizer = load_tokenizer(args.tokenizer_path or args.model_path)
    policy = MediaPolicy(allow_local_paths=False, local_media_dir=args.allowed_local_media_path,
                         allow_remote=args.allow_remote_media, max_pixels=args.max_image_pixels)
    tm = TokenizerManager(procs.ipc, tokenizer, procs.info, model_id=args.model_path,
                          media_policy=policy, limits=args.request_limits(),
                          isolation=args.isolation(), server=server,
                          servers=args.api_server_count, media_processes=args.media_processes)
    metrics = ServerMetrics(replicas=len(procs.schedulers))
    tm.metrics = metrics
    model_name = args.served_model_name or os.path.basename(os.path.normpath(args.model_path))
    serving = OpenAIServing(tm, model_name, args.model_path)
    serving.glossaries = load_named(args.glossary)
    audio = AudioServing(serving)  # /v1/audio/*: speech models
    # large bodies are validated in these processes, forked now (before ZMQ and the loop)
    parser = BodyParser(BodySizes(max_entries=args.max_batch_inputs,
                                  max_ids=tm.prompt_token_limit()[0]))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await tm.start()
        watcher = asyncio.create_task(_watch(procs, tm, on_child_death))
        yield
        watcher.cancel()
        parser.close()
        await tm.close()

    app = FastAPI(title="seq2serve", lifespan=lifespan)
    app.router.route_class = off_loop_route(parser)
    app.state.tm, app.state.metrics, app.state.serving = tm, metrics, serving

    app.add_middleware(AuthAndCount, api_key=args.api_key, metrics=metrics, router=app.router,
                       admin_api_key=args.admin_api_key)

    def sees_replica(request: Request) -> bool:
        """meta_info.replica: for the admin key, or for everyone on a server that has none and
        shares its caches across users (then the replica reveals nothing the caches do not)."""
        if args.admin_api_key is not None:
            return bool(request.scope.get(ADMIN_SCOPE))
        return args.cache_isolation == "none"

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError):
        return json_error(400, _describe(exc), param=_param_of(exc))

    @app.exception_handler(RequestError)
    async def on_request_error(request: Request, exc: RequestError):
        return json_error(exc.status, str(exc), kind=exc.kind, param=exc.param)

    @app.exception_handler(ValueError)
    async def on_value_error(request: Request, exc: ValueError):
        return json_error(400, str(exc))

    @app.exception_handler(EngineDeadError)
    async def on_dead(request: Request, exc: EngineDeadError):
        return json_error(503, str(exc), kind="service_unavailable")

    @app.exception_handler(ClientDisconnected)
    async def on_disconnect(request: Request, exc: ClientDisconnected):
        return Response(status_code=499)

    @app.get("/health")
    async def health():
        if tm.dead_reason is not None or tm.draining:
            return json_error(503, tm.dead_reason or "the server is shutting down",
                              kind="service_unavailable")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        entry = {"id": model_name, "object": "model", "created": int(time.time()),
                 "owned_by": "seq2serve", "root": args.model_path}
        if tm.languages is not None:  # what /v1/translations' languages may be
            entry["languages"] = tm.languages.describe()
        return {"object": "list", "data": [entry]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await serving.completions(body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await serving.chat(body, request)

    @app.post("/v1/embeddings")
    async def embeddings_route(body: EmbeddingRequest, request: Request):
        return await embeddings(serving, body, request)

    @app.post("/generate")
    async def generate(body: GenerateRequest, request: Request):
        return await serving.generate(body, request, show_replica=sees_replica(request))

    @app.post("/v1/translations")
    async def translations(body: TranslationRequest, request: Request):
        return await serving.translations(body, request)

    @app.post("/v1/audio/transcriptions")
    async def audio_transcriptions(request: Request):
        return await audio.handle(request, "transcribe")

    @app.post("/v1/audio/translations")
    async def audio_translations(request: Request):
        return await audio.handle(request, "translate")

    @app.post("/v1/detect")
    async def detect(body: DetectRequest):
        """LibreTranslate's /detect: each text's likeliest languages, best first (the
        identifier runs on a worker thread; a large body is parsed off the loop too)."""
        serving.refuse(body, "/v1/detect")
        try:
            return await asyncio.get_running_loop().run_in_executor(
                None, detect_response, body.q, tm.limits.max_batch_inputs,
                tm.limits.max_document_chars)
        except ValueError as e:
            raise RequestError(str(e), param="q") from None

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        serving.check_model(body.model)
        texts = body.prompt if isinstance(body.prompt, list) else [body.prompt]

        def run() -> bytes:  # tokenizing and encoding the ids: CPU work, off the event loop
            ids = tm.tokenize_texts(texts, body.add_special_tokens)
            if isinstance(body.prompt, list):
                return json.dumps({"tokens": ids, "count": [len(t) for t in ids]}).encode()
            return json.dumps({"tokens": ids[0], "count": len(ids[0])}).encode()

        # 300,000 prompts held /health for 21.5 s when tokenized on the loop
        return Response(await asyncio.get_running_loop().run_in_executor(None, run),
                        media_type="application/json")

    @app.get("/get_model_info")
    async def get_model_info():
        return tm.model_info()

    @app.post("/abort_request")
    async def abort_request(body: AbortBody):
        """Abort the caller's own request: rids are per user (`user` as in the request)."""
        await tm.abort(body.rid, body.user)
        return {"rid": body.rid}

    @app.post("/flush_cache")
    async def flush_cache():
        reply = await tm.control("flush_cache")
        return {"flushed": reply.ok}

    @app.get("/metrics")
    async def prometheus():
        reply = await tm.control("stats")
        metrics.set_stats(reply.payload)
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/debug/integrity")
    async def integrity():
        """Accounts for every slot of every pool (tests call it after a load)."""
        reply = await tm.control("check_integrity")
        status = 200 if reply.ok else 500
        return JSONResponse({"ok": reply.ok, **reply.payload}, status_code=status)

    @app.get("/debug/stats")
    async def stats():
        """The scheduler's counters (summed over replicas, each replica's under "replicas"),
        where the replicas run ("layout"), and which HTTP process answered ("http_server")."""
        return {**(await tm.control("stats")).payload, "layout": procs.layout(),
                "http_server": {"index": server or 0, "count": args.api_server_count}}

    return app


async def _watch(procs: RuntimeProcesses, tm: TokenizerManager, on_child_death) -> None:
    while True:
        reason = procs.dead_child()
        if reason is not None:
            logger.error("%s; the server can no longer serve and will exit", reason)
            tm.mark_dead(reason)
            await asyncio.sleep(_DEAD_GRACE_S)
            if on_child_death is not None:
                on_child_death(reason)
            return
        await asyncio.sleep(_WATCH_INTERVAL_S)


# the names pydantic gives a union's members in an error's location ("stop.str")
_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "none", "list", "dict", "bytes"})


def _param_of(exc: RequestValidationError) -> str | None:
    """The field of the first error as a path ("messages.0.role"), without the union member
    that pydantic names after it ("stop.str", "stop.list[str]": "stop")."""
    errors = exc.errors()
    if errors and errors[0].get("type") != "json_invalid":
        loc = [str(p) for p in errors[0].get("loc", ()) if p != "body" and not _is_member(p)]
        return ".".join(loc) or None
    return None


def _is_member(part: object) -> bool:
    """A union member's name (a type: "list[str]", "constrained-str", a model's class name),
    never a field's (a lowercase identifier) or a list index."""
    return isinstance(part, str) and (not part.isidentifier() or part[0].isupper()
                                      or part in _TYPE_NAMES)


def _describe(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors()[:5]:
        loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
        if e.get("type") == "json_invalid":
            parts.append(f"malformed JSON: {e.get('ctx', {}).get('error', e.get('msg'))}")
        elif e.get("type") == "extra_forbidden":
            parts.append(f"{loc}: unknown field (this endpoint does not take it)")
        elif loc:
            parts.append(f"{loc}: {e.get('msg')}")
        else:
            parts.append(e.get("msg", "invalid request"))
    return "; ".join(parts) or "invalid request body"


def run_server(args: ServerArgs) -> int:
    """Serve until Ctrl-C / SIGTERM (exit code 0) or until a child process dies (1)."""
    load_named(args.glossary)  # a bad --glossary fails before the children start
    procs = launch_processes(args)
    try:
        if args.api_server_count > 1:
            line = startup_line(args, procs.info, procs.describe_layout(),
                                args.api_server_count)
            return run_api_servers(args, procs, line)
        return serve_http(args, procs, print_line=True)
    finally:
        procs.shutdown()


def serve_http(args: ServerArgs, procs, server: int | None = None, sockets=None,
               print_line: bool = False, on_ready=None) -> int:
    """Run one HTTP process's uvicorn until it stops: 0 after a signal, 1 when a child died
    or the port could not be bound. `sockets`: listening sockets already bound (several
    HTTP processes share the port); None: uvicorn binds `--host`/`--port`. `on_ready`:
    called once the app is made, before it serves."""
    exit_code = 0
    uv = None

    def on_child_death(reason: str) -> None:
        nonlocal exit_code
        exit_code = 1
        uv.should_exit = True

    # uvicorn re-raises the signal that stopped it once it has shut down gracefully; with
    # these (no-op) handlers in place that ends in a normal return and exit code 0
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    app = create_app(args, procs, on_child_death, server)
    uv = _uvicorn_server(args, app)
    # what start-up made lives as long as the server: out of the collector's full passes,
    # which otherwise walk it while streams wait (vLLM's API server does the same)
    freeze_heap()
    if print_line:
        print(startup_line(args, procs.info, procs.describe_layout()), file=sys.stderr,
              flush=True)
    if on_ready is not None:
        on_ready()
    uv.run(sockets=sockets)
    if not uv.started and exit_code == 0:
        exit_code = 1  # could not bind the port, say
    return exit_code


def run_api_server_process(args: ServerArgs, ipc: IpcNames, ready_pipe, parent_pid: int,
                           server: int, info: dict[str, Any], layout: dict[str, Any],
                           describe_layout: str, death_fd: int) -> None:
    """One HTTP process of several: bind the shared port, report ready, serve."""
    try:
        os.set_blocking(death_fd, False)
        sock = shared_port(args.host, args.port)
    except Exception as e:  # noqa: BLE001 - reported to the main process
        ready_pipe.send({"status": "error", "type": type(e).__name__,
                         "message": f"HTTP server {server}: {e}"})
        return
    view = RuntimeView(ipc, info, layout, describe_layout, death_fd, parent_pid)
    sys.exit(serve_http(args, view, server=server, sockets=[sock],
                        on_ready=lambda: ready_pipe.send({"status": "ready"})))


def _uvicorn_server(args: ServerArgs, app: FastAPI) -> DrainingServer:
    import uvicorn

    config = uvicorn.Config(BodySizeLimit(app, args.max_request_bytes), host=args.host,
                            port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=5,
                            http=header_deadline_protocol(args.header_timeout),
                            timeout_keep_alive=args.timeout_keep_alive,
                            # the connections are shared out among the HTTP processes
                            limit_concurrency=-(-args.max_connections
                                                // args.api_server_count))
    return DrainingServer(config, app.state.tm, args.shutdown_grace)


def startup_line(args: ServerArgs, info: dict, layout: str, servers: int = 1) -> str:
    """What the server prints once it serves."""
    where = info["device"] if info.get("tp_size", 1) == 1 else (
        f"tp {info['tp_size']} ranks on {','.join(info['tp_devices'])}")
    extra = [layout] if layout else []
    if servers > 1:
        extra.append(f"{servers} HTTP processes")
    return (f"seq2serve: serving {args.model_path} ({info['architecture']}, {where} "
            f"{info['dtype']}, attention {info['attention_backend']}; KV pool "
            f"{info['kv_capacity_tokens']} tokens, cross-KV pool "
            f"{info['cross_capacity_tokens']} tokens) on http://{args.host}:{args.port}"
            + "".join(f"; {e}" for e in extra))
