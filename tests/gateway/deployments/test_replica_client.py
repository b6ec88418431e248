"""ReplicaClient against replicas that fail: real HTTP on loopback, each failure the kind
the router must tell apart (unreachable, slow, 5xx, cut mid-stream, silent mid-stream, closed once
the request went out, malformed, refused)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from devkit.server import free_port, serving
from engine import SamplingParams
from engine.remote import ENVELOPE_HEADER, EnvelopeSigner
from gateway.deployments.base import (
    EnvelopeRefused,
    UpstreamIdle,
    UpstreamInterrupted,
    UpstreamRejected,
    UpstreamUnavailable,
)
from gateway.deployments.replica_client import ReplicaClient
from tests.utils.envelopes import ENV

SIGNER = EnvelopeSigner(Ed25519PrivateKey.generate())
PARAMS = SamplingParams(max_tokens=4, temperature=0.0)
OUTPUT = {"type": "output", "new_token_ids": [7], "new_text": " ok", "num_prompt_tokens": 2, "num_output_tokens": 1,
          "num_cached_tokens": 0, "finished": False, "finish_reason": None, "logprobs": []}


def replica_app(received: list[dict]) -> FastAPI:
    """A stand-in replica whose behaviour the request id picks; each request's headers go to `received`."""
    app = FastAPI()

    @app.post("/v1/engine/generate")
    async def generate(body: dict, request: Request):
        received.append(dict(request.headers))
        behaviour = body["request_id"]
        if behaviour == "503":
            return JSONResponse({"error": {"message": "x", "type": "unavailable"}}, status_code=503)
        if behaviour == "403":
            return JSONResponse({"error": {"message": "x", "type": "forbidden", "code": "expired"}}, status_code=403)
        if behaviour == "400":
            return JSONResponse({"error": {"message": "the prompt is empty", "type": "invalid_request_error",
                                           "param": "prompt"}}, status_code=400)

        async def lines():
            if behaviour == "slow":
                await asyncio.sleep(5)
            yield json.dumps(OUTPUT) + "\n"
            if behaviour == "garbage":
                yield "not json\n"
            elif behaviour == "stalls":
                await asyncio.sleep(5)
            elif behaviour == "error":
                yield json.dumps({"type": "error", "error": {"message": "stopped", "type": "unavailable"}}) + "\n"
            # "cut": the stream ends without a finished output

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.get("/v1/engine/load")
    async def load():
        return {"queue_depth": "many", "kv_usage": 0.5}

    return app


RECEIVED: list[dict] = []


@pytest.fixture(scope="module")
def base_url():
    with serving(replica_app(RECEIVED)) as url:
        yield url


async def run(replica: ReplicaClient, request_id: str) -> list:
    seen = []
    try:
        async for output in replica.generate([1, 2], PARAMS, ENV, request_id):
            seen.append(output)
    finally:
        await replica.aclose()
    return seen


def outcome(replica: ReplicaClient, request_id: str, error: type[Exception]) -> Exception:
    with pytest.raises(error) as caught:
        asyncio.run(run(replica, request_id))
    assert type(caught.value) is error
    return caught.value


def test_an_unreachable_replica_is_unavailable() -> None:
    error = outcome(ReplicaClient(f"http://127.0.0.1:{free_port()}", SIGNER, name="engine-9"), "x",
                    UpstreamUnavailable)
    assert "engine-9" in str(error) and "ConnectError" in str(error)


def test_a_5xx_and_a_slow_first_output_are_unavailable(base_url) -> None:
    assert "503" in str(outcome(ReplicaClient(base_url, SIGNER), "503", UpstreamUnavailable))
    slow = ReplicaClient(base_url, SIGNER, first_token_timeout_s=0.5)
    assert "before its first output" in str(outcome(slow, "slow", UpstreamUnavailable))


@pytest.mark.parametrize("behaviour", ["cut", "garbage", "error", "stalls"])
def test_a_stream_that_breaks_after_its_first_output_is_unavailable(base_url, behaviour) -> None:
    seen = []

    async def consume():
        replica = ReplicaClient(base_url, SIGNER, timeout_s=1.0)
        try:
            async for output in replica.generate([1, 2], PARAMS, ENV, behaviour):
                seen.append(output)
        finally:
            await replica.aclose()

    with pytest.raises(UpstreamUnavailable) as caught:
        asyncio.run(consume())
    assert type(caught.value) is UpstreamUnavailable
    assert [o.new_token_ids for o in seen] == [[7]]  # the router knows a token went out


def test_a_403_is_envelope_refused_and_a_400_is_rejected_with_the_replicas_message(base_url) -> None:
    refused = outcome(ReplicaClient(base_url, SIGNER), "403", EnvelopeRefused)
    assert refused.reason == "expired" and isinstance(refused, UpstreamUnavailable)
    rejected = outcome(ReplicaClient(base_url, SIGNER), "400", UpstreamRejected)
    assert (rejected.status, rejected.message, rejected.param) == (400, "the prompt is empty", "prompt")


def test_the_trace_context_given_goes_to_the_replica_as_its_traceparent(base_url) -> None:
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    async def consume():
        replica = ReplicaClient(base_url, SIGNER)
        try:
            async for _ in replica.generate([1, 2], PARAMS, ENV, "400", headers={"traceparent": traceparent}):
                pass
        finally:
            await replica.aclose()

    RECEIVED.clear()
    with pytest.raises(UpstreamRejected):
        asyncio.run(consume())
    (headers,) = RECEIVED
    assert headers["traceparent"] == traceparent and ENVELOPE_HEADER.lower() in headers


def test_a_malformed_load_report_is_unavailable(base_url) -> None:
    async def load():
        replica = ReplicaClient(base_url, SIGNER)
        try:
            return await replica.load()
        finally:
            await replica.aclose()

    with pytest.raises(UpstreamUnavailable, match="malformed load report"):
        asyncio.run(load())


def test_a_replica_silent_for_its_idle_timeout_after_output_is_upstream_idle(base_url) -> None:
    replica = ReplicaClient(base_url, SIGNER, timeout_s=30, idle_timeout_s=0.5)
    started = time.monotonic()
    error = outcome(replica, "stalls", UpstreamIdle)  # 5 s of silence after its first output
    assert "sent nothing for 0.5 s mid-stream" in str(error) and time.monotonic() - started < 3


async def test_a_connection_closed_after_the_request_is_interrupted_and_sent_once() -> None:
    received = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        received.append(await reader.readexactly(length))
        writer.close()  # the request arrived; no answer
        await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    replica = ReplicaClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", SIGNER)
    try:
        with pytest.raises(UpstreamInterrupted, match="closed the connection before answering"):
            await run(replica, "x")
        assert len(received) == 1
    finally:
        server.close()
        await server.wait_closed()
