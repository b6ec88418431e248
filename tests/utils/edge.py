"""Probes of a listener's edge (engine/remote/edge.py) over raw loopback sockets, and the checks
every listener of the product must pass: the gateway's API and operator ports
(tests/gateway/test_edge.py) and an engine replica (tests/engine/remote/test_edge.py)."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from devkit.server import ServeProcess

PADDING = b"a" * 65536


@dataclass
class Listener:
    """One port of a serving process, and requests it answers: `get_path` a GET with 200, and
    `post_path` a POST whose body it reads (with `post_headers()`, what the POST needs for that)."""

    process: ServeProcess
    port: int
    get_path: str
    post_path: str
    post_headers: Callable[[], bytes] = lambda: b""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def post_head(self, framing: bytes) -> bytes:
        """The head of a POST to post_path: its own headers, then `framing` (Content-Length or
        Transfer-Encoding and what follows)."""
        return (f"POST {self.post_path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n".encode()
                + self.post_headers() + framing)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def read_to_close(sock: socket.socket, timeout_s: float = 2.0) -> bytes:
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


def closed_by_server(sock: socket.socket, timeout_s: float) -> bool:
    """Whether the server closes (or resets) the connection within timeout_s, whatever it sends first."""
    sock.setblocking(True)
    deadline = time.monotonic() + timeout_s
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(65536):
                return True
    except TimeoutError:
        return False
    except OSError:  # reset
        return True
    return False


def read_response(sock: socket.socket, timeout_s: float = 10.0) -> bytes:
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


def answers(socks: list[socket.socket], timeout_s: float = 3.0) -> list[bytes]:
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


def error(answer: bytes) -> dict:
    return json.loads(answer.partition(b"\r\n\r\n")[2])["error"]


def trickle(sock: socket.socket, byte: bytes, window_s: float) -> float | None:
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


def send_until_answered(sock: socket.socket, start: bytes, size: int = 16 << 20) -> bytes:
    """Sends `start`, then up to `size` bytes of padding until the server answers; returns what it
    sent before it closed the connection (or went quiet for 2 s)."""
    sock.sendall(start)
    sock.setblocking(False)
    sent = 0
    while sent < size:
        try:
            sent += sock.send(PADDING[: size - sent])
        except BlockingIOError:
            pass
        except OSError:  # closed by the server
            break
        if select.select([sock], [], [], 0.005)[0]:
            break
    return read_to_close(sock)


# -- the checks every listener passes --------------------------------------------------------


def check_oversized_heads_get_431_unbuffered(listener: Listener) -> None:
    before = listener.process.rss_bytes()
    socks = [connect(listener.port) for _ in range(4)]  # four unfinished 16 MiB headers
    start = f"GET {listener.get_path} HTTP/1.1\r\nHost: edge\r\nX-Padding: ".encode()
    replies = [send_until_answered(sock, start) for sock in socks]
    grown = listener.process.rss_bytes() - before
    for sock in socks:
        sock.close()

    assert grown < 8 << 20, f"the server grew by {grown >> 20} MiB while four 16 MiB headers arrived"
    for reply in replies:
        assert reply.startswith(b"HTTP/1.1 431 "), reply[:80]
        assert b"connection: close" in reply
        assert error(reply)["code"] == "request_header_fields_too_large"


def check_oversized_trailer_gets_413_unbuffered(listener: Listener, size: int = 16 << 20,
                                                max_growth: int = 8 << 20) -> None:
    """A chunked body's trailer is a header after the body, kept whole by the parser until it ends:
    one of `size` bytes grows the server by less than `max_growth` (what the listener's body cap
    lets the parser hold)."""
    before = listener.process.rss_bytes()
    with connect(listener.port) as sock:
        reply = send_until_answered(sock, listener.post_head(b"Transfer-Encoding: chunked\r\n\r\n"
                                                             b"1\r\n{\r\n0\r\nX-Padding: "), size)
    grown = listener.process.rss_bytes() - before
    assert grown < max_growth, f"the server grew by {grown >> 20} MiB while a {size >> 20} MiB trailer arrived"
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:80]
    assert error(reply)["code"] == "payload_too_large"


def check_head_under_the_cap_is_served_kept_alive(listener: Listener, max_header_bytes: int) -> None:
    request = (f"GET {listener.get_path} HTTP/1.1\r\nHost: edge\r\nX-Padding: ".encode()
               + b"a" * (max_header_bytes - 200) + b"\r\n\r\n")
    with connect(listener.port) as sock:
        for _ in range(2):  # the second head gets the whole budget again
            sock.sendall(request)
            reply = read_response(sock)
            assert reply.startswith(b"HTTP/1.1 200 "), reply[:80]


def check_slowloris_closed_at_the_header_deadline(listener: Listener, header_timeout_s: float,
                                                  connections: int = 48) -> None:
    socks = [connect(listener.port) for _ in range(connections)]
    for sock in socks:
        sock.sendall(f"GET {listener.get_path} HTTP/1.1\r\nHost: edge\r\nX-Slow: ".encode())
    start = time.monotonic()
    answered: dict[int, bytes] = {}
    while len(answered) < len(socks) and time.monotonic() - start < header_timeout_s + 5:
        waiting = [sock for i, sock in enumerate(socks) if i not in answered]
        for sock in waiting:
            try:
                sock.send(b"x")  # one header byte at a time: never idle, never done
            except OSError:
                answered[socks.index(sock)] = b""
        for sock in select.select(waiting, [], [], 0.2)[0]:
            answered[socks.index(sock)] = read_to_close(sock)
    elapsed = time.monotonic() - start
    for sock in socks:
        sock.close()

    assert len(answered) == len(socks), f"{len(socks) - len(answered)} slow connections were still open"
    assert elapsed < header_timeout_s + 3
    assert all(reply.startswith(b"HTTP/1.1 408 ") for reply in answered.values())
    assert error(answered[0])["code"] == "request_timeout"


def check_slow_body_cut_off_at_its_deadline(listener: Listener, body_timeout_s: float) -> None:
    with connect(listener.port) as sock:
        sock.sendall(listener.post_head(b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"))
        took = trickle(sock, b" ", body_timeout_s + 5)
        reply = read_to_close(sock)
    assert took is not None and took < body_timeout_s + 2, "the slow body was never cut off"
    assert reply.startswith(b"HTTP/1.1 408 "), reply[:80]
    assert error(reply)["code"] == "request_timeout"


def check_connections_beyond_the_bound_refused_unheld(listener: Listener, max_connections: int) -> None:
    baseline = listener.process.open_sockets()
    held = [connect(listener.port) for _ in range(max_connections)]
    for sock in held:  # served, then idle on keep-alive: open, and counted, for a few seconds
        sock.sendall(f"GET {listener.get_path} HTTP/1.1\r\nHost: edge\r\n\r\n".encode())
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    extra = [connect(listener.port) for _ in range(200)]
    replies = answers(extra)
    server_sockets = listener.process.open_sockets()
    for sock in held + extra:
        sock.close()

    assert all(reply.startswith(b"HTTP/1.1 503 ") for reply in replies), {r[:20] for r in replies}
    assert b"retry-after: 1" in replies[0].lower()
    assert server_sockets <= baseline + max_connections + 2, f"the server holds {server_sockets - baseline} sockets"
    # Closed connections free their places.
    deadline = time.monotonic() + 5
    while listener.process.open_sockets() > baseline + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(listener.base_url + listener.get_path, timeout=5).status_code == 200
