"""The server's request gate, as plain ASGI: the API key check and the request counter.

Plain ASGI rather than `@app.middleware("http")`: Starlette's BaseHTTPMiddleware hands the
endpoint a receive channel on which `request.is_disconnected()` never reports the client
leaving, so non-streamed requests ran to the end after their client was gone. Requests are
counted by route template (`/v1/completions`, `/v1/models`), and every path no route serves
as `other`: a label per raw path let any client, key or not, grow /metrics without bound.
"""

from __future__ import annotations

import hmac

from starlette.routing import Match

from seq2serve.runtime.frontend.metrics import ServerMetrics
from seq2serve.runtime.frontend.openai_serving import json_error

OPEN_PATHS = frozenset({"/health"})


class AuthAndCount:
    def __init__(self, app, *, api_key: str | None, metrics: ServerMetrics, router) -> None:
        self.app = app
        self.api_key = api_key
        self.metrics = metrics
        self.router = router  # resolved per request: routes are added after the middleware

    def endpoint(self, scope) -> str:
        for route in self.router.routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return getattr(route, "path", "other")
        return "other"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        endpoint = self.endpoint(scope)
        if self.api_key and scope["path"] not in OPEN_PATHS:
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, f"Bearer {self.api_key}".encode()):
                self.metrics.requests.labels(endpoint, "401").inc()
                response = json_error(401, "invalid or missing API key (send "
                                      "'Authorization: Bearer KEY')",
                                      kind="authentication_error")
                return await response(scope, receive, send)
        status = 500  # if the app fails before it answers

        async def counting_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.metrics.requests.labels(endpoint, str(status)).inc()
