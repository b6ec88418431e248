"""The 2026-07-28 revision (no handshake, no session: each request carries its envelope): the official
`mcp.Client` in its default mode discovers it, then lists and calls through the same decision."""

from __future__ import annotations

import json

import httpx

from tests.gateway.mcp.conftest import mcp_error, modern_client, run

ENVELOPE = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}


def test_the_default_client_speaks_2026_07_28_and_the_policy_still_decides(mcp_gateway) -> None:
    async def work():
        async with modern_client(mcp_gateway) as client:
            names = sorted(t.name for t in (await client.list_tools()).tools)
            echoed = (await client.call_tool("echo", {"text": "stateless"})).content[0].text
            return client.protocol_version, names, echoed

    version, names, echoed = run(work())
    assert (version, names, echoed) == ("2026-07-28", ["echo", "word_count"], "stateless")

    async def denied():
        async with modern_client(mcp_gateway) as client:
            return await client.call_tool("delete_repository", {"name": "x"})

    assert "the tool is not allowed for this tenant" in mcp_error(denied()).error.message
    record = [r for r in mcp_gateway.audit_records() if r.get("route") == "mcp.tools/call"][-1]
    assert record["tool"] == "delete_repository" and record["outcome"] == "denied"


def _post(mcp_gateway, body: dict, **headers) -> httpx.Response:
    sent = {"content-type": "application/json", "authorization": f"Bearer {mcp_gateway.token()}",
            "mcp-protocol-version": "2026-07-28", **headers}
    return httpx.post(mcp_gateway.url, content=json.dumps(body), headers=sent, timeout=10)


def test_the_envelope_and_routing_headers_are_checked(mcp_gateway) -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "hi"}, "_meta": ENVELOPE}}
    ok = _post(mcp_gateway, call, **{"mcp-method": "tools/call", "mcp-name": "echo"})
    assert ok.status_code == 200 and ok.json()["result"]["resultType"] == "complete"
    # A header that names another tool than the body: the policy would judge one and the server run another.
    mismatch = _post(mcp_gateway, call, **{"mcp-method": "tools/call", "mcp-name": "word_count"})
    assert (mismatch.status_code, mismatch.json()["error"]["code"]) == (400, -32020)
    no_envelope = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    assert _post(mcp_gateway, no_envelope, **{"mcp-method": "tools/list"}).json()["error"]["code"] == -32602
    future = {"jsonrpc": "2.0", "id": 3, "method": "tools/list",
              "params": {"_meta": ENVELOPE | {"io.modelcontextprotocol/protocolVersion": "2099-01-01"}}}
    refused = _post(mcp_gateway, future, **{"mcp-method": "tools/list", "mcp-protocol-version": "2099-01-01"})
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, -32022)
    assert refused.json()["error"]["data"]["supported"] == ["2026-07-28"]
    unknown = {"jsonrpc": "2.0", "id": 4, "method": "prompts/list", "params": {"_meta": ENVELOPE}}
    assert _post(mcp_gateway, unknown, **{"mcp-method": "prompts/list"}).status_code == 404
