"""Running an admitted request on its deployments.

A request may move to the next target (replica or deployment) while nothing has been sent and
the last target provably did not run it: a connection never made, a 5xx, or a first-output
timeout (the connection is then closed, which aborts the request there). A connection lost once
the request may have reached the target is not retried anywhere: it may be running (and charging)
there. After the first output a request never moves; a failure then ends the response with an
error. A deployment's own counts are taken only up to what the request could have used.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

from fastapi import Request
from opentelemetry.trace import SpanKind

from engine import EngineDeadError, RequestError, RequestOutput
from gateway.deployments.base import (
    Embeddings,
    UpstreamIdle,
    UpstreamInterrupted,
    UpstreamRejected,
    UpstreamUnavailable,
)
from gateway.deps import Gateway
from gateway.errors import InvalidRequest, Unavailable
from gateway.pipeline.admission import Admitted
from gateway.tracing import failed, first_output, headers_for

logger = logging.getLogger("tenantgate.gateway")


class ClientGone(Exception):
    """The caller disconnected before the answer was ready."""


async def stream_outputs(gateway: Gateway, admitted: Admitted) -> AsyncIterator[RequestOutput]:
    """The deployment's deltas for an admitted request; deployment trouble becomes a GatewayError."""
    for target in admitted.targets:
        span = deployment_span(admitted, target)
        started = time.perf_counter()
        outputs = target.run(admitted, headers_for(span))
        sent = False
        generated: dict[int, int] = {}  # output tokens per choice
        gateway.router.started(target)
        try:
            async for output in outputs:
                if not sent:
                    sent = True
                    first_output(span, started)
                    admitted.deployment = target
                    gateway.router.succeeded(target)
                if admitted.first_token_at is None and output.num_output_tokens:
                    admitted.first_token_at = time.perf_counter()
                generated[output.index] = output.num_output_tokens
                admitted.output_tokens = bounded_output(admitted, sum(generated.values()))
                admitted.cached_tokens = output.num_cached_tokens
                if output.num_prompt_tokens:
                    admitted.prompt_tokens = bounded_prompt(admitted, output.num_prompt_tokens)
                if admitted.texts is not None:
                    if output.index:
                        admitted.later_choice_texts.setdefault(output.index, []).append(output.new_text)
                    else:
                        admitted.texts.append(output.new_text)
                if output.finished:
                    admitted.finish_reasons[output.index] = output.finish_reason
                    admitted.finish_reason = admitted.finish_reasons.get(0, output.finish_reason)
                yield output
            return
        except UpstreamUnavailable as exc:
            failed(span, exc)
            gateway.router.failed(target, after_output=sent)
            logger.warning("deployment %s failed %s: %s", target.name,
                           "mid-stream" if sent else "before its first output", exc)
            if sent:
                raise mid_stream(exc) from None
            if isinstance(exc, UpstreamInterrupted):
                raise Unavailable(INTERRUPTED, code="upstream_interrupted") from None
        except (UpstreamRejected, RequestError) as exc:
            raise refusal(admitted, target, span, exc) from None
        except EngineDeadError as exc:
            failed(span, exc)
            raise Unavailable("the inference engine is not running") from None
        except BaseException as exc:  # the caller went (cancelled, or the generator closed early)
            failed(span, exc)
            raise
        finally:
            gateway.router.ended(target)
            await outputs.aclose()  # a request left unfinished is aborted here, not when collected
            span.set_attributes({"gen_ai.usage.output_tokens": admitted.output_tokens})
            span.end()
    raise Unavailable("no deployment of this model could take the request; retry shortly",
                      headers={"Retry-After": "1"})


INTERRUPTED = ("the deployment closed the connection before answering; the request was not sent again, "
               "since it may have run there")


def mid_stream(exc: UpstreamUnavailable) -> Unavailable:
    if isinstance(exc, UpstreamIdle):
        return Unavailable("the deployment stopped sending while answering; the response is incomplete",
                           code="upstream_idle_timeout")
    return Unavailable("the deployment failed while answering; the response is incomplete")


def bounded_output(admitted: Admitted, reported: int) -> int:
    """Output tokens as counted, at most max_tokens for each choice; any excess is noted."""
    bound = admitted.params.max_tokens * admitted.params.n if admitted.params is not None else 0
    return _bounded(admitted, "completion_tokens", reported, bound)


def bounded_prompt(admitted: Admitted, reported: int) -> int:
    """A deployment's prompt count, at most what the request could have run: the ids the gateway
    sent (or its encoder's inputs) exactly; for text, the request body's UTF-8 bytes, since no
    tokenizer makes more tokens than the bytes it reads and the JSON around the text is longer
    than a chat template's markup. Any excess is noted."""
    if admitted.token_ids or admitted.ask.embed_inputs is not None:
        bound = admitted.ask.prompt_tokens if admitted.ask.embed_inputs is not None else len(admitted.token_ids)
    elif reported <= admitted.ask.prompt_tokens:
        return reported
    else:
        bound = max(admitted.ask.prompt_tokens, len(json.dumps(admitted.ask.body, separators=(",", ":")).encode()))
    return _bounded(admitted, "prompt_tokens", reported, bound)


def _bounded(admitted: Admitted, kind: str, reported: int, bound: int) -> int:
    if reported <= bound:
        admitted.usage_excess.pop(kind, None)
        return reported
    admitted.usage_excess[kind] = reported - bound
    return bound


def refusal(admitted: Admitted, target, span, exc: UpstreamRejected | RequestError) -> InvalidRequest:
    """The caller's 400 for a request its deployment (or this engine) refused as it was asked."""
    failed(span, exc, error=False)
    if isinstance(exc, UpstreamRejected):
        admitted.deployment = target
        return InvalidRequest(exc.message, param=exc.param, code=exc.code)
    # The engine names a schema response_format; it may have come from tools or text.format.
    param = admitted.ask.schema_param if exc.param == "response_format" else exc.param
    return InvalidRequest(exc.caller_message(param), param=param, code=exc.code)


def deployment_span(admitted: Admitted, target):
    """The span of one attempt on a target: `engine` in this process, `upstream` (a client span,
    whose context goes to the deployment as its traceparent) for a replica or an upstream."""
    kind = SpanKind.CLIENT if target.remote else SpanKind.INTERNAL
    return admitted.trace.start("upstream" if target.remote else "engine", kind=kind,
                                attributes={"tenantgate.deployment": target.name})


async def embed(gateway: Gateway, admitted: Admitted, request: Request) -> Embeddings:
    """Runs an embeddings request on its targets, moving to the next on a deployment failure
    (nothing has been sent yet); the caller's disconnect abandons it."""

    async def run() -> Embeddings:
        for target in admitted.targets:
            span = deployment_span(admitted, target)
            gateway.router.started(target)
            try:
                result = await target.embed(admitted, headers_for(span))
            except UpstreamUnavailable as exc:
                failed(span, exc)
                gateway.router.failed(target, after_output=False)
                logger.warning("deployment %s failed before its answer: %s", target.name, exc)
                if isinstance(exc, UpstreamInterrupted):
                    raise Unavailable(INTERRUPTED, code="upstream_interrupted") from None
                continue
            except (UpstreamRejected, RequestError) as exc:
                raise refusal(admitted, target, span, exc) from None
            except BaseException as exc:
                failed(span, exc)
                raise
            finally:
                gateway.router.ended(target)
                span.end()
            gateway.router.succeeded(target)
            admitted.deployment = target
            if result.prompt_tokens:
                admitted.prompt_tokens = bounded_prompt(admitted, result.prompt_tokens)
            return result
        raise Unavailable("no deployment of this model could take the request; retry shortly",
                          headers={"Retry-After": "1"})

    return await until_disconnect(request, run())


async def until_disconnect(request: Request, awaitable):
    """Awaits `awaitable`, or cancels it and raises ClientGone when the caller disconnects first."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work = asyncio.ensure_future(awaitable)
    watch = asyncio.create_task(disconnected())
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()  # inside the engine stream, cancellation aborts the engine request
    if work not in done:
        try:
            await work
        except asyncio.CancelledError:
            pass
        raise ClientGone()
    return work.result()


async def collect(gateway: Gateway, admitted: Admitted, request: Request) -> list[RequestOutput]:
    """Runs a non-streaming request to its end, aborting it if the caller disconnects first."""

    async def run() -> list[RequestOutput]:
        return [output async for output in stream_outputs(gateway, admitted)]

    return await until_disconnect(request, run())
