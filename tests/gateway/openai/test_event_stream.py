"""EventStream: the events made since the last write leave together, a slow reader holds them back,
and a caller that leaves stops them, with their cleanup run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.openai.responder import EventStream


class Client:
    """An ASGI caller: records what is sent; `leave()` makes receive() report a disconnect."""

    def __init__(self, send_delay_s: float = 0.0) -> None:
        self.bodies: list[bytes] = []
        self.ends: list[bool] = []
        self.send_delay_s = send_delay_s
        self.left = asyncio.Event()

    async def receive(self) -> dict:
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.body":
            self.bodies.append(message["body"])
            self.ends.append(not message.get("more_body", False))
            await asyncio.sleep(self.send_delay_s)

    def leave(self) -> None:
        self.left.set()


async def serve(events: AsyncIterator[bytes], client: Client) -> None:
    await EventStream(events, headers={})({"type": "http"}, client.receive, client.send)


async def ticking(cleaned: asyncio.Event) -> AsyncIterator[bytes]:
    """Events that never end on their own; `cleaned` is set once their cleanup has run."""
    try:
        while True:
            yield b"tick"
            await asyncio.sleep(0.005)
    finally:
        cleaned.set()


async def test_events_made_without_a_pause_leave_in_one_write() -> None:
    async def events() -> AsyncIterator[bytes]:
        for i in range(16):
            yield b"data: %d\n\n" % i

    client = Client()
    await serve(events(), client)
    assert client.bodies == [b"".join(b"data: %d\n\n" % i for i in range(16))]
    assert client.ends == [True]


async def test_events_that_come_apart_leave_apart_and_the_last_write_ends_the_body() -> None:
    async def events() -> AsyncIterator[bytes]:
        for i in range(3):
            yield b"e%d" % i
            await asyncio.sleep(0.01)  # an engine step, or an upstream read, between events

    client = Client()
    await serve(events(), client)
    assert b"".join(client.bodies) == b"e0e1e2"
    assert len(client.bodies) >= 3
    assert client.ends[-1] and not any(client.ends[:-1])


async def test_a_slow_reader_holds_the_events_back() -> None:
    made = 0

    async def events() -> AsyncIterator[bytes]:
        nonlocal made
        for _ in range(64):
            made += 1
            yield b"x" * 4096

    client = Client(send_delay_s=0.05)
    task = asyncio.ensure_future(serve(events(), client))
    await asyncio.sleep(0.02)  # the first write is still being sent
    # Those in the first write, then at most MAX_PENDING_BYTES more before the events wait.
    assert made <= len(client.bodies[0]) // 4096 + EventStream.MAX_PENDING_BYTES // 4096 + 1 < 64
    await task
    assert b"".join(client.bodies) == b"x" * 4096 * 64


async def test_a_caller_that_leaves_stops_the_events_and_their_cleanup_runs() -> None:
    cleaned = asyncio.Event()

    client = Client()
    task = asyncio.ensure_future(serve(ticking(cleaned), client))
    await asyncio.sleep(0.03)
    client.leave()
    await asyncio.wait_for(task, 2)
    assert cleaned.is_set()
    assert client.bodies and all(body.startswith(b"tick") for body in client.bodies if body)


async def test_an_error_in_the_events_reaches_the_server() -> None:
    async def events() -> AsyncIterator[bytes]:
        yield b"first"
        raise RuntimeError("broken")

    client = Client()
    with pytest.raises(RuntimeError, match="broken"):
        await serve(events(), client)
    assert client.bodies[0] == b"first"


async def test_a_cancelled_response_cancels_the_events() -> None:
    cleaned = asyncio.Event()

    client = Client()
    task = asyncio.ensure_future(serve(ticking(cleaned), client))
    await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned.is_set()
