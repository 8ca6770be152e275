"""The server's request gate, as plain ASGI: the API keys' checks and the request counter.

Plain ASGI rather than `@app.middleware("http")`: Starlette's BaseHTTPMiddleware hands the
endpoint a receive channel on which `request.is_disconnected()` never reports the client
leaving, so non-streamed requests ran to the end after their client was gone. Requests are
counted by route template (`/v1/completions`, `/v1/models`), and every path no route serves
as `other`: a label per raw path let any client, key or not, grow /metrics without bound.

Two scopes: the API key (`--api-key`) for the model's routes, and the admin key
(`--admin-api-key`) for the control routes (`ADMIN_PATHS`, `/debug/*`), which refuse the API key
with a 403. The admin key opens every route. Without an admin key, the control routes need
only what the other routes need. The scope a request was granted is `scope[ADMIN_SCOPE]`.
"""

from __future__ import annotations

import hmac

from starlette.routing import Match

from seq2serve.runtime.frontend.metrics import ServerMetrics
from seq2serve.runtime.frontend.openai_serving import json_error

OPEN_PATHS = frozenset({"/health"})
ADMIN_PATHS = frozenset({"/flush_cache", "/metrics"})  # and every /debug/ path
ADMIN_SCOPE = "seq2serve.admin"  # True in the ASGI scope when the admin key was sent


def bearer_token(headers) -> bytes | None:
    """The credentials of an `Authorization: Bearer TOKEN` header (the scheme in any case,
    RFC 7235), None without one."""
    given = dict(headers or []).get(b"authorization", b"")
    scheme, _, token = given.strip().partition(b" ")
    if scheme.lower() != b"bearer" or not token.strip():
        return None
    return token.strip()


def _matches(token: bytes | None, key: str | None) -> bool:
    # compare_digest on both sides always: the time taken says nothing of the key
    return key is not None and hmac.compare_digest(token or b"", key.encode())


def is_admin_path(path: str) -> bool:
    return path in ADMIN_PATHS or path.startswith("/debug/")


class AuthAndCount:
    def __init__(self, app, *, api_key: str | None, metrics: ServerMetrics, router,
                 admin_api_key: str | None = None) -> None:
        self.app = app
        self.api_key = api_key
        self.admin_api_key = admin_api_key
        self.metrics = metrics
        self.router = router  # resolved per request: routes are added after the middleware

    def endpoint(self, scope) -> str:
        for route in self.router.routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return getattr(route, "path", "other")
        return "other"

    def refusal(self, scope):
        """The error response for this request's credentials, or None if it may go on."""
        path = scope["path"]
        token = bearer_token(scope.get("headers"))
        admin = _matches(token, self.admin_api_key)
        scope[ADMIN_SCOPE] = admin
        if path in OPEN_PATHS or admin:
            return None
        if self.api_key is not None and not _matches(token, self.api_key):
            return json_error(401, "invalid or missing API key (send "
                              "'Authorization: Bearer KEY')", kind="authentication_error")
        if self.admin_api_key is not None and is_admin_path(path):
            return json_error(403, f"{path} is a control route: send the admin API key "
                              f"('Authorization: Bearer ADMIN_KEY', --admin-api-key); the API "
                              f"key is not enough", kind="permission_error")
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        endpoint = self.endpoint(scope)
        response = self.refusal(scope)
        if response is not None:
            self.metrics.requests.labels(endpoint, str(response.status_code)).inc()
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
