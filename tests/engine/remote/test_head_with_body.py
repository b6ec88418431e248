"""HeadWithBody (engine/remote/edge.py): a response's head leaves with the first part of its body in
one write, and never waits longer than one turn of the event loop."""

from __future__ import annotations

import asyncio

from engine.remote.edge import HeadWithBody


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"extra {name}"


def test_a_head_and_the_body_that_follows_it_leave_in_one_write() -> None:
    async def respond() -> list[bytes]:
        transport = RecordingTransport()
        held = HeadWithBody(transport, asyncio.get_running_loop())
        held.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        held.write(b"{}")
        await asyncio.sleep(0)  # the loop turns: nothing is left to send
        return transport.writes

    assert asyncio.run(respond()) == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]


def test_a_head_whose_body_is_slow_leaves_when_the_loop_turns() -> None:
    async def respond() -> tuple[list[bytes], list[bytes]]:
        transport = RecordingTransport()
        held = HeadWithBody(transport, asyncio.get_running_loop())
        held.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await asyncio.sleep(0)  # a stream waiting for its first token
        before_body = list(transport.writes)
        held.write(b"5\r\nhello\r\n")
        held.write(b"0\r\n\r\n")
        return before_body, transport.writes

    before_body, writes = asyncio.run(respond())
    assert before_body == [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"]
    assert writes == before_body + [b"5\r\nhello\r\n", b"0\r\n\r\n"]


def test_closing_sends_a_held_head_first_and_the_rest_passes_through() -> None:
    async def respond() -> RecordingTransport:
        transport = RecordingTransport()
        held = HeadWithBody(transport, asyncio.get_running_loop())
        held.write(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
        assert held.get_extra_info("peername") == "extra peername"
        held.close()
        await asyncio.sleep(0)  # and the loop's turn sends nothing twice
        return transport

    transport = asyncio.run(respond())
    assert transport.writes == [b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n"] and transport.closed
