"""The HTTP listener's own limits, below the ASGI app: uvicorn's httptools protocol with a cap
on the bytes of each request (its head, and what follows: body, chunk framing, trailers), a
deadline for its head, and a bound on open connections.

uvicorn has none of these for httptools (its h11 buffer limit answers 400, and
`limit_concurrency` answers 503 only once a request's headers have all arrived), so a
client could hold a connection open forever, or make the server buffer a header (or a
chunked body's trailer) of any size, before authentication. The body's deadline is
BodySizeLimit's (gateway/middleware.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from http import HTTPStatus

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.errors import GatewayError, HeadersTooLarge, PayloadTooLarge, RequestTimeout, Unavailable
from gateway.middleware import new_edge_request_id

logger = logging.getLogger("tenantgate.gateway")

LINGER_S = 1.0  # how long a refused client's remaining bytes are drained before the socket closes


@dataclass(frozen=True)
class EdgeLimits:
    max_header_bytes: int
    max_body_bytes: int
    header_timeout_s: float
    max_connections: int


def edge_protocol(limits: EdgeLimits) -> type[asyncio.Protocol]:
    """The protocol class for uvicorn.Config(http=...), bound to `limits`."""
    return type("EdgeProtocol", (EdgeProtocol,), {"limits": limits})


class EdgeProtocol(HttpToolsProtocol):
    limits: EdgeLimits

    # The parser is fed at most the bytes left of a budget: the head's until its last header,
    # then that of the rest of the request (body, chunk framing and trailers).
    _in_head = True
    _left = 0
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
        self._left = self.limits.max_header_bytes
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
            if self._left == 0:
                self._cut_off(HeadersTooLarge(f"the request headers exceed {self.limits.max_header_bytes} bytes")
                              if self._in_head else
                              PayloadTooLarge(f"the request body exceeds {self.limits.max_body_bytes} bytes"))
                return
            part, data = data[: self._left], data[self._left :]
            self._left -= len(part)  # the parser's callbacks below may end a head or a request
            super().data_received(part)

    # -- parser callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._start_head_timer()

    def on_headers_complete(self) -> None:
        # BodySizeLimit refuses a body over max_body_bytes; this bounds what the parser buffers
        # besides (a trailer's value is kept whole until it ends).
        self._in_head, self._left = False, self.limits.max_body_bytes + self.limits.max_header_bytes
        self._stop_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # The next request's head may follow at once (pipelining); its clock starts with its first byte.
        self._in_head, self._left = True, self.limits.max_header_bytes

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
        """Answers `error` (unless a response is under way) and closes. The client may still be
        sending: what arrives for a moment longer is read and dropped, so that closing does not
        reset the connection and lose the answer."""
        self._stop_head_timer()
        if self.transport.is_closing():
            return
        self._discarding = True
        logger.info("closed a connection: %s", error.message)
        # No second answer for a request that has one, or while the one before it is answered.
        cycle = self.cycle
        if cycle is None or (cycle.response_complete if self._in_head else not cycle.response_started):
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
             f"x-request-id: {new_edge_request_id()}",
             *(f"{name}: {value}" for name, value in error.headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
