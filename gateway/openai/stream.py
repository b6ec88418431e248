"""Server-sent events for an admitted request: the first delta is awaited before the
response starts, so early refusals still get their own status code; after that, errors
travel as an SSE error event and the stream ends."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import Request
from fastapi.responses import StreamingResponse

from engine import RequestOutput
from gateway.deps import Gateway
from gateway.errors import AuditUnavailable, GatewayError
from gateway.openai.answers import DONE, sse, usage
from gateway.pipeline.accounting import finish, recorded
from gateway.pipeline.admission import Admitted
from gateway.pipeline.execution import stream_outputs, until_disconnect

logger = logging.getLogger("tenantgate.gateway")

_EXHAUSTED = object()


async def _next(iterator: AsyncIterator[RequestOutput]):
    try:
        return await anext(iterator)
    except StopAsyncIteration:
        return _EXHAUSTED


async def sse_response(gateway: Gateway, admitted: Admitted, request: Request,
                       chunks: Callable[[RequestOutput], list[dict]], usage_chunk: Callable[[], dict] | None,
                       opening: Callable[[], dict] | None = None) -> StreamingResponse:
    """Streams `chunks(output)` for each engine delta, then the usage chunk (if asked) and [DONE]."""
    return await event_stream(
        gateway, admitted, request, chunks,
        opening=lambda: [opening()] if opening is not None else [],
        closing=lambda: [usage_chunk() | {"usage": usage(admitted)}] if usage_chunk is not None else [],
        failed=GatewayError.body, encode=sse, done=lambda: DONE)


async def event_stream(gateway: Gateway, admitted: Admitted, request: Request,
                       events: Callable[[RequestOutput], list[dict]], *, opening: Callable[[], list[dict]],
                       closing: Callable[[], list[dict]], failed: Callable[[GatewayError], dict],
                       encode: Callable[[dict], bytes], done: Callable[[], bytes],
                       finishing: Callable[[], Awaitable[None]] | None = None,
                       unfinishing: Callable[[], Awaitable[None]] | None = None) -> StreamingResponse:
    """Streams the opening events, `events(output)` for each engine delta and the closing events
    (once the outputs are done, so usage is known), each through `encode`, then awaits
    `finishing()`; an error after the start becomes `failed(error)`. `done()` ends a completed
    stream once its record is written; a record the trail refuses ends it in an error instead,
    after `unfinishing()` has undone what `finishing()` did."""
    outputs = stream_outputs(gateway, admitted)
    first = await until_disconnect(request, _next(outputs))

    async def body() -> AsyncIterator[bytes]:
        status, outcome, error_code = 200, "client_disconnected", None
        try:
            for event in opening():
                yield encode(event)
            output = first
            while output is not _EXHAUSTED:
                for event in events(output):
                    yield encode(event)
                output = await _next(outputs)
            for event in closing():
                yield encode(event)
            if finishing is not None:
                await finishing()
            outcome = "completed"
        except GatewayError as exc:
            status, outcome, error_code = exc.status_code, "error", exc.code
            yield encode(failed(exc))
        except Exception as exc:  # noqa: BLE001 - the stream has started; say so in-band and end it
            status, outcome, error_code = 500, "error", GatewayError.code
            logger.error("stream failed with %s", type(exc).__name__)
            yield encode(failed(GatewayError("internal error")))
        finally:
            await outputs.aclose()  # aborts the engine request if it is still running
            written = finish(gateway, admitted, status=status, outcome=outcome, error_code=error_code)
        if outcome == "completed":
            try:
                await recorded(written)  # the end only once the record is in the trail
            except AuditUnavailable as exc:  # no record, so no [DONE]: the stream ends in an error
                if unfinishing is not None:
                    await unfinishing()
                yield encode(failed(exc))
                return
            yield done()

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Request-Id": admitted.request_id})
