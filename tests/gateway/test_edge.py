"""The gateway's listeners behind the edge (engine/remote/edge.py, BodySizeLimit), against a real
`tenantgate serve` over raw loopback sockets, on the API port and on the operator port alike: a
request head over TENANTGATE_MAX_HEADER_BYTES gets 431 (and a chunked body's trailer over it 413)
without the server buffering it, heads and bodies that trickle in are cut off at their deadlines
before authentication, and connections beyond TENANTGATE_MAX_CONNECTIONS are refused without
being held."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from devkit.server import ServeProcess, free_port, tenantgate_serve
from gateway.settings import Settings
from tests.gateway.api.conftest import serve_env
from tests.utils import edge
from tests.utils.edge import Listener

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 64
MAX_HEADER_BYTES = 32 << 10  # the default


@pytest.fixture(scope="module")
def server(local_issuer, tmp_path_factory) -> Iterator[tuple[ServeProcess, int]]:
    """A `tenantgate serve` and its operator port."""
    operator_port = free_port()
    env = serve_env(local_issuer, TENANTGATE_HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
                    TENANTGATE_BODY_TIMEOUT_S=str(BODY_TIMEOUT_S), TENANTGATE_MAX_CONNECTIONS=str(MAX_CONNECTIONS),
                    TENANTGATE_METRICS_PORT=str(operator_port))
    with tenantgate_serve(tmp_path_factory.mktemp("edge"), env) as running:
        yield running, operator_port


@pytest.fixture(params=["api", "operator"])
def listener(request, server) -> Listener:
    process, operator_port = server
    if request.param == "api":  # the body is read before authentication: no Authorization header
        return Listener(process, process.port, get_path="/healthz", post_path="/v1/chat/completions")
    # The console's sign-in form reads its body (a token); it needs no session.
    return Listener(process, operator_port, get_path="/metrics", post_path="/console/login")


def test_a_header_over_the_cap_gets_431_and_is_never_buffered(listener: Listener) -> None:
    edge.check_oversized_heads_get_431_unbuffered(listener)


def test_a_trailer_over_the_cap_gets_413_and_is_never_buffered(listener: Listener) -> None:
    edge.check_oversized_trailer_gets_413_unbuffered(listener)


def test_a_header_under_the_cap_is_served_on_a_kept_alive_connection(listener: Listener) -> None:
    # A bearer token of TENANTGATE_MAX_TOKEN_BYTES (16 KiB) and the usual headers fit.
    edge.check_head_under_the_cap_is_served_kept_alive(listener, MAX_HEADER_BYTES)


def test_slowloris_connections_are_closed_at_the_header_deadline(listener: Listener) -> None:
    edge.check_slowloris_closed_at_the_header_deadline(listener, HEADER_TIMEOUT_S)


def test_a_slow_body_is_cut_off_with_408_before_authentication(listener: Listener) -> None:
    # No credentials: had authentication come first, this would be a 401.
    edge.check_slow_body_cut_off_at_its_deadline(listener, BODY_TIMEOUT_S)


def test_connections_beyond_the_bound_are_refused_without_being_held(listener: Listener) -> None:
    edge.check_connections_beyond_the_bound_refused_unheld(listener, MAX_CONNECTIONS)


def test_a_body_over_the_cap_is_refused_by_its_length_before_a_byte_is_read(listener: Listener) -> None:
    with edge.connect(listener.port) as sock:
        sock.sendall(listener.post_head(b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                                        % (Settings().max_body_bytes + 1)))
        reply = edge.read_response(sock, timeout_s=5)
        closed = edge.closed_by_server(sock, timeout_s=3)  # the body it announced is not waited for
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:80]
    assert edge.error(reply)["code"] == "payload_too_large"
    assert closed


def test_a_get_answered_before_its_body_arrived_does_not_hold_the_connection(listener: Listener) -> None:
    # The app answers a GET at once; before the edge, the body it announced kept the socket open
    # for as long as a byte came now and then.
    with edge.connect(listener.port) as sock:
        sock.sendall(f"GET {listener.get_path} HTTP/1.1\r\nHost: edge\r\nContent-Length: 100000\r\n\r\n".encode())
        reply = edge.read_response(sock, timeout_s=5)
        took = edge.trickle(sock, b" ", 5)
    assert reply.startswith(b"HTTP/1.1 200 "), reply[:80]
    assert took is not None and took < 3, "the connection was still open 5 s after its answer"


def test_the_header_cap_must_leave_room_for_a_bearer_token() -> None:
    with pytest.raises(ValidationError, match="room for a bearer token"):
        Settings(max_header_bytes=16 << 10)  # max_token_bytes is 16 KiB
    assert Settings().max_header_bytes >= Settings().max_token_bytes + 1024
