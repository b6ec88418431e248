"""A caller that leaves mid-request aborts its engine request and frees its KV blocks."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.gateway.api.conftest import ALPHA

PROMPT = [{"role": "user", "content": "Write a long essay about paged attention and prefix caches."}]


def _wait_idle(engine, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while engine.has_unfinished_requests():
        if time.monotonic() > deadline:
            raise AssertionError("the engine still runs requests after the caller left")
        time.sleep(0.01)


def _record(gateway, request_id: str, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for record in gateway.sink.requests:
            if record.request_id == request_id:
                return record
        time.sleep(0.01)
    raise AssertionError(f"no execution record for {request_id}")


def _assert_blocks_released(engine) -> None:
    stats = engine.kv_stats()
    assert stats.num_used_blocks == 0, "KV blocks are still held after the abort"
    engine.check_invariants()


def test_stream_disconnect_aborts_the_engine_request_and_frees_its_blocks(gateway) -> None:
    body = {"model": "demo", "messages": PROMPT, "max_tokens": 512, "stream": True, "temperature": 1.0}
    headers = {"Authorization": f"Bearer {gateway.token(ALPHA)}"}
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", gateway.base_url + "/v1/chat/completions", json=body, headers=headers) as response:
            assert response.status_code == 200
            request_id = response.headers["x-request-id"]
            lines = response.iter_lines()
            received = [line for _, line in zip(range(6), lines) if line.startswith("data:")]
            assert len(received) >= 2
        # Leaving the block closes the connection after a few chunks of a 512-token answer.
    record = _record(gateway, request_id)
    _wait_idle(gateway.engine)
    assert record.finish_reason == "abort"
    assert record.output_tokens < 512
    _assert_blocks_released(gateway.engine)


def test_non_streaming_disconnect_aborts_the_engine_request(gateway) -> None:
    body = {"model": "demo", "messages": PROMPT, "max_tokens": 512, "temperature": 1.0}
    headers = {"Authorization": f"Bearer {gateway.token(ALPHA)}"}
    before = len(gateway.sink.requests)
    with httpx.Client(timeout=httpx.Timeout(30, read=0.3)) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.post(gateway.base_url + "/v1/chat/completions", json=body, headers=headers)
    _wait_idle(gateway.engine)
    deadline = time.monotonic() + 10
    while len(gateway.sink.requests) == before and time.monotonic() < deadline:
        time.sleep(0.01)
    record = gateway.sink.requests[-1]
    assert record.finish_reason == "abort" and record.output_tokens < 512
    _assert_blocks_released(gateway.engine)
