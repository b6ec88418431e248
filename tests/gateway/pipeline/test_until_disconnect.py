"""Run.until_disconnect awaits the work in the caller's own task: a caller who leaves first cancels
the work (ClientGone), and nothing else is ever cancelled: not the work of a caller who stays, not
the request's later steps when the disconnect is noticed just after the work returned, and a
cancellation from elsewhere stays a cancellation."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from gateway.pipeline.run import ClientGone, Run


def caller(gone: asyncio.Event) -> SimpleNamespace:
    """What until_disconnect reads of a Run: how to wait for the caller's disconnect."""
    return SimpleNamespace(_disconnected=gone.wait)


async def steps(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_the_work_of_a_caller_who_stays_returns_its_result() -> None:
    async def scenario():
        async def work():
            await steps(3)
            return "answer"

        result = await Run.until_disconnect(caller(asyncio.Event()), work())
        await steps(3)  # the request's later steps run uncancelled
        return result, asyncio.current_task().cancelling()

    assert asyncio.run(scenario()) == ("answer", 0)


def test_a_caller_who_leaves_cancels_the_work() -> None:
    aborted = []

    async def scenario():
        gone = asyncio.Event()

        async def work():
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                aborted.append(True)  # the engine request is aborted here
                raise

        asyncio.get_running_loop().call_later(0.01, gone.set)
        with pytest.raises(ClientGone):
            await Run.until_disconnect(caller(gone), work())
        await steps(3)  # the 499 is answered and recorded, uncancelled
        return asyncio.current_task().cancelling()

    assert asyncio.run(scenario()) == 0
    assert aborted == [True]


@pytest.mark.parametrize("disconnect_first", [True, False])
def test_a_disconnect_noticed_as_the_work_returns_cancels_nothing_after_it(disconnect_first: bool) -> None:
    # The disconnect and the work's last step land in the same turn of the event loop, in either
    # order: the outcome is the answer or ClientGone, and the steps after it are never cancelled.
    async def scenario():
        gone, done = asyncio.Event(), asyncio.Event()

        async def work():
            await done.wait()
            return "answer"

        loop = asyncio.get_running_loop()
        first, second = (gone.set, done.set) if disconnect_first else (done.set, gone.set)
        loop.call_soon(first)
        loop.call_soon(second)
        try:
            outcome = await Run.until_disconnect(caller(gone), work())
        except ClientGone:
            outcome = "gone"
        await steps(5)
        return outcome, asyncio.current_task().cancelling()

    outcome, cancelling = asyncio.run(scenario())
    assert outcome in ("answer", "gone") and cancelling == 0


def test_a_cancellation_from_elsewhere_is_not_taken_for_a_disconnect() -> None:
    async def scenario():
        async def request():
            await Run.until_disconnect(caller(asyncio.Event()), asyncio.sleep(60))

        task = asyncio.ensure_future(request())
        await steps(2)
        task.cancel()  # the server shutting down, say
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
