"""`tenantgate engine serve` behind the same edge as the gateway's ports (engine/remote/edge.py),
over raw loopback sockets: the header cap, the head and body deadlines and the connection bound,
and an envelope checked before a byte of the body is read, so a caller without a signed token
makes the replica buffer nothing and hold no socket."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

from devkit.server import TENANTGATE, gateway_env, tenantgate_serve
from engine.remote import ENVELOPE_HEADER
from engine.remote.server import MAX_BODY_BYTES
from tests.engine.remote.test_server import ENGINE_FLAGS, ENV
from tests.utils import edge
from tests.utils.edge import Listener
from tests.utils.signing import write_key_pair

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 32
MAX_HEADER_BYTES = 32 << 10  # the default
GARBAGE = f"{ENVELOPE_HEADER}: not-a-token\r\n".encode()


@pytest.fixture(scope="module")
def replica(demo_model_dir, tmp_path_factory) -> Iterator[Listener]:
    root = tmp_path_factory.mktemp("edge-replica")
    signer = write_key_pair(root / "public", root / "private", "gateway")
    flags = ("--envelope-public-keys", str(root / "public"), "--header-timeout", str(HEADER_TIMEOUT_S),
             "--body-timeout", str(BODY_TIMEOUT_S), "--max-connections", str(MAX_CONNECTIONS))
    with tenantgate_serve(root, gateway_env(), *ENGINE_FLAGS, *flags, command=("engine", "serve")) as process:
        # A token that passes every check but the body's: the body is then read.
        def signed() -> bytes:
            token = signer.sign(ENV, f"edge-{time.monotonic_ns()}", b"the body it was signed for")
            return f"{ENVELOPE_HEADER}: {token}\r\n".encode()

        yield Listener(process, process.port, get_path="/healthz", post_path="/v1/engine/generate",
                       post_headers=signed)


def _garbage_generate_head(content_length: int) -> bytes:
    return (f"POST /v1/engine/generate HTTP/1.1\r\nHost: replica\r\nContent-Type: application/json\r\n"
            f"Content-Length: {content_length}\r\n").encode() + GARBAGE + b"\r\n"


def test_a_header_over_the_cap_gets_431_and_is_never_buffered(replica: Listener) -> None:
    edge.check_oversized_heads_get_431_unbuffered(replica)


def test_a_trailer_over_the_cap_gets_413_and_is_never_buffered(replica: Listener) -> None:
    # After a valid token the parser may hold up to the 8 MiB body cap (and the head's 32 KiB) of it,
    # in buffers that grow by copying: 25 MiB measured at the first such trailer, once the engine
    # returned the free heap its load left at start (return_freed_memory); never the trailer's 64.
    edge.check_oversized_trailer_gets_413_unbuffered(replica, size=64 << 20, max_growth=4 * MAX_BODY_BYTES)


def test_a_header_under_the_cap_is_served_on_a_kept_alive_connection(replica: Listener) -> None:
    edge.check_head_under_the_cap_is_served_kept_alive(replica, MAX_HEADER_BYTES)


def test_slowloris_connections_are_closed_at_the_header_deadline(replica: Listener) -> None:
    edge.check_slowloris_closed_at_the_header_deadline(replica, HEADER_TIMEOUT_S, connections=24)


def test_a_signed_requests_slow_body_is_cut_off_at_the_body_deadline(replica: Listener) -> None:
    edge.check_slow_body_cut_off_at_its_deadline(replica, BODY_TIMEOUT_S)


def test_connections_beyond_the_bound_are_refused_without_being_held(replica: Listener) -> None:
    edge.check_connections_beyond_the_bound_refused_unheld(replica, MAX_CONNECTIONS)


def test_a_garbage_envelope_is_refused_before_a_byte_of_the_body_is_sent(replica: Listener) -> None:
    with edge.connect(replica.port) as sock:
        sock.sendall(_garbage_generate_head(MAX_BODY_BYTES))  # the 8 MiB it announces never come
        reply = edge.read_response(sock, timeout_s=3)
        closed = edge.closed_by_server(sock, timeout_s=3)
    assert reply.startswith(b"HTTP/1.1 403 "), reply[:80]
    assert edge.error(reply)["code"] == "malformed"
    assert closed, "the replica held the connection open for a body it had no use for"


def test_garbage_envelopes_with_8_mib_bodies_cost_no_memory_and_hold_no_socket(replica: Listener) -> None:
    process = replica.process
    baseline_sockets, before = process.open_sockets(), process.rss_bytes()
    socks = [edge.connect(replica.port) for _ in range(12)]
    # Each sends all of its 8 MiB body but the last byte, until the replica answers.
    replies = [edge.send_until_answered(sock, _garbage_generate_head(MAX_BODY_BYTES), size=MAX_BODY_BYTES - 1)
               for sock in socks]
    grown = process.rss_bytes() - before
    deadline = time.monotonic() + 5
    while process.open_sockets() > baseline_sockets + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    held = process.open_sockets() - baseline_sockets
    for sock in socks:
        sock.close()

    assert grown < 16 << 20, f"the replica grew by {grown >> 20} MiB for twelve unsigned 8 MiB bodies"
    assert all(reply.startswith(b"HTTP/1.1 403 ") for reply in replies), {r[:20] for r in replies}
    assert held <= 1, f"the replica still held {held} of the twelve connections"


def test_a_signed_body_over_the_cap_is_refused_by_its_length(replica: Listener) -> None:
    with edge.connect(replica.port) as sock:
        sock.sendall(replica.post_head(b"Content-Length: %d\r\n\r\n" % (MAX_BODY_BYTES + 1)))
        reply = edge.read_response(sock, timeout_s=5)
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:80]
    assert edge.error(reply)["code"] == "payload_too_large"



@pytest.mark.parametrize("flag, value", [("--max-header-bytes", "1024"), ("--body-timeout", "0"),
                                         ("--max-connections", "-1")])
def test_start_up_refuses_edge_limits_that_cannot_hold(flag: str, value: str, tmp_path) -> None:
    result = subprocess.run([TENANTGATE, "engine", "serve", "--model", "demo", flag, value,
                             "--envelope-public-keys", str(tmp_path)], env=gateway_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert flag.split("-")[-1] in result.stderr and "Traceback" not in result.stderr
