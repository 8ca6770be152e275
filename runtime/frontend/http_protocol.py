"""uvicorn's HTTP/1.1 protocol with a deadline and a size limit for a request's headers.

uvicorn closes a keep-alive connection left idle after a response (`--timeout-keep-alive`),
but waits forever for the headers of a request a client has begun: 200 connections sending
half a header held their sockets as long as they liked. Here a connection whose next request's
headers are not complete `header_timeout` seconds after it opened (or after its last response)
is closed, and so is one that sends more than `MAX_HEADER_BYTES` before its headers end.

The protocol is uvicorn's httptools one (llhttp, in C) where httptools is installed, its h11
one (pure Python) otherwise: on a server streaming 256 responses the h11 protocol's per-event
work was a fifth of the HTTP process's time (py-spy, H100, docs/benchmarks.md).
"""

from __future__ import annotations

import functools

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
except ImportError:  # (httptools is a dependency; a bare uvicorn still serves)
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Base

# a request line and headers past this are refused: h11 stops at 16 KiB by itself, llhttp
# not at all (a client could send headers until the deadline)
MAX_HEADER_BYTES = 64 * 1024


class HeaderDeadlineProtocol(_Base):
    def __init__(self, *args, header_timeout: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self._deadline = None
        self._waiting_after = None  # the cycle before the request whose headers are awaited
        self._header_bytes = 0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._deadline is None or self.transport.is_closing():
            return
        if self.cycle is not self._waiting_after:  # the headers are complete
            self._disarm()
            return
        self._header_bytes += len(data)  # all of it part of headers still incomplete
        if self._header_bytes > MAX_HEADER_BYTES:
            self._refuse_headers()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _refuse_headers(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            body = b"request headers too large\n"
            self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                                 b"content-type: text/plain; charset=utf-8\r\n"
                                 b"connection: close\r\n"
                                 b"content-length: %d\r\n\r\n%s" % (len(body), body))
            self.transport.close()

    def _arm(self) -> None:
        self._disarm()
        self._waiting_after = waiting_after = self.cycle  # a new request's headers replace it
        self._header_bytes = 0

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
