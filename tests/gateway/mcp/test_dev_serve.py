"""The README's MCP path: `tenantgate serve --dev` serves devkit's example MCP server as /mcp/devtools,
and the official `mcp` client, with a token from `tenantgate token --scope Tools.Invoke`, lists and
calls what the example policy allows Northwind (and not delete_repository)."""

from __future__ import annotations

import subprocess

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from devkit.server import TENANTGATE, free_port, wait_ready
from devkit.server import gateway_env as _env
from tests.gateway.mcp.conftest import mcp_error, run


def test_dev_serve_fronts_the_example_mcp_server_for_northwind() -> None:
    port, issuer_port = free_port(), free_port()
    env = _env(TENANTGATE_DEV_ISSUER_PORT=str(issuer_port), TENANTGATE_METRICS_PORT="0", TENANTGATE_ENGINE="null",
               TENANTGATE_EMBEDDING_MODEL="")
    server = subprocess.Popen([TENANTGATE, "serve", "--dev", "--port", str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_ready(f"http://127.0.0.1:{port}", server,
                   output=lambda: server.stdout.read() if server.poll() is not None else "")
        token = subprocess.run(
            [TENANTGATE, "token", "--tenant", "northwind", "--scope", "Tools.Invoke",
             "--issuer", f"http://127.0.0.1:{issuer_port}"],
            env=env, capture_output=True, text=True, check=True).stdout.strip()

        async def session(work):
            async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
                async with streamable_http_client(f"http://127.0.0.1:{port}/mcp/devtools", http_client=http) as streams:
                    async with ClientSession(*streams) as mcp:
                        await mcp.initialize()
                        return await work(mcp)

        async def list_and_call(mcp):
            return ([t.name for t in (await mcp.list_tools()).tools],
                    (await mcp.call_tool("word_count", {"text": "a gateway for tools"})).content[0].text)

        names, count = run(session(list_and_call))
        assert sorted(names) == ["echo", "word_count"] and count == "4"
        refused = mcp_error(session(lambda mcp: mcp.call_tool("delete_repository", {"name": "tenantgate"})))
        assert "the tool is not allowed for this tenant" in refused.error.message
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=30)
    assert token not in output
