"""The listener's own limits (gateway/edge.py, BodySizeLimit), against a real `tenantgate serve`
over raw loopback sockets: a request head over TENANTGATE_MAX_HEADER_BYTES gets 431 (and a
chunked body's trailer over it 413) without the server buffering it, heads and bodies that
trickle in are cut off at their deadlines before authentication, and connections beyond
TENANTGATE_MAX_CONNECTIONS are refused without being held."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from pydantic import ValidationError

from gateway.settings import Settings
from tests.gateway.api.conftest import serve_env
from devkit.server import ServeProcess, tenantgate_serve

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 64
MAX_HEADER_BYTES = 32 << 10  # the default
PADDING = b"a" * 65536


@pytest.fixture(scope="module")
def server(local_issuer, tmp_path_factory) -> Iterator[ServeProcess]:
    env = serve_env(local_issuer, TENANTGATE_HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
                    TENANTGATE_BODY_TIMEOUT_S=str(BODY_TIMEOUT_S), TENANTGATE_MAX_CONNECTIONS=str(MAX_CONNECTIONS))
    with tenantgate_serve(tmp_path_factory.mktemp("edge"), env) as running:
        yield running


def _connect(server: ServeProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=5)


def _read_to_close(sock: socket.socket, timeout_s: float = 2.0) -> bytes:
    """What the server sends until it closes (or resets) the connection, or sends nothing for timeout_s."""
    sock.setblocking(True)
    sock.settimeout(timeout_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def _read_response(sock: socket.socket, timeout_s: float = 10.0) -> bytes:
    """One whole HTTP/1.1 response with a Content-Length, however the segments arrive."""
    sock.settimeout(timeout_s)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def _answers(socks: list[socket.socket], timeout_s: float = 3.0) -> list[bytes]:
    """What the server sends on each socket until it closes it, all read together within timeout_s."""
    data = {sock: b"" for sock in socks}
    open_ = set(socks)
    deadline = time.monotonic() + timeout_s
    while open_ and time.monotonic() < deadline:
        for sock in select.select(list(open_), [], [], 0.1)[0]:
            chunk = sock.recv(65536)
            data[sock] += chunk
            if not chunk:
                open_.discard(sock)
    return [data[sock] for sock in socks]


def _error(answer: bytes) -> dict:
    return json.loads(answer.partition(b"\r\n\r\n")[2])["error"]


def _trickle(sock: socket.socket, byte: bytes, window_s: float) -> float | None:
    """Sends `byte` every 0.2 s until the server answers; the seconds that took, None if it never did."""
    start = time.monotonic()
    while time.monotonic() - start < window_s:
        try:
            sock.send(byte)
        except OSError:  # the server closed the connection
            return time.monotonic() - start
        if select.select([sock], [], [], 0.2)[0]:
            return time.monotonic() - start
    return None


def _send_until_answered(sock: socket.socket, start: bytes, size: int = 16 << 20) -> bytes:
    """Sends `start`, then up to `size` bytes of padding until the server answers; returns the answer."""
    sock.sendall(start)
    sock.setblocking(False)
    sent = 0
    while sent < size:
        try:
            sent += sock.send(PADDING)
        except BlockingIOError:
            pass
        except OSError:  # closed by the server
            break
        if select.select([sock], [], [], 0.005)[0]:
            break
    return _read_to_close(sock)


def test_a_header_over_the_cap_gets_431_and_is_never_buffered(server: ServeProcess) -> None:
    before = server.rss_bytes()
    socks = [_connect(server) for _ in range(4)]  # four unfinished 16 MiB headers
    answers = [_send_until_answered(sock, b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Padding: ") for sock in socks]
    grown = server.rss_bytes() - before
    for sock in socks:
        sock.close()

    assert grown < 8 << 20, f"the server grew by {grown >> 20} MiB while four 16 MiB headers arrived"
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]
        assert b"connection: close" in answer
        assert _error(answer)["code"] == "request_header_fields_too_large"


def test_a_trailer_over_the_cap_gets_413_and_is_never_buffered(server: ServeProcess) -> None:
    # A chunked body's trailer is a header after the body, kept whole by the parser until it ends.
    before = server.rss_bytes()
    with _connect(server) as sock:
        answer = _send_until_answered(sock, b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
                                            b"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n0\r\nX-Padding: ")
    grown = server.rss_bytes() - before
    assert grown < 8 << 20, f"the server grew by {grown >> 20} MiB while a 16 MiB trailer arrived"
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:80]
    assert _error(answer)["code"] == "payload_too_large"


def test_a_header_under_the_cap_is_served_on_a_kept_alive_connection(server: ServeProcess) -> None:
    # A bearer token of TENANTGATE_MAX_TOKEN_BYTES (16 KiB) and the usual headers fit.
    request = b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Padding: " + b"a" * (MAX_HEADER_BYTES - 200) + b"\r\n\r\n"
    with _connect(server) as sock:
        for _ in range(2):  # the second head gets the whole budget again
            sock.sendall(request)
            answer = _read_response(sock)
            assert answer.startswith(b"HTTP/1.1 200 "), answer[:80]
            assert answer.endswith(b'{"status":"ok"}')


def test_slowloris_connections_are_closed_at_the_header_deadline(server: ServeProcess) -> None:
    socks = [_connect(server) for _ in range(48)]
    for sock in socks:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Slow: ")
    start = time.monotonic()
    answered: dict[int, bytes] = {}
    while len(answered) < len(socks) and time.monotonic() - start < HEADER_TIMEOUT_S + 5:
        waiting = [sock for i, sock in enumerate(socks) if i not in answered]
        for sock in waiting:
            try:
                sock.send(b"x")  # one header byte at a time: never idle, never done
            except OSError:
                answered[socks.index(sock)] = b""
        for sock in select.select(waiting, [], [], 0.2)[0]:
            answered[socks.index(sock)] = _read_to_close(sock)
    elapsed = time.monotonic() - start
    for sock in socks:
        sock.close()

    assert len(answered) == len(socks), f"{len(socks) - len(answered)} slow connections were still open"
    assert elapsed < HEADER_TIMEOUT_S + 3
    assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answered.values())
    assert _error(answered[0])["code"] == "request_timeout"


def test_a_slow_body_is_cut_off_with_408_before_authentication(server: ServeProcess) -> None:
    with _connect(server) as sock:
        # No Authorization header: had authentication come first, this would be a 401.
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{")
        took = _trickle(sock, b" ", BODY_TIMEOUT_S + 5)
        answer = _read_to_close(sock)
    assert took is not None and took < BODY_TIMEOUT_S + 2, "the slow body was never cut off"
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
    assert _error(answer)["code"] == "request_timeout"


def test_connections_beyond_the_bound_are_refused_without_being_held(server: ServeProcess) -> None:
    baseline = server.open_sockets()
    held = [_connect(server) for _ in range(MAX_CONNECTIONS)]
    for sock in held:  # served, then idle on keep-alive: open, and counted, for a few seconds
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    extra = [_connect(server) for _ in range(200)]
    answers = _answers(extra)
    server_sockets = server.open_sockets()
    for sock in held + extra:
        sock.close()

    assert all(answer.startswith(b"HTTP/1.1 503 ") for answer in answers), {a[:20] for a in answers}
    assert b"retry-after: 1" in answers[0].lower()
    assert server_sockets <= baseline + MAX_CONNECTIONS + 2, f"the server holds {server_sockets - baseline} sockets"
    # Closed connections free their places.
    deadline = time.monotonic() + 5
    while server.open_sockets() > baseline + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(server.base_url + "/healthz", timeout=5).status_code == 200


def test_the_header_cap_must_leave_room_for_a_bearer_token() -> None:
    with pytest.raises(ValidationError, match="room for a bearer token"):
        Settings(max_header_bytes=16 << 10)  # max_token_bytes is 16 KiB
    assert Settings().max_header_bytes >= Settings().max_token_bytes + 1024
