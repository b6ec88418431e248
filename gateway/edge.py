"""The HTTP listener's own limits, below the ASGI app: uvicorn's httptools protocol with a cap
on each request's head, a deadline for it, and a bound on open connections.

uvicorn has none of these for httptools (its h11 buffer limit answers 400, and
`limit_concurrency` answers 503 only once a request's headers have all arrived), so a
client could hold a connection open forever, or make the server buffer a header of any
size, before authentication. The body's deadline is BodySizeLimit's (gateway/middleware.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from http import HTTPStatus

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.errors import GatewayError, HeadersTooLarge, RequestTimeout, Unavailable

logger = logging.getLogger("tenantgate.gateway")

LINGER_S = 1.0  # how long a refused client's remaining bytes are drained before the socket closes


@dataclass(frozen=True)
class EdgeLimits:
    max_header_bytes: int
    header_timeout_s: float
    max_connections: int


def edge_protocol(limits: EdgeLimits) -> type[asyncio.Protocol]:
    """The protocol class for uvicorn.Config(http=...), bound to `limits`."""
    return type("EdgeProtocol", (EdgeProtocol,), {"limits": limits})


class EdgeProtocol(HttpToolsProtocol):
    limits: EdgeLimits

    # Between a request's first byte and its last header, the parser is fed at most the bytes
    # left of the head's budget; None while a body is read or the connection waits.
    _head_left: int | None = None
    _head_timer: asyncio.TimerHandle | None = None
    _refused = False  # over the connection bound: never served
    _discarding = False  # answered with an error: what still arrives is dropped

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            # Closed at once, without lingering: a flood of these must not hold sockets.
            self._refused = True
            transport.write(_response(Unavailable("the gateway has too many open connections; retry shortly",
                                                  headers={"Retry-After": "1"})))
            transport.close()
            return
        super().connection_made(transport)
        self._head_left = self.limits.max_header_bytes
        self._start_head_timer()  # a connection that never sends a byte is timed too

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        while data and not self.transport.is_closing():
            if self._head_left is None:
                super().data_received(data)
                return
            if self._head_left == 0:
                self._cut_off(HeadersTooLarge(f"the request headers exceed {self.limits.max_header_bytes} bytes"))
                return
            head, data = data[: self._head_left], data[self._head_left :]
            self._head_left -= len(head)  # the parser's callbacks below may start or end a head
            super().data_received(head)

    # -- parser callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._start_head_timer()

    def on_headers_complete(self) -> None:
        self._head_left = None
        self._stop_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # The next request's head may follow at once (pipelining); its clock starts with its first byte.
        self._head_left = self.limits.max_header_bytes

    # -- the head's deadline ------------------------------------------------------------

    def _start_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        self._cut_off(RequestTimeout(f"the request headers did not arrive within {self.limits.header_timeout_s:g} s"))

    def _cut_off(self, error: GatewayError) -> None:
        """Answers `error` and closes. The client may still be sending: what arrives for a moment
        longer is read and dropped, so that closing does not reset the connection and lose the answer."""
        self._stop_head_timer()
        if self.transport.is_closing():
            return
        self._head_left = None
        self._discarding = True
        logger.info("closed a connection: %s", error.message)
        self.transport.write(_response(error))
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def _response(error: GatewayError) -> bytes:
    """`error` in OpenAI's shape as a whole HTTP/1.1 response that closes the connection."""
    body = json.dumps(error.body()).encode()
    lines = [f"HTTP/1.1 {error.status_code} {HTTPStatus(error.status_code).phrase}",
             "content-type: application/json", f"content-length: {len(body)}", "connection: close",
             *(f"{name}: {value}" for name, value in error.headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
