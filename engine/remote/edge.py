"""The one HTTP edge every listener of the product goes through (the gateway's API and operator
ports, `tenantgate engine serve`): uvicorn's httptools protocol with a cap on the bytes of each
request (its head, and what follows: body, chunk framing, trailers), a deadline for its head and
one for its body, and a bound on open connections.

uvicorn has none of these for httptools (its h11 buffer limit answers 400, and
`limit_concurrency` answers 503 only once a request's headers have all arrived), so a client
could hold a connection open forever, or make the server buffer a header (or a chunked body's
trailer) of any size, before any handler runs. The app caps the body it reads itself
(`read_body`): the gateway's before authentication, an engine replica's after the envelope.

It lives here, beside the replica server, because the engine may not import the gateway; the
gateway imports it from engine.remote.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, cast

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from engine.ids import random_hex

if TYPE_CHECKING:
    from fastapi.telemetry import TelemetryConfig
    from starlette.types import Receive

logger = logging.getLogger("tenantgate.edge")

LINGER_S = 1.0  # how long a refused client's remaining bytes are drained before the socket closes


# FastAPI's own OpenTelemetry instrumentation stays off in every app behind the edge (the gateway's
# API and operator apps, a replica's): their spans and metrics are their own (gateway/tracing.py,
# gateway/metrics.py, engine/telemetry.py), checked to carry no request content, and a second set
# would duplicate them once any library set a global provider. Off, it also stops asking for the
# global providers on every request (4 us each).
NO_NATIVE_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}


@dataclass(frozen=True)
class EdgeLimits:
    max_header_bytes: int = 32 << 10
    max_body_bytes: int = 1 << 20
    header_timeout_s: float = 10.0  # from a request's first byte (or the connection's opening) to its last header
    body_timeout_s: float = 30.0  # from its last header to the last byte of its body
    max_connections: int = 512


class EdgeRefusal(Exception):
    """A request the edge refuses, answered in OpenAI's error shape."""

    def __init__(self, status: int, code: str, message: str, *, type_: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.type = status, code, message, type_
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": None, "code": self.code}}


def body_too_large(max_bytes: int) -> EdgeRefusal:
    return EdgeRefusal(413, "payload_too_large", f"the request body exceeds {max_bytes} bytes")


def new_edge_request_id() -> str:
    return "req-" + random_hex()


def edge_config(app, limits: EdgeLimits, **options) -> uvicorn.Config:
    """uvicorn's configuration for `app` behind the edge; `options` are uvicorn.Config's (host, port, ...)."""
    return uvicorn.Config(app, http=edge_protocol(limits), server_header=False, proxy_headers=False, **options)


def edge_protocol(limits: EdgeLimits) -> type[asyncio.Protocol]:
    """The protocol class for uvicorn.Config(http=...), bound to `limits`."""
    return type("EdgeProtocol", (EdgeProtocol,), {"limits": limits})


async def read_body(headers: Iterable[tuple[bytes, bytes]], receive: Receive, max_bytes: int) -> bytes | None:
    """The whole request body, or None when the client left first; EdgeRefusal (413) when it is over
    `max_bytes`, by Content-Length before a byte is read, or once that many have arrived. Its
    deadline is the edge's (the protocol cuts a late body off with 408)."""
    for name, value in headers:
        if name == b"content-length" and value.isdigit() and int(value) > max_bytes:
            raise body_too_large(max_bytes)
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise body_too_large(max_bytes)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class EdgeProtocol(HttpToolsProtocol):
    limits: EdgeLimits

    # The parser is fed at most the bytes left of a budget: the head's until its last header,
    # then that of the rest of the request (body, chunk framing and trailers).
    _in_head = True
    _left = 0
    _timer: asyncio.TimerHandle | None = None  # the deadline of the part of a request now arriving
    _refused = False  # over the connection bound: never served
    _discarding = False  # answered with an error: what still arrives is dropped

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            # Closed at once, without lingering: a flood of these must not hold sockets.
            self._refused = True
            transport.write(_response(EdgeRefusal(503, "service_unavailable",
                                                  "the server has too many open connections; retry shortly",
                                                  type_="service_unavailable", headers={"Retry-After": "1"})))
            transport.close()
            return
        super().connection_made(transport)
        self._left = self.limits.max_header_bytes
        self._start_head_timer()  # a connection that never sends a byte is timed too

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._stop_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        while data and not self.transport.is_closing():
            if self._left == 0:
                self._cut_off(EdgeRefusal(431, "request_header_fields_too_large",
                                          f"the request headers exceed {self.limits.max_header_bytes} bytes")
                              if self._in_head else body_too_large(self.limits.max_body_bytes))
                return
            part, data = data[: self._left], data[self._left :]
            self._left -= len(part)  # the parser's callbacks below may end a head or a request
            super().data_received(part)

    # -- parser callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._start_head_timer()

    def on_headers_complete(self) -> None:
        # The app refuses a body over max_body_bytes; this bounds what the parser buffers
        # besides (a trailer's value is kept whole until it ends).
        self._in_head, self._left = False, self.limits.max_body_bytes + self.limits.max_header_bytes
        self._stop_timer()
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.transport is self.transport:
            # The cycle only writes and closes through it; the rest passes to the real transport.
            self.cycle.transport = cast(asyncio.Transport, HeadWithBody(self.transport, self.loop))
        self._start_body_timer_if_served()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._stop_timer()
        # The next request's head may follow at once (pipelining); its clock starts with its first byte.
        self._in_head, self._left = True, self.limits.max_header_bytes

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a request queued behind this one (pipelining)
        if self._in_head or self.cycle is None:
            return
        if self.cycle.response_complete:
            # Answered before its body arrived (a refusal that needed none of it): the rest is not waited for.
            self._cut_off(None)
        else:
            self._start_body_timer_if_served()

    # -- deadlines ------------------------------------------------------------------

    def _start_head_timer(self) -> None:
        if self._timer is None:
            self._timer = self.loop.call_later(self.limits.header_timeout_s, self._timed_out, "headers",
                                               self.limits.header_timeout_s)

    def _start_body_timer_if_served(self) -> None:
        # The body's clock starts with its request: one queued behind another (pipelining) is not read yet.
        queued = any(cycle is self.cycle for cycle, _ in self.pipeline)
        if self._timer is None and not self._in_head and self.cycle is not None and not queued:
            self._timer = self.loop.call_later(self.limits.body_timeout_s, self._timed_out, "body",
                                               self.limits.body_timeout_s)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self, part: str, seconds: float) -> None:
        self._timer = None
        self._cut_off(EdgeRefusal(408, "request_timeout", f"the request {part} did not arrive within {seconds:g} s"))

    def _cut_off(self, refusal: EdgeRefusal | None) -> None:
        """Answers `refusal` (unless a response is under way) and closes. The client may still be
        sending: what arrives for a moment longer is read and dropped, so that closing does not
        reset the connection and lose the answer."""
        self._stop_timer()
        if self.transport.is_closing():
            return
        self._discarding = True
        cycle = self.cycle
        if refusal is not None:
            logger.info("closed a connection: %s", refusal.message)
            # No second answer for a request that has one, or while the one before it is answered.
            if cycle is None or (cycle.response_complete if self._in_head else not cycle.response_started):
                self.transport.write(_response(refusal))
        if cycle is not None and not cycle.response_complete:
            # The app's request ends here: it reads a disconnect, and what it still sends is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


class HeadWithBody:
    """A response's transport that sends its head with the first part of its body, in one write.

    uvicorn writes the status line and headers as soon as the app starts the response, and the
    body with the next message: two writes, so the client wakes for a head it cannot use yet and
    again for the body. The head is held instead until the next write, or until the event loop
    turns (`call_soon`), so a response whose body is slow to come (a stream waiting for its first
    token, a 100 Continue) still sends its head at once.
    """

    __slots__ = ("_transport", "_loop", "_held", "_first")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._first = True

    def write(self, data: bytes) -> None:
        if self._first:
            self._first = False
            self._held = data
            self._loop.call_soon(self.flush)
            return
        held, self._held = self._held, None
        self._transport.write(data if held is None else held + data)

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            try:
                self._transport.write(held)
            except RuntimeError:  # the connection was cut off meanwhile (after write_eof): nothing to send
                pass

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


def _response(refusal: EdgeRefusal) -> bytes:
    """`refusal` as a whole HTTP/1.1 response that closes the connection."""
    body = json.dumps(refusal.body()).encode()
    lines = [f"HTTP/1.1 {refusal.status} {HTTPStatus(refusal.status).phrase}",
             "content-type: application/json", f"content-length: {len(body)}", "connection: close",
             f"x-request-id: {new_edge_request_id()}",
             *(f"{name}: {value}" for name, value in refusal.headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
