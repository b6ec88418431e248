"""Pure ASGI middleware (no BaseHTTPMiddleware: it buffers streams and breaks disconnect handling)."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.remote import EdgeRefusal, new_edge_request_id, read_body
from gateway.pipeline.exchange import Exchange
from gateway.tracing import CALLER_HEADER, PROPAGATOR, RequestTrace

logger = logging.getLogger("tenantgate.gateway")

# Paths that become metric labels; anything else is "other", so labels stay bounded.
_ROUTES = {"/v1/chat/completions": "chat.completions", "/v1/completions": "completions", "/v1/models": "models",
           "/v1/embeddings": "embeddings", "/v1/responses": "responses", "/healthz": "healthz",
           "/readyz": "readyz"}
_PREFIXES = (("/v1/models/", "models"), ("/v1/responses/", "responses"))


class UnexpectedErrors:
    """The outermost layer: an exception no handler turned into a response ends here.

    Starlette answers it (the gateway's handler: a fixed 500 in OpenAI's shape, its frames in the
    log without its message) and then re-raises it, and uvicorn would log it again with its
    message, which may quote request content. Here it stops; lifespan errors pass on, so a
    failed start still fails.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        except Exception as exc:  # noqa: BLE001 - answered and logged already, see above
            logger.debug("request ended by %s (answered with 500)", type(exc).__name__)


REQUEST_ID_HEADER = "x-request-id"
_NO_EXCHANGE = Exchange()  # a call the pipeline never saw: nothing set


def exchange_in(scope: Scope) -> Exchange:
    """The call's Exchange (gateway/deps.py makes it), or an empty one."""
    return scope.get("state", {}).get("exchange", _NO_EXCHANGE)


class ResponseHeaders:
    """Puts x-request-id on every response, errors included, and the headers the handlers chose
    for this request (decision id, x-ratelimit-*, ...) on whichever response it ends with.

    Outside Starlette's own error layer, so a 500 it answers carries them too. The request id is
    the pipeline's once a handler has made one, else one made here.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                present = {name.lower() for name, _ in headers}
                exchange = exchange_in(scope)
                extra = {REQUEST_ID_HEADER: exchange.request_id or new_edge_request_id(), **exchange.response_headers}
                headers += [(name.encode(), value.encode()) for name, value in extra.items()
                            if name.encode() not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


class StatusRecorder:
    """A `send` that passes every message on and remembers the response's status (500 until one starts)."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.status = 500

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self.send(message)


_OUTCOMES = {401: "unauthenticated", 429: "rate_limited"}


def request_outcome(status: int, decision: str) -> str:
    """The gateway request histogram's outcome: a handful of values, whatever the status."""
    if decision == "deny":
        return "denied"  # by policy (403, or 404 for a model the tenant may not use)
    if status < 400:
        return "ok"
    return _OUTCOMES.get(status, "client_error" if status < 500 else "error")


class RequestMetrics:
    """Counts requests by route, status and decision outcome (which the handlers put in scope state),
    and times each whole request, from its first byte to its last (a stream's too)."""

    def __init__(self, app: ASGIApp, metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = StatusRecorder(send)
        started = time.perf_counter()
        try:
            await self.app(scope, receive, sent)
        finally:
            path = scope.get("path", "")
            route = _ROUTES.get(path) or next((label for prefix, label in _PREFIXES if path.startswith(prefix)),
                                              "other")
            exchange = exchange_in(scope)
            decision = exchange.decision
            self.metrics.request_count(route, str(sent.status), decision, exchange.tenant_label).inc()
            self.metrics.request_time(route, request_outcome(sent.status, decision)).observe(
                time.perf_counter() - started)


class RequestsBeforeShutdown:
    """Holds the app's lifespan shutdown until the requests still running have ended (up to grace_s).

    At the end of its graceful shutdown timeout uvicorn cancels the requests still running and
    goes straight on to the lifespan shutdown. A cancelled request still cleans up after itself
    (it aborts its engine request, which frees its KV blocks, and hands over its audit record),
    and that must happen before the shutdown stops the engine and drains the audit trail.
    """

    def __init__(self, app: ASGIApp, grace_s: float = 5.0) -> None:
        self.app = app
        self.grace_s = grace_s
        self.running: set[asyncio.Task] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._after_requests(receive), send)
            return
        task = asyncio.current_task()
        if task is None:  # not called from a task (never under a server): nothing to wait for
            await self.app(scope, receive, send)
            return
        self.running.add(task)
        try:
            await self.app(scope, receive, send)
        finally:
            self.running.discard(task)

    def _after_requests(self, receive: Receive) -> Receive:
        async def receive_lifespan() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown" and self.running:
                await asyncio.wait(set(self.running), timeout=self.grace_s)
            return message

        return receive_lifespan


class BodySizeLimit:
    """Refuses bodies over `max_bytes` with 413 (by Content-Length, or by reading the body first).

    The body is read here in full (the app would read it all anyway) and replayed to the
    app, so an oversized body is refused before any handler, body parser or authentication
    sees it. A slow one is the edge's to cut off (engine/remote/edge.py: 408 at its deadline).
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        try:
            body = await read_body(scope.get("headers", ()), receive, self.max_bytes)
        except EdgeRefusal as refusal:
            await _send_refusal(send, refusal)
            return
        if body is None:
            return  # the client left before its body arrived
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _send_refusal(send: Send, refusal: EdgeRefusal) -> None:
    body = json.dumps(refusal.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RequestTracing:
    """Starts the server span of each /v1 request (pure ASGI, so streams keep flowing), as a child
    of the caller's traceparent, and ends it with the response's status once the body is sent.
    The tracer is the app's (app.state.tracer, set at start-up); without one this passes through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tracer = getattr(scope["app"].state, "tracer", None) if "app" in scope else None
        if tracer is None or scope["type"] != "http" or not scope.get("path", "").startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        carrier = {"traceparent": value.decode("latin-1")  # noqa: B035 - the caller's last traceparent wins
                   for name, value in scope.get("headers", ()) if name == CALLER_HEADER}
        method = scope["method"]
        span = tracer.start_span(
            method, context=PROPAGATOR.extract(carrier), kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.scheme": scope.get("scheme", "http")})
        state = scope.setdefault("state", {})
        state["trace"] = request_trace = RequestTrace(tracer, span)
        sent = StatusRecorder(send)
        try:
            await self.app(scope, receive, sent)
        except BaseException as exc:
            state.setdefault("error_type", type(exc).__name__)  # answered by the outermost layer
            raise
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None)  # /v1/models/{model}: never the caller's path
            if template:
                span.set_attribute("http.route", template)
                if not request_trace.named:
                    span.update_name(f"{method} {template}")
            status = sent.status
            span.set_attribute("http.response.status_code", status)
            if status >= 400:
                span.set_attribute("error.type", state.get("error_type") or str(status))
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR))
            span.end()
