"""One responder for every endpoint: it drives a Run and the endpoint's Renderer, as one JSON body
or as server-sent events.

A stream's first output is awaited before the response starts, so early refusals still get their
own status code; after that, errors travel as an in-band error event and the stream ends. A
success (a whole body, or a stream's last event) is sent only once its audit record is in the trail.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import suppress

from fastapi.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from engine import CacheScope, RequestOutput, TokenLogprobs
from gateway.errors import AuditUnavailable, GatewayError
from gateway.pipeline.run import Run

logger = logging.getLogger("tenantgate.gateway")

DONE = b"data: [DONE]\n\n"


# What json.dumps(value, separators=(",", ":"), ensure_ascii=False) writes, without the encoder
# that dumps builds for every call with arguments of its own.
_compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def json_bytes(value: object) -> bytes:
    return _compact.encode(value).encode()


def sse(payload: dict) -> bytes:
    return b"data: " + json_bytes(payload) + b"\n\n"


class Renderer:
    """What one endpoint sends for a run: a stream's events (opening, one delta per output, closing)
    or the whole body. An endpoint's renderer fills in delta() and whole(), and what else differs."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def opening(self) -> list[dict]:
        """The events before the first delta (sent once the first output is in)."""
        return []

    def delta(self, output: RequestOutput) -> list[dict]:
        raise NotImplementedError

    def delta_events(self, output: RequestOutput) -> bytes:
        """delta()'s events as sent (b"" for none). A renderer may splice its most frequent event
        faster, byte for byte as encode() would write it."""
        return b"".join(map(self.encode, self.delta(output)))

    def closing(self) -> list[dict]:
        """The events after the last output, when usage is known."""
        return []

    def whole(self, outputs: list[RequestOutput]) -> dict:
        raise NotImplementedError

    def encode(self, event: dict) -> bytes:
        return sse(event)

    def error(self, error: GatewayError) -> dict:
        """The in-band event for an error after the stream started."""
        return error.body()

    def done(self) -> bytes:
        """A completed stream's last bytes, sent once its record is in the trail."""
        return DONE

    async def keep(self) -> None:
        """What a completed answer stores before its record is awaited (a stored response)."""

    async def forget(self) -> None:
        """Undoes keep() when the record could not be kept: the request is refused, so nothing it
        stored may be acknowledged."""


async def respond(run: Run, render: Renderer, *, stream: bool) -> Response:
    """The run's answer: its whole body, or its events as they come."""
    headers = {"X-Request-Id": run.request_id}
    if not stream:
        async with run:
            body = render.whole(await run.collect())
            await completed(run, render)
        return JSONResponse(body, headers=headers)
    async with run:  # a refusal before the first output is answered with its own status
        first = await run.first()
    return EventStream(_events(run, render, first), headers={"Cache-Control": "no-cache", **headers})


class EventStream(Response):
    """A server-sent event stream whose every write carries all the events made since the last one.

    Starlette's StreamingResponse writes each event on its own: a send through uvicorn, a syscall,
    about 40 µs on a loaded 2-core VM, 21 for a 16-token chat. Here the events are made in a task
    of their own and the response writes whatever has gathered each time it gets the loop: the
    events of one upstream socket read, or of one engine step, leave in one write. A slow reader
    holds the events back as before (they wait once MAX_PENDING_BYTES have gathered), and a
    disconnect cancels them, as Starlette's listener did: `events`' own cleanup runs either way.
    """

    MAX_PENDING_BYTES = 64 * 1024
    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], headers: dict[str, str]) -> None:
        self.events = events
        self.status_code = 200
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        pending: list[bytes] = []
        gathered = asyncio.Event()  # events are pending, or there will be no more
        room = asyncio.Event()  # the writer has taken what was pending
        ended = False

        async def make() -> None:
            nonlocal ended
            try:
                async for event in self.events:
                    pending.append(event)
                    gathered.set()
                    if sum(map(len, pending)) >= self.MAX_PENDING_BYTES:
                        room.clear()
                        await room.wait()
            finally:
                ended = True
                gathered.set()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            maker.cancel()

        maker = asyncio.ensure_future(make())
        watcher = asyncio.ensure_future(watch())
        try:
            last = False
            while not last:
                await gathered.wait()
                gathered.clear()
                last = ended  # the events' end goes out with the last of them
                if pending or last:
                    body = b"".join(pending)
                    pending.clear()
                    room.set()
                    await send({"type": "http.response.body", "body": body, "more_body": not last})
            with suppress(asyncio.CancelledError):  # cancelled: the caller left
                await maker  # raises what the events raised, as StreamingResponse would
        finally:
            for task in (maker, watcher):
                if not task.done():
                    task.cancel()
                    with suppress(asyncio.CancelledError):
                        await task


async def completed(run: Run, render: Renderer) -> None:
    """Keeps what the answer stores, then closes the run once its record is in the trail (undoing the
    store when the trail refuses the record: AuditUnavailable)."""
    await render.keep()
    try:
        await run.completed()
    except AuditUnavailable:
        await render.forget()
        raise


async def _events(run: Run, render: Renderer, first: RequestOutput | None) -> AsyncIterator[bytes]:
    status, outcome, error_code = 200, "client_disconnected", None
    try:
        for event in render.opening():
            yield render.encode(event)
        output = first
        while output is not None:
            if events := render.delta_events(output):
                yield events
            output = await anext(aiter(run), None)
        for event in render.closing():
            yield render.encode(event)
        await render.keep()
        outcome = "completed"
    except GatewayError as exc:
        status, outcome, error_code = exc.status_code, "error", exc.code
        yield render.encode(render.error(exc))
    except Exception as exc:  # noqa: BLE001 - the stream has started; say so in-band and end it
        status, outcome, error_code = 500, "error", GatewayError.code
        logger.error("stream failed with %s", type(exc).__name__)
        yield render.encode(render.error(GatewayError("internal error")))
    finally:
        await run.stop()  # aborts the engine request if it is still running
        if outcome != "completed":
            run.close(status=status, outcome=outcome, error_code=error_code)
    if outcome != "completed":
        return
    try:
        await run.completed()  # the end only once the record is in the trail
    except AuditUnavailable as exc:  # no record, so no [DONE]: the stream ends in an error
        await render.forget()
        yield render.encode(render.error(exc))
        return
    yield render.done()


def usage(run: Run) -> dict:
    prompt = run.prompt_tokens
    # In the shared scope a hit may come from another tenant's prompt: reporting it would tell the
    # caller what others sent. The audit record keeps the real figure.
    shared = run.admitted.envelope.cache_scope is CacheScope.SHARED
    return {
        "prompt_tokens": prompt,
        "completion_tokens": run.output_tokens,
        "total_tokens": prompt + run.output_tokens,
        "prompt_tokens_details": {"cached_tokens": 0 if shared else run.cached_tokens},
    }


def finish_reason(reason: str | None) -> str | None:
    # The engine's "abort" never reaches a caller that is still listening, except at shutdown.
    return "stop" if reason == "abort" else reason


def system_fingerprint(run: Run) -> str:
    """The fingerprint of the target that answered (before the first output: the first choice)."""
    target = run.deployment or run.admitted.targets[0]
    return "fp_" + target.fingerprint[:12]


def chat_logprobs(token_text, logprobs: list[TokenLogprobs]) -> list[dict]:
    def entry(token_id: int, logprob: float) -> dict:
        text = token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return [
        {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, p) for t, p in lp.top]}
        for lp in logprobs
    ]


def joined(outputs: list[RequestOutput]) -> tuple[str, list[TokenLogprobs]]:
    return "".join(o.new_text for o in outputs), [lp for o in outputs for lp in o.logprobs]


def joined_by_choice(outputs: list[RequestOutput], n: int) -> list[tuple[str, list[TokenLogprobs]]]:
    """Each choice's text and logprobs, in choice order (joined, for n choices)."""
    return [joined([o for o in outputs if o.index == index]) for index in range(n)]
