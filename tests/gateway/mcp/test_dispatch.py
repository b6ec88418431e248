"""/mcp/{server} is dispatched without FastAPI's router (gateway/plain_routes.py, request routes) and
answers exactly as FastAPI's own dispatch of the same route: same status, headers and body."""

from __future__ import annotations

import json

import httpx

from gateway.app import create_app
from gateway.mcp import router as mcp_router
from gateway.plain_routes import PlainRoutes
from tests.gateway.api.test_plain_routes import fastapi_dispatch

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "t", "version": "1"}}}
VARYING_HEADERS = {"date", "x-request-id", "mcp-session-id", "content-length"}


def test_the_mcp_routes_that_take_the_request_are_the_request_routes() -> None:
    app = create_app()
    (plain,) = [m for m in app.user_middleware if m.cls is PlainRoutes]
    routes = PlainRoutes(app.router, **plain.kwargs).request_routes  # type: ignore[arg-type]
    assert {(route.route.path, method) for route in routes for method in route.route.methods} == {
        ("/mcp/{server}", "POST"), ("/mcp/{server}", "DELETE"),
        ("/.well-known/oauth-protected-resource/mcp/{server}", "GET")}
    # The GET without a stream takes no Request: FastAPI dispatches it.
    assert "no_stream" in {route.name for route in mcp_router.routes}


def _exchange(mcp_gateway, token: str) -> list[tuple]:
    """One of each kind of answer, in order: 401, 404, 415, a session, a listing, a call, a bad call,
    the end of the session, the metadata document, a foreign origin, and the GET without a stream."""
    url, base = mcp_gateway.url, mcp_gateway.base_url
    json_headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    authorized = {**json_headers, "authorization": f"Bearer {token}"}

    def post(body, headers, path=url) -> httpx.Response:
        return httpx.post(path, content=json.dumps(body).encode(), headers=headers, timeout=10)

    answers = [post(INITIALIZE, json_headers),
               post(INITIALIZE, authorized, base + "/mcp/nothing"),
               post(INITIALIZE, {**authorized, "content-type": "text/plain"})]
    opened = post(INITIALIZE, authorized)
    session = {**authorized, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    answers += [opened,
                post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, session),
                post({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                      "params": {"name": "echo", "arguments": {"text": "hello"}}}, session),
                post({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": 7}}, session),
                httpx.delete(url, headers=session, timeout=10),
                httpx.get(base + "/.well-known/oauth-protected-resource/mcp/devtools", params={"tenant": "x"},
                          timeout=10),
                post(INITIALIZE, {**authorized, "origin": "http://evil.example"}),
                httpx.get(url, timeout=10)]
    return [(answer.status_code, {name: value for name, value in answer.headers.items()
                                  if name not in VARYING_HEADERS}, answer.content) for answer in answers]


def test_mcp_answers_are_the_same_through_either_dispatch(mcp_gateway) -> None:
    token = mcp_gateway.token()
    direct = _exchange(mcp_gateway, token)
    with fastapi_dispatch(mcp_gateway.app):
        through_fastapi = _exchange(mcp_gateway, token)
    assert direct == through_fastapi
    assert [status for status, _, _ in direct] == [401, 404, 415, 200, 200, 200, 200, 204, 200, 403, 405]
    assert b'"hello"' in direct[5][2]  # the call reached the tool and came back
