"""`tenantgate engine serve`: the engine as its own HTTP service, for gateways on the pod network.

It runs only what a gateway signed: every generate request carries an envelope token
(engine/remote/signing.py) bound to its request id and body. What of it needs no body (form,
key id, signature, lifetime, replay) is checked before a byte of the body is read; the body is
then read under a cap (MAX_BODY_BYTES) and the edge's deadline, and checked against the token's
digest. A refused token is a 403 and the engine sees nothing. Endpoints:

    POST /v1/engine/generate   {"request_id", "token_ids", "params"} -> NDJSON deltas, then the x-record
    GET  /v1/engine/load       {"queue_depth", "kv_usage"}, for the gateway's routing
    GET  /v1/engine/info       model name, fingerprint, max_model_len
    GET  /healthz  /readyz  /metrics
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from engine.async_engine import AsyncLLMEngine
from engine.envelope import ExecutionEnvelope
from engine.errors import EngineDeadError, RequestError
from engine.llm_engine import LLMEngine
from engine.remote.edge import NO_NATIVE_TELEMETRY, EdgeRefusal, read_body
from engine.remote.protocol import (
    ENVELOPE_HEADER,
    GENERATE_PATH,
    INFO_PATH,
    LOAD_PATH,
    NDJSON,
    output_to_json,
    params_from_json,
    record_to_json,
)
from engine.remote.signing import REJECTION_REASONS, EnvelopeRejected, EnvelopeVerifier, VerifiedToken
from engine.telemetry import PendingRecords, PrometheusSink

logger = logging.getLogger("tenantgate.engine.server")

# Token ids as JSON take up to ~7 bytes each: room for a 1M-token prompt, and a bound on what a
# signed token makes the server buffer before its digest is checked against the body.
MAX_BODY_BYTES = 8 << 20
_BODY_FIELDS = {"request_id", "token_ids", "params"}


class _Refused(Exception):
    def __init__(self, status: int, kind: str, message: str, *, code: str | None = None,
                 param: str | None = None) -> None:
        self.status, self.kind, self.message, self.code, self.param = status, kind, message, code, param

    def response(self) -> JSONResponse:
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        return JSONResponse({"error": error}, status_code=self.status)


class EngineServer:
    """The engine, its async front, the envelope verifier and the server's own metrics."""

    def __init__(self, engine: LLMEngine, verifier: EnvelopeVerifier, *, model_name: str,
                 registry: CollectorRegistry | None = None) -> None:
        self.engine = engine
        self.async_engine = AsyncLLMEngine(engine)
        self.verifier = verifier
        self.model_name = model_name
        self.registry = registry or CollectorRegistry()
        self.records = PendingRecords()
        metrics = PrometheusSink(self.registry)
        metrics.watch(engine)
        engine.sinks.extend([metrics, self.records])
        self.rejections = Counter("tenantgate_envelope_rejections", "Envelope tokens refused (403), by reason.",
                                  ["reason"], registry=self.registry)
        for reason in REJECTION_REASONS:
            self.rejections.labels(reason)

    def load(self) -> dict:
        # Read from the HTTP thread while the engine thread steps: lengths only, each read atomic.
        scheduler = self.engine.scheduler
        return {"queue_depth": len(scheduler.waiting) + len(scheduler.running),
                "kv_usage": round(self.engine.kv_usage(), 6)}

    def info(self) -> dict:
        return {"model": self.model_name, "fingerprint": self.engine.fingerprint,
                "max_model_len": self.engine.max_model_len}

    def verify_token(self, request: Request) -> VerifiedToken:
        """The request's envelope token, checked as far as it can be without the body."""
        with self._refusing():
            token = request.headers.get(ENVELOPE_HEADER)
            if token is None:
                raise EnvelopeRejected("missing")
            return self.verifier.verify_token(token)

    def verify_body(self, token: VerifiedToken, body: bytes) -> tuple[ExecutionEnvelope, str]:
        with self._refusing():
            return self.verifier.verify_body(token, body)

    @contextmanager
    def _refusing(self) -> Iterator[None]:
        try:
            yield
        except EnvelopeRejected as exc:
            self.rejections.labels(exc.reason).inc()
            logger.warning("envelope refused: %s", exc.reason)
            raise _Refused(403, "forbidden", "the execution envelope was refused", code=exc.reason) from None


async def _read_body(request: Request) -> bytes | None:
    """The body under MAX_BODY_BYTES (413 beyond); None when the caller left before it arrived."""
    try:
        return await read_body(request.scope["headers"], request.receive, MAX_BODY_BYTES)
    except EdgeRefusal as refusal:
        raise _Refused(refusal.status, refusal.type, refusal.message, code=refusal.code) from None


def _parse_body(body: bytes):
    """(token ids, params) of a verified body; anything else is a 400 naming the field."""
    try:
        document = json.loads(body)
        if not isinstance(document, dict) or set(document) != _BODY_FIELDS:
            raise ValueError(f"the body must be a JSON object with exactly {', '.join(sorted(_BODY_FIELDS))}")
        token_ids = document["token_ids"]
        if not isinstance(token_ids, list) or not all(type(t) is int for t in token_ids):
            raise ValueError("token_ids must be a list of integers")
        return token_ids, params_from_json(document["params"])
    except (ValueError, TypeError, RecursionError) as exc:
        message = str(exc) if not isinstance(exc, (json.JSONDecodeError, RecursionError)) else "the body is not JSON"
        raise _Refused(400, "invalid_request_error", message) from None


async def _first(outputs: AsyncGenerator, request: Request):
    """The first delta, or None when the caller disconnected first (the request is then aborted)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    first = asyncio.ensure_future(anext(outputs))
    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({first, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not first.done():
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await outputs.aclose()
        return None
    return first.result()


def _line(document: dict) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode() + b"\n"


def create_app(server: EngineServer, *, grace_s: float = 10.0) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.async_engine.start()
        yield
        await asyncio.to_thread(server.async_engine.shutdown, grace_s)

    app = FastAPI(title="tenantgate engine", lifespan=lifespan, openapi_url=None, telemetry=NO_NATIVE_TELEMETRY)

    @app.exception_handler(_Refused)
    async def _refused(request: Request, exc: _Refused) -> JSONResponse:
        return exc.response()

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        ready = server.async_engine.is_running
        return JSONResponse({"status": "ready" if ready else "not ready"}, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(server.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get(LOAD_PATH)
    async def load() -> dict:
        return server.load()

    @app.get(INFO_PATH)
    async def info() -> dict:
        return server.info()

    @app.post(GENERATE_PATH)
    async def generate(request: Request) -> Response:
        token = server.verify_token(request)  # before a byte of the body is read
        body = await _read_body(request)
        if body is None:
            return Response(status_code=499)
        envelope, request_id = server.verify_body(token, body)
        token_ids, params = _parse_body(body)
        outputs = server.async_engine.generate(token_ids, params, envelope, request_id=request_id)
        try:
            first = await _first(outputs, request)
        except RequestError as exc:
            raise _Refused(400, "invalid_request_error", exc.caller_message(), param=exc.param, code=exc.code) from None
        except EngineDeadError:
            raise _Refused(503, "unavailable", "the engine is not running") from None
        if first is None:
            return Response(status_code=499)
        return StreamingResponse(_stream(server, outputs, first, request_id, params.n), media_type=NDJSON)

    return app


async def _stream(server: EngineServer, outputs: AsyncGenerator, first, request_id: str,
                  num_choices: int) -> AsyncIterator[bytes]:
    """Every choice's deltas, then the request's x-record after the last choice has finished."""
    output = first
    try:
        while True:
            yield _line(output_to_json(output))
            num_choices -= output.finished
            if not num_choices:
                record = server.records.pop(request_id)
                if record is not None:
                    yield _line({"type": "record", "record": record_to_json(record)})
                return
            output = await anext(outputs)
    except EngineDeadError:
        yield _line({"type": "error", "error": {"message": "the engine stopped", "type": "unavailable"}})
    finally:
        await outputs.aclose()  # a caller gone mid-stream: the engine request is aborted here
