"""Running an admitted request on its deployments, and settling it once it ends.

A request may move to the next target (replica or deployment) while nothing has been sent and
the last target provably did not run it: a connection never made, a 5xx, or a first-output
timeout (the connection is then closed, which aborts the request there). A connection lost once
the request may have reached the target is not retried anywhere: it may be running (and charging)
there. After the first output a request never moves; a failure then ends the response with an
error. A deployment's own counts are taken only up to what the request could have used.

A Run ends in close(), which settles the token budget on the real counts, observes the GenAI
metrics and writes the audit record. Nothing else does, and close() does it once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from types import TracebackType

from opentelemetry.trace import SpanKind

from engine import EngineDeadError, RequestError, RequestOutput
from gateway.audit import digest_label
from gateway.context import Gateway
from gateway.deployments.base import (
    Embeddings,
    RunRequest,
    UpstreamIdle,
    UpstreamInterrupted,
    UpstreamRejected,
    UpstreamUnavailable,
)
from gateway.deployments.routing import Target
from gateway.errors import GatewayError, InvalidRequest, Unavailable
from gateway.pipeline.admission import Admitted, decision_summary
from gateway.pipeline.exchange import Exchange
from gateway.tracing import failed, first_output, headers_for

logger = logging.getLogger("tenantgate.gateway")

INTERRUPTED = ("the deployment closed the connection before answering; the request was not sent again, "
               "since it may have run there")
NO_TARGET = "no deployment of this model could take the request; retry shortly"


class ClientGone(Exception):
    """The caller disconnected before the answer was ready."""


class Run:
    """An admitted request on its deployments: iterating it yields the deployment's outputs, and it
    keeps what they told (the target that answered, usage, finish reasons, the text a content
    record keeps). Used as `async with run:`, a block that raises closes it with the error's status."""

    def __init__(self, gateway: Gateway, admitted: Admitted, exchange: Exchange) -> None:
        self.gateway = gateway
        self.admitted = admitted
        self._disconnected = exchange.disconnected
        self.deployment: Target | None = None  # the target that ran it
        self.prompt_tokens = admitted.prompt_tokens  # the gateway's count until a deployment reports its own
        self._reported_prompt = 0  # the deployment's last reported prompt count, before its bound
        self.output_tokens = 0
        params = admitted.params
        self._output_bound = params.max_tokens * params.n if params else 0  # per output, checked first
        self.cached_tokens = 0
        self.first_token_at: float | None = None  # perf_counter() at the deployment's first output token
        self.finish_reason: str | None = None  # choice 0's, else the last choice's to finish (the record's)
        self.finish_reasons: dict[int, str | None] = {}  # by choice
        # Tokens a deployment reported beyond what the request could have used, by usage field: not charged.
        self.usage_excess: dict[str, int] = {}
        # Each choice's text, kept only when the decision allows content in records.
        self._texts: dict[int, list[str]] | None = {} if admitted.keeps_content else None
        self._outputs: AsyncGenerator[RequestOutput, None] | None = None
        self._closed = False
        self._written: asyncio.Future | None = None  # the audit record, while it waits for the engine's

    @property
    def request_id(self) -> str:
        return self.admitted.request_id

    # -- outputs ----------------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        if self._outputs is None:
            self._outputs = self._attempts()
        return self._outputs

    async def first(self) -> RequestOutput | None:
        """The first output (None: the deployment sent none), or ClientGone if the caller left first."""

        async def next_output():
            try:
                return await anext(aiter(self))
            except StopAsyncIteration:
                return None

        return await self.until_disconnect(next_output())

    async def collect(self) -> list[RequestOutput]:
        """Every output to the end, or ClientGone (the request aborted) if the caller leaves first."""

        async def run() -> list[RequestOutput]:
            return [output async for output in self]

        return await self.until_disconnect(run())

    async def stop(self) -> None:
        """Ends the outputs: a request still running on its deployment is aborted."""
        if self._outputs is not None:
            await self._outputs.aclose()

    async def _attempts(self) -> AsyncGenerator[RequestOutput, None]:
        """The deployment's deltas; deployment trouble becomes a GatewayError."""
        admitted, router = self.admitted, self.gateway.router
        for target in admitted.targets:
            span = self._span(target)
            started = time.perf_counter()
            outputs = target.run(self._request(span))
            sent = False
            generated: dict[int, int] = {}  # output tokens per choice
            router.started(target)
            try:
                async for output in outputs:
                    if not sent:
                        sent = True
                        first_output(span, started)
                        self.deployment = target
                        router.succeeded(target)
                    self._observe(output, generated)
                    yield output
                return
            except UpstreamUnavailable as exc:
                failed(span, exc)
                router.failed(target, after_output=sent)
                logger.warning("deployment %s failed %s: %s", target.name,
                               "mid-stream" if sent else "before its first output", exc)
                if sent:
                    raise _mid_stream(exc) from None
                if isinstance(exc, UpstreamInterrupted):
                    raise Unavailable(INTERRUPTED, code="upstream_interrupted") from None
            except (UpstreamRejected, RequestError) as exc:
                raise self._refusal(target, span, exc) from None
            except EngineDeadError as exc:
                failed(span, exc)
                raise Unavailable("the inference engine is not running") from None
            except BaseException as exc:  # the caller went (cancelled, or the generator closed early)
                failed(span, exc)
                raise
            finally:
                router.ended(target)
                await _aclose(outputs)  # a request left unfinished is aborted here, not when collected
                span.set_attributes({"gen_ai.usage.output_tokens": self.output_tokens})
                span.end()
        raise Unavailable(NO_TARGET, headers={"Retry-After": "1"})

    def _observe(self, output: RequestOutput, generated: dict[int, int]) -> None:
        if self.first_token_at is None and output.num_output_tokens:
            self.first_token_at = time.perf_counter()
        generated[output.index] = output.num_output_tokens
        total = output.num_output_tokens if len(generated) == 1 else sum(generated.values())
        if total > self._output_bound or self.usage_excess:
            total = self._bounded_output(total)
        self.output_tokens = total
        self.cached_tokens = output.num_cached_tokens
        # Engines report the prompt's count with every output: bounded again only when it changes.
        if output.num_prompt_tokens and output.num_prompt_tokens != self._reported_prompt:
            self._reported_prompt = output.num_prompt_tokens
            self.prompt_tokens = self._bounded_prompt(output.num_prompt_tokens)
        if self._texts is not None:
            self._texts.setdefault(output.index, []).append(output.new_text)
        if output.finished:
            self.finish_reasons[output.index] = output.finish_reason
            self.finish_reason = self.finish_reasons.get(0, output.finish_reason)

    async def embed(self) -> Embeddings:
        """Runs an embeddings request on its targets, moving to the next on a deployment failure
        (nothing has been sent yet); the caller's disconnect abandons it (ClientGone)."""

        async def run() -> Embeddings:
            router = self.gateway.router
            for target in self.admitted.targets:
                span = self._span(target)
                router.started(target)
                try:
                    result = await target.embed(self._request(span))
                except UpstreamUnavailable as exc:
                    failed(span, exc)
                    router.failed(target, after_output=False)
                    logger.warning("deployment %s failed before its answer: %s", target.name, exc)
                    if isinstance(exc, UpstreamInterrupted):
                        raise Unavailable(INTERRUPTED, code="upstream_interrupted") from None
                    continue
                except (UpstreamRejected, RequestError) as exc:
                    raise self._refusal(target, span, exc) from None
                except BaseException as exc:
                    failed(span, exc)
                    raise
                finally:
                    router.ended(target)
                    span.end()
                router.succeeded(target)
                self.deployment = target
                if result.prompt_tokens:
                    self.prompt_tokens = self._bounded_prompt(result.prompt_tokens)
                return result
            raise Unavailable(NO_TARGET, headers={"Retry-After": "1"})

        return await self.until_disconnect(run())

    async def until_disconnect(self, awaitable: Awaitable):
        """Awaits `awaitable` in the caller's task; when the caller disconnects first, that task is
        cancelled (inside the engine stream, cancellation aborts the engine request) and ClientGone
        raised. Awaited in place, not in a task of its own: that cost two turns of the event loop."""
        task = asyncio.current_task()
        assert task is not None
        watching, gone = True, False

        def on_disconnect(watch: asyncio.Future) -> None:
            nonlocal gone
            # Only while the work runs: a disconnect noticed after it returned cancels nothing.
            if watching and not watch.cancelled() and watch.exception() is None:
                gone = True
                task.cancel()

        watch = asyncio.ensure_future(self._disconnected())
        watch.add_done_callback(on_disconnect)
        try:
            return await awaitable
        except asyncio.CancelledError:
            if gone:
                gone = False
                if task.uncancel() == 0:  # ours alone; a cancellation from elsewhere goes on
                    raise ClientGone() from None
            raise
        finally:
            watching = False
            watch.cancel()
            if gone:  # the work returned despite the cancellation: it is spent
                task.uncancel()

    def _request(self, span) -> RunRequest:
        """What one attempt asks its target, with the attempt's span as its traceparent."""
        admitted = self.admitted
        ask = admitted.ask
        return RunRequest(request_id=admitted.request_id, route=ask.deployment_route,
                          tenant_id=admitted.principal.tenant_id, envelope=admitted.envelope, params=admitted.params,
                          token_ids=admitted.token_ids, body=ask.body, embed_inputs=ask.embed_inputs,
                          embed_texts=ask.embed_texts, headers=headers_for(span))

    def _span(self, target: Target):
        """The span of one attempt on a target: `engine` in this process, `upstream` (a client span,
        whose context goes to the deployment as its traceparent) for a replica or an upstream."""
        kind = SpanKind.CLIENT if target.remote else SpanKind.INTERNAL
        return self.admitted.trace.start("upstream" if target.remote else "engine", kind=kind,
                                         attributes={"tenantgate.deployment": target.name})

    def _refusal(self, target: Target, span, exc: UpstreamRejected | RequestError) -> InvalidRequest:
        """The caller's 400 for a request its deployment (or this engine) refused as it was asked."""
        failed(span, exc, error=False)
        if isinstance(exc, UpstreamRejected):
            self.deployment = target
            return InvalidRequest(exc.message, param=exc.param, code=exc.code)
        # The engine names a schema response_format; it may have come from tools or text.format.
        param = self.admitted.ask.schema_param if exc.param == "response_format" else exc.param
        return InvalidRequest(exc.caller_message(param), param=param, code=exc.code)

    # -- what a deployment may charge ---------------------------------------------------------------

    def _bounded_output(self, reported: int) -> int:
        """Output tokens as counted, at most max_tokens for each choice; any excess is noted."""
        return self._bounded("completion_tokens", reported, self._output_bound)

    def _bounded_prompt(self, reported: int) -> int:
        """A deployment's prompt count, at most what the request could have run: the ids the gateway
        sent (or its encoder's inputs) exactly; for text, the request body's UTF-8 bytes, since no
        tokenizer makes more tokens than the bytes it reads and the JSON around the text is longer
        than a chat template's markup. Any excess is noted."""
        admitted, ask = self.admitted, self.admitted.ask
        if admitted.token_ids or ask.embed_inputs is not None:
            bound = ask.prompt_tokens if ask.embed_inputs is not None else len(admitted.token_ids)
        elif reported <= ask.prompt_tokens:
            return reported
        else:
            bound = max(ask.prompt_tokens, len(json.dumps(ask.body, separators=(",", ":")).encode()))
        return self._bounded("prompt_tokens", reported, bound)

    def _bounded(self, kind: str, reported: int, bound: int) -> int:
        if reported <= bound:
            self.usage_excess.pop(kind, None)
            return reported
        self.usage_excess[kind] = reported - bound
        return bound

    # -- the end ----------------------------------------------------------------------------------

    async def __aenter__(self) -> Run:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        """Closes the run when the block raised: with the error's status, or 499 for a caller who left."""
        if exc is None:
            return
        if isinstance(exc, GatewayError):
            self.close(status=exc.status_code, outcome="error", error_code=exc.code)
        else:
            self.close(status=499, outcome="client_disconnected")

    async def completed(self) -> None:
        """Closes a run whose answer is ready, and returns once its audit record is in the trail: a
        success is answered only after this (a gateway killed between the answer and the write would
        leave an acknowledged request without its record). Raises AuditUnavailable when the trail
        could not keep the record; the answer is then a 503, never the success. Shielded, so a
        caller who goes meanwhile can't cancel the write."""
        self.close(status=200, outcome="completed")
        if self._written is not None:
            await asyncio.shield(self._written)

    def close(self, *, status: int, outcome: str, error_code: str | None = None) -> None:
        """Settles the token budget, observes the GenAI metrics and hands over the audit record; a
        second call does nothing. error_code: the GatewayError's code when outcome is "error"."""
        if self._closed:
            return
        self._closed = True
        gateway, admitted = self.gateway, self.admitted
        used = self.prompt_tokens + self.output_tokens
        if not gateway.limiter.settle_at_once(admitted.ticket, used):
            # A task of its own: settling must happen even when the caller's task is being cancelled.
            settle = asyncio.get_running_loop().create_task(gateway.limiter.settle(admitted.ticket, used))
            gateway.background.add(settle)
            settle.add_done_callback(gateway.background.discard)
        ended = time.perf_counter()
        gateway.metrics.served(
            admitted.route, admitted.ask.model,
            admitted.judgement.decision.logging.metrics_name or digest_label(admitted.ticket.admission.tenant),
            input_tokens=self.prompt_tokens, output_tokens=self.output_tokens, duration_s=ended - admitted.started,
            first_token_s=None if self.first_token_at is None else self.first_token_at - admitted.started,
            error_type=None if outcome == "completed" else error_code or outcome,
        )
        record = self._record(status, outcome, error_code, ended)
        target = self.deployment
        admitted.trace.set({
            "gen_ai.response.id": admitted.request_id, "gen_ai.response.model": admitted.ask.model,
            "gen_ai.usage.input_tokens": self.prompt_tokens, "gen_ai.usage.output_tokens": self.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": self.cached_tokens,
            "gen_ai.response.finish_reasons": [self.finish_reason] if self.finish_reason else None,
            "tenantgate.deployment": target.name if target is not None else None,
        })
        span = admitted.trace.start("audit")
        self._written = gateway.audit.write_after_engine(target, admitted.request_id, record)
        if self._written is None:
            span.end()
        else:
            self._written.add_done_callback(lambda _: span.end())  # the record waits for the engine's x-record

    def _record(self, status: int, outcome: str, error_code: str | None, ended: float) -> dict:
        gateway, admitted = self.gateway, self.admitted
        decision = admitted.judgement.decision
        target = self.deployment
        max_tokens = admitted.params.max_tokens if admitted.params is not None else 0  # embeddings sample nothing
        record = {
            "decision_id": admitted.decision_id,
            "request_id": admitted.request_id,
            "route": admitted.route,
            **gateway.audit.principal_digests(admitted.principal),
            "policy_revision": admitted.judgement.revision,
            "decision": decision_summary(decision) | {"max_tokens": max_tokens},
            "model": admitted.ask.model,
            "deployment": target.name if target is not None else None,
            "model_fingerprint": target.fingerprint if target is not None else None,
            "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.output_tokens,
                      "cached_tokens": self.cached_tokens},
            "finish_reason": self.finish_reason,
            "latency_ms": round((ended - admitted.started) * 1000, 3),
            "status": status,
            "outcome": outcome,
        }
        if error_code is not None:
            record["error_code"] = error_code
        if self.usage_excess:
            # What the deployment reported beyond the request's bounds (the usage above is what was charged).
            record["usage_excess"] = dict(self.usage_excess)
            for kind, tokens in self.usage_excess.items():
                gateway.metrics.deployment_usage_excess.labels(target.name if target is not None else "none",
                                                               kind).inc(tokens)
        if self._texts is not None:
            content = gateway.audit.content(decision, admitted.ask.body, self._kept_text())
            if content is not None:
                record["content"] = content
        return record

    def _kept_text(self) -> str | list[str]:
        """The completion for a content record: its text, or with n > 1 each choice's (a list)."""
        texts = self._texts or {}
        response = "".join(texts.get(0, ()))
        if any(index > 0 for index in texts):
            return [response, *("".join(texts.get(i, ())) for i in range(1, self.admitted.ask.n))]
        return response


async def _aclose(outputs: AsyncIterator[RequestOutput]) -> None:
    """Closes a target's stream of outputs (an async generator, on every target here)."""
    aclose = getattr(outputs, "aclose", None)
    if aclose is not None:
        await aclose()


def _mid_stream(exc: UpstreamUnavailable) -> Unavailable:
    if isinstance(exc, UpstreamIdle):
        return Unavailable("the deployment stopped sending while answering; the response is incomplete",
                           code="upstream_idle_timeout")
    return Unavailable("the deployment failed while answering; the response is incomplete")
