"""uvicorn's h11 protocol with a deadline for a request's headers.

uvicorn closes a keep-alive connection left idle after a response (`--timeout-keep-alive`),
but waits forever for the headers of a request a client has begun: 200 connections sending
half a header held their sockets as long as they liked. Here a connection whose next request's
headers are not complete `header_timeout` seconds after it opened (or after its last response)
is closed.
"""

from __future__ import annotations

import functools

from uvicorn.protocols.http.h11_impl import H11Protocol


class HeaderDeadlineProtocol(H11Protocol):
    def __init__(self, *args, header_timeout: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self._deadline = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        waiting_after = self.cycle  # a new request's complete headers replace it

        def expire() -> None:
            if self.cycle is waiting_after and not self.transport.is_closing():
                self.transport.close()

        self._deadline = self.loop.call_later(self.header_timeout, expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None


def header_deadline_protocol(header_timeout: float):
    """The protocol factory to give uvicorn.Config(http=...)."""
    return functools.partial(HeaderDeadlineProtocol, header_timeout=header_timeout)
