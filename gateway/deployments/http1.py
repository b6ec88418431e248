"""A lean HTTP/1.1 client for the calls to upstream deployments: keep-alive connections as asyncio
protocols, responses parsed by httptools (the C parser uvicorn serves with) as their bytes arrive.

httpx cost the gateway about a millisecond per upstream call on this path (its pool, anyio's
socket layer and h11 around every read), several times what the rest of a call costs. Each
deployment has one client; a call takes an idle connection to the origin or opens one, writes
the request, and reads the response as it comes. What it does not do: redirects (refused
anyway), proxies from HTTP(S)_PROXY (egress goes through the network's own routes: the landing
zone's firewall), HTTP/2, and request bodies that are not bytes.

Errors say how far the request got, which decides whether it may go to another deployment:
ConnectFailed (nothing was sent: refused, unreachable, a failed TLS handshake) and
Interrupted (the connection failed once the request may have been written).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable
from functools import lru_cache
from typing import cast
from urllib.parse import urlsplit

import httptools

PAUSE_BYTES = 128 * 1024  # a response's unread body past which its connection stops reading


class HttpError(Exception):
    """A transport failure (never a status: a response with any status is a response)."""


class ConnectFailed(HttpError):
    """The request was not sent: the connection could not be made, or the head could not be written."""


class Interrupted(HttpError):
    """The connection failed or the response broke once the request may have been sent."""


class BodyTooLarge(Exception):
    """A body read with a limit went past it (not an HttpError: the connection did nothing wrong)."""


@lru_cache(maxsize=256)
def _target(url: str) -> tuple[tuple[str, str, int], str, str]:
    """(origin, Host header, request target) of an absolute http(s) URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("an upstream URL is absolute http or https")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    default = port == (443 if parts.scheme == "https" else 80)
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    return ((parts.scheme, parts.hostname, port), host if default else f"{host}:{port}",
            (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))


_NOT_SENT = frozenset({"host", "content-length", "transfer-encoding", "connection"})  # the client's own
_LINE_BREAKS = ("\r", "\n", "\0")


def _head(method: str, target: str, host: str, headers: dict[str, str], length: int) -> bytes:
    """The request head. A header that would break it (a line break, say, at the end of a key read
    from a file) is refused before anything is sent; its value is never quoted."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", f"Content-Length: {length}"]
    for name, value in headers.items():
        if name.lower() in _NOT_SENT:
            continue
        if any(c in name or c in value for c in _LINE_BREAKS) or ":" in name:
            raise ConnectFailed(f"the {name.lower()!r} header holds a line break, so nothing was sent")
        lines.append(f"{name}: {value}")
    try:
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError:
        raise ConnectFailed("a header holds characters HTTP/1.1 cannot carry, so nothing was sent") from None


def default_ssl_context() -> ssl.SSLContext:
    """Certificates from SSL_CERT_FILE / SSL_CERT_DIR where set (as httpx read them), else certifi's."""
    cafile, capath = os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")
    if not cafile and not capath:
        import certifi

        cafile = certifi.where()
    return ssl.create_default_context(cafile=cafile or None, capath=capath or None)


class _Connection(asyncio.Protocol):
    """One connection to an origin. The bytes of the response being read on it go to its parser in
    the transport's callback, and the reader waits on one future per wake-up: no stream reader,
    writer or per-read timeout context between the socket and the parser."""

    def __init__(self, origin: tuple[str, str, int]) -> None:
        self.origin = origin
        self.idle_since = 0.0
        self.response: Response | None = None  # the one being read on it; None while idle
        self.closed = False  # by the peer, by a failure, or here: never reused
        self._transport: asyncio.Transport | None = None
        self._gone: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None  # while the transport's buffer is full

    # asyncio's protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._gone = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        if self.response is None:  # bytes nobody asked for: the next request could not trust this connection
            self.close()
            return
        self.response._received(data)

    def eof_received(self) -> bool:
        self.closed = True
        if self.response is not None:
            self.response._ended(None)
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.response is not None:
            self.response._ended(exc)
        _wake(self._writable)
        _wake(self._gone)

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        _wake(self._writable)
        self._writable = None

    async def write(self, data: bytes, timeout_s: float) -> None:
        """Writes the request; waits, within timeout_s, only while the transport's buffer is full."""
        if self.closed:
            raise Interrupted("the connection closed before the request was written")
        cast(asyncio.Transport, self._transport).write(data)
        waiting = self._writable
        if waiting is None:
            return
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(waiting)
        except TimeoutError:
            raise Interrupted("the request could not be written in time") from None
        if self.closed:
            raise Interrupted("the connection closed while the request was written")

    def pause_reading(self) -> None:
        if not self.closed:
            cast(asyncio.Transport, self._transport).pause_reading()

    def resume_reading(self) -> None:
        if not self.closed:
            cast(asyncio.Transport, self._transport).resume_reading()

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    async def aclose(self) -> None:
        self.close()
        if self._gone is not None:
            await asyncio.shield(self._gone)  # closing is all that is asked of it: its failure is not raised


def _wake(waiter: asyncio.Future | None, value: object = None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(value)


_EXPIRED = object()  # a waiter's result when its time ran out


class Http1Client:
    """Connections to the origins one deployment calls, kept alive up to keepalive_expiry_s after
    their last response (set under the servers' own keep-alive, so a server never closes one as a
    request goes out on it)."""

    def __init__(self, *, connect_timeout_s: float, io_timeout_s: float, keepalive_expiry_s: float,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self._connect_timeout_s = connect_timeout_s
        self.io_timeout_s = io_timeout_s  # the longest one write or read may wait
        self._expiry_s = keepalive_expiry_s
        self._ssl_context = ssl_context
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._closed = False

    async def send(self, method: str, url: str, headers: dict[str, str], body: bytes) -> Response:
        """The response, once its head is in (its body is read from it). Cancelling it (a caller's
        deadline) closes the connection."""
        origin, host, target = _target(url)
        head = _head(method, target, host, headers, len(body))
        connection = self._pooled(origin) or await self._connect(origin)
        response = Response(self, connection)
        try:
            await connection.write(head + body, self.io_timeout_s)
            await response.read_head()
        except BaseException:
            connection.close()
            response._let_go()
            raise
        return response

    def _pooled(self, origin: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if now - connection.idle_since < self._expiry_s and not connection.closed:
                return connection
            connection.close()
        return None

    async def _connect(self, origin: tuple[str, str, int]) -> _Connection:
        scheme, hostname, port = origin
        context = None
        if scheme == "https":
            context = self._ssl_context = self._ssl_context or default_ssl_context()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, connection = await loop.create_connection(lambda: _Connection(origin), hostname, port, ssl=context)
        except TimeoutError:
            raise ConnectFailed("the connection timed out") from None
        except (OSError, ssl.SSLError) as exc:
            raise ConnectFailed(type(exc).__name__) from None
        return connection

    def _release(self, connection: _Connection) -> None:
        if self._closed:
            connection.close()
            return
        connection.idle_since = now = time.monotonic()
        idle = self._idle.setdefault(connection.origin, [])
        while idle and now - idle[0].idle_since >= self._expiry_s:  # the oldest first: a burst's leftovers
            idle.pop(0).close()
        idle.append(connection)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = [c for connections in self._idle.values() for c in connections], {}
        for connection in idle:
            await connection.aclose()


class Response:
    """One response: its status and headers (names lower-cased), and its body as it arrives. A
    body read to its end hands the connection back for reuse; one closed before that closes it."""

    def __init__(self, client: Http1Client, connection: _Connection) -> None:
        self._client, self._connection = client, connection
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self.status_code = 0
        self.headers: dict[str, str] = {}
        self._pieces: list[bytes] = []
        self._buffered = 0  # bytes in _pieces; past PAUSE_BYTES the connection stops reading
        self._paused = False
        self._head_done = self._done = self._released = self._keep_alive = False
        self._failure: str | None = None  # why the response cannot go on (Interrupted's message)
        self._waiter: asyncio.Future | None = None
        connection.response = self

    # httptools' callbacks
    def on_message_begin(self) -> None:
        if self._done:  # a second message after this one: the parser stops, the connection is not reused
            raise Interrupted("the upstream sent more than one response")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._head_done = True
        parser = cast(httptools.HttpResponseParser, self._parser)  # it is calling back
        self.status_code = parser.get_status_code()
        self._keep_alive = parser.should_keep_alive()  # llhttp forgets it once the message is complete

    def on_body(self, body: bytes) -> None:
        self._pieces.append(body)
        self._buffered += len(body)

    def on_message_complete(self) -> None:
        self._done = True

    # the connection's calls
    def _received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:  # whole already: anything more is not this response's
            self._keep_alive = False
            self._connection.close()
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserError:
            self._failure = self._failure or "the response is not valid HTTP/1.1"
            self._connection.close()
        if self._done:
            self._drop_parser()
        elif self._buffered > PAUSE_BYTES and not self._paused:  # a reader that is not keeping up
            self._paused = True
            self._connection.pause_reading()
        _wake(self._waiter)

    def _ended(self, exc: Exception | None) -> None:
        if not self._done:
            if exc is not None:
                self._failure = self._failure or type(exc).__name__
            elif self._head_done and "content-length" not in self.headers and \
                    "chunked" not in self.headers.get("transfer-encoding", "").lower():
                self._done = True  # a body that ends with the connection
                self._drop_parser()
            else:
                self._failure = self._failure or "the connection closed mid-response"
        _wake(self._waiter)

    def _drop_parser(self) -> None:
        # The parser calls back this response's methods: a reference cycle, which would leave each
        # response to the cyclic collector. Once the message is whole (or abandoned) it is cut.
        self._parser = None

    def _let_go(self) -> None:
        """Cuts this response's ties to its parser and its connection (each a reference cycle)."""
        self._drop_parser()
        if self._connection.response is self:
            self._connection.response = None

    async def _next(self, deadline: Callable[[], float] | None = None) -> None:
        """Waits for the next bytes or the end, within io_timeout_s (Interrupted) and, if given, the
        caller's deadline (loop time; TimeoutError, the caller's to name)."""
        if self._failure is not None:
            raise Interrupted(self._failure)
        loop = asyncio.get_running_loop()
        io_deadline = loop.time() + self._client.io_timeout_s
        at = io_deadline if deadline is None else min(io_deadline, deadline())
        waiter = self._waiter = loop.create_future()
        timer = loop.call_at(at, _wake, waiter, _EXPIRED)
        try:
            expired = await waiter is _EXPIRED
        finally:
            timer.cancel()
            self._waiter = None
        if expired and not self._pieces and not self._done and self._failure is None:
            if at < io_deadline:
                raise TimeoutError
            raise Interrupted("the upstream sent nothing in time")
        if self._failure is not None and not self._pieces and not self._done:
            raise Interrupted(self._failure)

    async def read_head(self) -> None:
        while not self._head_done:
            await self._next()
        if 100 <= self.status_code < 200:  # an interim response: the one that counts follows
            raise Interrupted("an interim (1xx) response is not supported")

    async def aiter_bytes(self, deadline: Callable[[], float] | None = None) -> AsyncIterator[bytes]:
        """The body as it comes, one bytes per read from the socket (an event stream's chunks, each a
        piece to the parser, are joined). deadline: called before each read from the socket, the
        loop time by which that read must have data, or TimeoutError (one timer per read, not per
        piece or line: a fast upstream's whole stream is often one read)."""
        while True:
            if self._pieces:
                yield self._take()
                continue  # more may have come, the end too, while the caller had this piece
            if self._done:
                return
            await self._next(deadline)

    async def aread(self, limit: int | None = None) -> bytes:
        """The whole body; BodyTooLarge as soon as more than `limit` bytes have come (if given)."""
        pieces: list[bytes] = []
        size = 0
        while True:
            if self._pieces:
                pieces.append(piece := self._take())
                size += len(piece)
                if limit is not None and size > limit:
                    raise BodyTooLarge()
                continue
            if self._done:
                return b"".join(pieces)
            await self._next()

    def _take(self) -> bytes:
        """The body's bytes that have come and are unread; a paused connection reads again."""
        pieces, self._pieces, self._buffered = self._pieces, [], 0
        if self._paused:
            self._paused = False
            self._connection.resume_reading()
        return b"".join(pieces)

    async def aiter_lines(self, deadline: Callable[[], float] | None = None) -> AsyncIterator[str]:
        """The body's lines as text, without their line ends (\\n or \\r\\n); deadline as aiter_bytes'."""
        async for lines in self.aiter_line_lists(deadline):
            for line in lines:
                yield line

    async def aiter_line_lists(self, deadline: Callable[[], float] | None = None) -> AsyncIterator[list[str]]:
        """aiter_lines' lines, in one list per read that completes any: a reader of many short lines
        (an event stream, two lines per event) resumes once per socket read, not per line."""
        pending = b""
        async for piece in self.aiter_bytes(deadline):
            # A line break is never part of a multi-byte UTF-8 sequence: the complete lines decode as one text.
            complete, newline, pending = (pending + piece).rpartition(b"\n")
            if newline:
                yield [line.removesuffix("\r") for line in complete.decode("utf-8", errors="replace").split("\n")]
        if pending:
            yield [pending.removesuffix(b"\r").decode("utf-8", errors="replace")]

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        self._let_go()
        connection = self._connection
        if self._done and self._keep_alive and self._failure is None and not connection.closed:
            if self._paused:
                connection.resume_reading()  # an idle connection reads again, to notice its close
            self._client._release(connection)
        else:
            await connection.aclose()
