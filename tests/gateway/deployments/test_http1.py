"""The upstream HTTP/1.1 client (gateway/deployments/http1.py) against servers over real sockets."""

import asyncio
import gc
import ssl
import weakref
from pathlib import Path

import pytest

from gateway.deployments.http1 import PAUSE_BYTES, BodyTooLarge, ConnectFailed, Http1Client, Interrupted
from gateway.deployments.openai_compatible import OpenAIUpstream
from tests.utils.tls import write_certificates
from tests.utils.upstreams import CHAT_BODY, deployment, upstream_call


class Server:
    """A loopback server that answers each request with the next of `answers` (raw bytes; None
    closes the connection unanswered), counting connections and requests."""

    def __init__(self, answers: list[bytes | None], tls: ssl.SSLContext | None = None) -> None:
        self.answers, self.connections, self.requests = list(answers), 0, []
        self.server: asyncio.Server | None = None
        self.handlers: set[asyncio.Task] = set()
        self.tls = tls

    async def __aenter__(self) -> "Server":
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.tls)
        scheme = "https" if self.tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1/chat/completions?x=1"
        return self

    async def __aexit__(self, *_) -> None:
        self.server.close()
        await self.server.wait_closed()
        if self.handlers:  # each ends once its client hangs up
            await asyncio.wait(self.handlers, timeout=2)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.handlers.add(asyncio.current_task())
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                self.requests.append(head + await reader.readexactly(length))
                answer = self.answers.pop(0)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
        except asyncio.IncompleteReadError:
            pass
        writer.close()
        await writer.wait_closed()


def client(expiry_s: float = 2.0) -> Http1Client:
    return Http1Client(connect_timeout_s=1.0, io_timeout_s=2.0, keepalive_expiry_s=expiry_s)


OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"a\": true}"


async def body_of(http: Http1Client, url: str, body: bytes = b"{}") -> bytes:
    """One call: the response's whole body, the response closed (its connection pooled when whole)."""
    response = await http.send("POST", url, {}, body)
    try:
        return await response.aread()
    finally:
        await response.aclose()


async def test_the_request_is_written_as_http_1_1_and_the_body_read_by_its_length() -> None:
    async with Server([OK]) as server:
        http = client()
        response = await http.send("POST", server.url, {"Authorization": "Bearer t", "Host": "evil"}, b"{}")
        assert (response.status_code, response.headers["content-type"], await response.aread()) == (
            200, "application/json", b'{"a": true}')
        await response.aclose()
        await http.aclose()
    head = server.requests[0].split(b"\r\n")
    assert head[0] == b"POST /v1/chat/completions?x=1 HTTP/1.1"
    assert b"Authorization: Bearer t" in head and [h for h in head if h.lower().startswith(b"host:")] == [
        b"Host: " + server.url.split("/")[2].encode()]  # the caller's Host is never sent
    assert server.requests[0].endswith(b"\r\n\r\n{}")


async def test_a_kept_alive_connection_is_reused_within_its_expiry_and_not_after() -> None:
    async with Server([OK, OK, OK]) as server:
        http = client(expiry_s=0.3)
        for pause in (0, 0.5):
            await body_of(http, server.url)
            await asyncio.sleep(pause)
        await body_of(http, server.url)
        await http.aclose()
    assert (server.connections, len(server.requests)) == (2, 3)


async def test_a_body_closed_before_its_end_or_marked_close_is_never_reused() -> None:
    closing = OK.replace(b"content-length", b"connection: close\r\ncontent-length")
    partial = OK.replace(b"content-length: 11", b"content-length: 99")  # the rest never comes
    async with Server([partial, closing, OK]) as server:
        http = client()
        first = await http.send("POST", server.url, {}, b"{}")
        await first.aclose()  # before its end
        await body_of(http, server.url)
        assert await body_of(http, server.url) == b'{"a": true}'
        await http.aclose()
    assert server.connections == 3


async def test_a_response_read_or_abandoned_goes_when_its_last_reference_does() -> None:
    # Without a reference cycle (the parser calls the response back): the cyclic collector, which
    # is off here, would be the only way to free it.
    partial = OK.replace(b"content-length: 11", b"content-length: 99")
    async with Server([OK, partial]) as server:
        http = client()
        gc.disable()
        try:
            read = await http.send("POST", server.url, {}, b"{}")
            await read.aread()
            await read.aclose()
            abandoned = await http.send("POST", server.url, {}, b"{}")
            await abandoned.aclose()  # before its end
            refs = [weakref.ref(read), weakref.ref(abandoned)]
            del read, abandoned
            assert [ref() for ref in refs] == [None, None]
        finally:
            gc.enable()
        await http.aclose()


async def test_a_chunked_event_stream_is_read_as_lines_across_chunk_boundaries() -> None:
    events = b"data: {\"x\": 1}\r\n\r\ndata: [DONE]\n\n"
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(events[i:i + 5]), events[i:i + 5]) for i in range(0, len(events), 5))
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + chunks
    async with Server([answer + b"0\r\n\r\n"]) as server:
        http = client()
        response = await http.send("POST", server.url, {}, b"{}")
        assert [line async for line in response.aiter_lines()] == ['data: {"x": 1}', "", "data: [DONE]", ""]
        await response.aclose()
        await http.aclose()


async def test_lines_read_in_lists_are_the_lines_decoded_one_by_one() -> None:
    """aiter_line_lists decodes a read's complete lines at once: the same text, invalid UTF-8 and
    a multi-byte character cut by a read included."""
    body = "data: é漢🙂\r\n\r\n".encode() + b"bad \xe2\x82\r\n\xff\n\xe2\n\x82 end\r\nlast \xf0\x9f"
    expected = [line.removesuffix(b"\r").decode("utf-8", errors="replace") for line in body.split(b"\n")]
    for size in (1, 3, 7, len(body)):
        pieces = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size])
                          for i in range(0, len(body), size))
        answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + pieces + b"0\r\n\r\n"
        async with Server([answer]) as server:
            http = client()
            response = await http.send("POST", server.url, {}, b"{}")
            lists = [lines async for lines in response.aiter_line_lists()]
            await response.aclose()
            await http.aclose()
        assert [line for lines in lists for line in lines] == expected


async def test_failures_say_whether_the_request_may_have_been_sent() -> None:
    async with Server([]) as server:
        port = server.server.sockets[0].getsockname()[1]
    with pytest.raises(ConnectFailed):  # nothing listens there now
        await client().send("POST", f"http://127.0.0.1:{port}/v1", {}, b"{}")
    async with Server([None]) as server:
        with pytest.raises(Interrupted, match="closed mid-response"):
            await client().send("POST", server.url, {}, b"{}")
    cut = OK[:-4]
    async with Server([cut, None]) as server:
        response = await client().send("POST", server.url, {}, b"{}")
        with pytest.raises(Interrupted):
            await response.aread()
        await response.aclose()
    async with Server([b"not http at all\r\n\r\n"]) as server:
        with pytest.raises(Interrupted, match="not valid HTTP"):
            await client().send("POST", server.url, {}, b"{}")


async def test_a_silent_server_times_out_each_read() -> None:
    handlers = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.append(asyncio.current_task())
        await reader.readuntil(b"\r\n\r\n")
        await reader.read()  # answers nothing; ends when the client hangs up
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    http = Http1Client(connect_timeout_s=1.0, io_timeout_s=0.2, keepalive_expiry_s=1.0)
    with pytest.raises(Interrupted, match="nothing in time"):
        await http.send("POST", f"http://127.0.0.1:{port}/", {}, b"{}")
    await asyncio.wait(handlers, timeout=2)  # the client hung up: the connection was closed
    assert all(task.done() for task in handlers)
    server.close()
    await server.wait_closed()


async def test_a_header_that_would_break_the_head_is_refused_before_anything_is_sent() -> None:
    async with Server([OK]) as server:
        http = client()
        for headers in ({"api-key": "secret\n"}, {"x-a": "b\r\nx-injected: 1"}, {"bad:name": "v"},
                        {"x-a": "snow \u2603"}):
            with pytest.raises(ConnectFailed, match="nothing was sent") as refused:
                await http.send("POST", server.url, headers, b"{}")
            assert "secret" not in str(refused.value) and "injected" not in str(refused.value)
        await http.aclose()
    assert (server.connections, server.requests) == (0, [])


async def test_expired_idle_connections_are_closed_when_another_comes_back() -> None:
    async with Server([OK, OK, OK]) as server:
        http = client(expiry_s=0.2)
        first = await http.send("POST", server.url, {}, b"{}")
        second = await http.send("POST", server.url, {}, b"{}")  # a connection of its own: the first's is busy
        await first.aread()
        await second.aread()
        await first.aclose()
        await asyncio.sleep(0.3)  # the first's connection expires idle
        await second.aclose()  # its return closes the expired one
        assert len(http._idle[next(iter(http._idle))]) == 1
        await http.aclose()


async def test_an_upstream_call_sends_each_header_once() -> None:
    body = b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris"}, ' \
           b'"finish_reason": "stop"}]}'
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    async with Server([answer]) as server:
        upstream = OpenAIUpstream(deployment(url=server.url.split("/v1")[0] + "/v1"), "m")
        outputs = [o async for o in upstream.stream(upstream_call(CHAT_BODY | {"stream": False}))]
        await upstream.aclose()
    assert outputs[-1].finish_reason == "stop"
    names = [line.split(b":")[0].lower() for line in server.requests[0].split(b"\r\n\r\n")[0].split(b"\r\n")[1:]]
    assert len(names) == len(set(names)) and b"content-type" in names and b"user-agent" in names


async def test_a_reader_that_falls_behind_stops_the_connection_reading_and_loses_nothing() -> None:
    body = bytes(range(256)) * 8192  # 2 MiB, many times what a response buffers before it pauses
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    async with Server([answer, OK]) as server:
        http = client()
        response = await http.send("POST", server.url, {}, b"{}")
        await asyncio.sleep(0.2)  # the server writes all it can; the response stops reading
        assert response._paused and response._buffered <= PAUSE_BYTES + 256 * 1024  # one read past the mark at most
        received = bytearray()
        async for piece in response.aiter_bytes():
            received += piece
            await asyncio.sleep(0)
        assert bytes(received) == body
        await response.aclose()
        assert await body_of(http, server.url) == b'{"a": true}'  # the same connection, reading again
        await http.aclose()
    assert server.connections == 1


async def test_bytes_after_the_response_keep_its_connection_out_of_the_pool() -> None:
    async with Server([OK + OK, OK]) as server:  # a second, unasked-for response right behind the first
        http = client()
        assert await body_of(http, server.url) == b'{"a": true}'
        assert await body_of(http, server.url) == b'{"a": true}'
        await http.aclose()
    assert server.connections == 2


async def test_a_large_request_body_is_written_whole_while_the_server_reads_slowly() -> None:
    body = b"x" * (8 << 20)
    async with Server([OK]) as server:
        http = client()
        assert await body_of(http, server.url, body) == b'{"a": true}'
        await http.aclose()
    assert server.requests[0].endswith(body)


async def test_what_arrives_while_the_reader_holds_a_piece_is_read_after_it() -> None:
    """Bytes, and the message's end, can come in while the caller is busy with the piece before:
    the body's reader must hand them over before it says the body ended."""
    sent = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)  # the client holds "first" meanwhile
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()
        sent.set()
        await reader.read()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    http = client()
    response = await http.send("POST", f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/", {}, b"{}")
    pieces = []
    async for piece in response.aiter_bytes():
        pieces.append(piece)
        if len(pieces) == 1:
            await sent.wait()  # the rest and the end are in before the reader resumes
            await asyncio.sleep(0.05)
    assert b"".join(pieces) == b"firstsecond"
    await response.aclose()
    await http.aclose()
    server.close()
    await server.wait_closed()


async def test_a_body_read_with_a_limit_stops_past_it_and_its_connection_is_not_reused() -> None:
    longer = OK.replace(b"content-length: 11", b"content-length: 99")  # the rest never comes
    async with Server([OK, longer, OK]) as server:
        http = client()
        response = await http.send("POST", server.url, {}, b"{}")
        assert await response.aread(limit=11) == b'{"a": true}'  # exactly the limit
        await response.aclose()
        response = await http.send("POST", server.url, {}, b"{}")  # the same connection
        with pytest.raises(BodyTooLarge):
            await response.aread(limit=10)  # raised on the first 11 bytes, not at the end that never comes
        await response.aclose()
        assert await body_of(http, server.url) == b'{"a": true}'  # a new one
        await http.aclose()
    assert server.connections == 2


async def test_over_tls_a_connection_is_verified_reused_and_paced_by_its_reader(tmp_path: Path) -> None:
    ca, cert, key = write_certificates(tmp_path)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    body = bytes(range(256)) * 8192  # 2 MiB: the response pauses its connection on the way
    large = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    async with Server([OK, large, OK], tls=server_tls) as server:
        http = Http1Client(connect_timeout_s=1.0, io_timeout_s=2.0, keepalive_expiry_s=2.0,
                           ssl_context=ssl.create_default_context(cafile=str(ca)))
        assert await body_of(http, server.url) == b'{"a": true}'
        response = await http.send("POST", server.url, {}, b"{}")
        await asyncio.sleep(0.2)
        assert response._paused
        received = bytearray()
        async for piece in response.aiter_bytes():
            received += piece
        assert bytes(received) == body
        await response.aclose()
        untrusting = Http1Client(connect_timeout_s=1.0, io_timeout_s=2.0, keepalive_expiry_s=2.0,
                                 ssl_context=ssl.create_default_context())  # certifi's CAs: not ours
        with pytest.raises(ConnectFailed):
            await untrusting.send("POST", server.url, {}, b"{}")
        assert await body_of(http, server.url) == b'{"a": true}'
        await http.aclose()
    assert server.connections == 1  # all three answers on one connection (a failed handshake reaches no handler)
