"""The inference routes are dispatched without FastAPI's per-request machinery (gateway/plain_routes.py),
and answer exactly as FastAPI's own dispatch of the same route does: same status, headers and body."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from gateway.app import create_app
from gateway.plain_routes import PlainRoutes
from tests.gateway.api.conftest import ALPHA, BETA

INFERENCE_ROUTES = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"}
CHAT = b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}'
JSON = {"content-type": "application/json"}

# (path, body, headers, whose token): each of them once through each dispatch.
CASES = {
    "chat": ("/v1/chat/completions", CHAT, JSON, ALPHA),
    "chat, charset": ("/v1/chat/completions", CHAT, {"content-type": "application/json; charset=utf-8"}, ALPHA),
    "chat, +json": ("/v1/chat/completions", CHAT, {"content-type": "application/merge-patch+json"}, ALPHA),
    "chat denied by policy": ("/v1/chat/completions", CHAT, JSON, BETA),
    "invalid JSON": ("/v1/chat/completions", b'{"model": ', JSON, ALPHA),
    "invalid JSON, no token": ("/v1/chat/completions", b'{"model": ', JSON, None),
    "no body": ("/v1/chat/completions", b"", JSON, ALPHA),
    "no body, no token": ("/v1/chat/completions", b"", JSON, None),
    "no content type": ("/v1/chat/completions", CHAT, {}, ALPHA),
    "text/plain": ("/v1/chat/completions", CHAT, {"content-type": "text/plain"}, ALPHA),
    "a list": ("/v1/chat/completions", b"[]", JSON, ALPHA),
    "unknown field": ("/v1/chat/completions", CHAT[:-1] + b', "nope": 1}', JSON, ALPHA),
    "wrong type": ("/v1/chat/completions", CHAT[:-1] + b', "n": "two"}', JSON, ALPHA),
    "no token": ("/v1/chat/completions", CHAT, JSON, None),
    "no token, bad body": ("/v1/chat/completions", b"[]", JSON, None),
    "not bearer": ("/v1/chat/completions", CHAT, {**JSON, "authorization": "Basic eDp5"}, None),
    "bad token": ("/v1/chat/completions", CHAT, {**JSON, "authorization": "Bearer not.a.jwt"}, None),
    "completions": ("/v1/completions", b'{"model": "demo", "prompt": "hi", "max_tokens": 2, "temperature": 0}',
                    JSON, ALPHA),
    "completions, missing prompt": ("/v1/completions", b'{"model": "demo"}', JSON, ALPHA),
    "embeddings": ("/v1/embeddings", b'{"model": "all-minilm-l6-v2", "input": "hi"}', JSON, ALPHA),
    "embeddings, bad input": ("/v1/embeddings", b'{"model": "all-minilm-l6-v2", "input": 3.5}', JSON, ALPHA),
    "responses, bad input": ("/v1/responses", b'{"model": "demo", "input": 7}', JSON, ALPHA),
}
# Differ from one call to the next whatever the dispatch.
VARYING_HEADERS = {"date", "x-request-id", "x-tenantgate-decision-id", "x-ratelimit-remaining-requests",
                   "x-ratelimit-remaining-tokens", "x-ratelimit-reset-requests", "x-ratelimit-reset-tokens",
                   "content-length"}
VARYING_FIELDS = {"id", "created", "created_at"}


def test_the_inference_routes_are_the_plain_ones() -> None:
    app = create_app()
    (plain,) = [m for m in app.user_middleware if m.cls is PlainRoutes]
    routes = PlainRoutes(app.router, **plain.kwargs).routes  # type: ignore[arg-type]
    assert set(routes) == INFERENCE_ROUTES
    assert {path: r.route.name for path, r in routes.items()} == {
        "/v1/chat/completions": "chat_completions", "/v1/completions": "completions",
        "/v1/embeddings": "embeddings", "/v1/responses": "responses"}


@contextmanager
def fastapi_dispatch(app) -> Iterator[None]:
    """While the app has a dependency override, every route goes through FastAPI's own dispatch."""
    app.dependency_overrides[test_the_inference_routes_are_the_plain_ones] = lambda: None
    try:
        yield
    finally:
        app.dependency_overrides.clear()


def _call(gateway, path: str, body: bytes, headers: dict[str, str], tenant: str | None) -> tuple:
    if tenant is not None:
        headers = {**headers, "authorization": f"Bearer {gateway.token(tenant)}"}
    response = httpx.post(gateway.base_url + path, content=body, headers=headers, timeout=60)
    kept = {name: value for name, value in response.headers.items() if name not in VARYING_HEADERS}
    payload = response.json()
    if isinstance(payload, dict):
        payload = {key: value for key, value in payload.items() if key not in VARYING_FIELDS}
    return response.status_code, kept, payload


@pytest.mark.parametrize("case", list(CASES))
def test_plain_dispatch_answers_as_fastapi_does(gateway, case: str) -> None:
    path, body, headers, tenant = CASES[case]
    plain = _call(gateway, path, body, headers, tenant)
    with fastapi_dispatch(gateway.app):
        through_fastapi = _call(gateway, path, body, headers, tenant)
    assert plain == through_fastapi
    status, _, payload = plain
    # The cases reach every branch they are named for: a success, or the error they provoke.
    assert (status == 200) == (case in {"chat", "chat, charset", "chat, +json", "completions", "embeddings"}), payload
    if status != 200:
        assert set(payload["error"]) == {"message", "type", "param", "code"}


def test_a_streamed_chat_is_the_same_events_through_either_dispatch(gateway) -> None:
    body = CHAT[:-1] + b', "stream": true}'

    def events() -> list:
        headers = {**JSON, "authorization": f"Bearer {gateway.token(ALPHA)}"}
        with httpx.stream("POST", gateway.base_url + "/v1/chat/completions", content=body, headers=headers,
                          timeout=60) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in response.iter_lines() if line]
        # ids and timestamps vary per call; the rest of every event is compared.
        return [line if line == "data: [DONE]" else
                {k: v for k, v in json.loads(line.removeprefix("data: ")).items() if k not in VARYING_FIELDS}
                for line in lines]

    plain = events()
    with fastapi_dispatch(gateway.app):
        through_fastapi = events()
    assert plain == through_fastapi
    assert plain[-1] == "data: [DONE]" and len(plain) >= 3
