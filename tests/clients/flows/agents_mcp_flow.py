"""The OpenAI Agents SDK's Streamable HTTP MCP server class (agents.mcp.MCPServerStreamableHttp)
pointed at the gateway's /mcp/devtools with a token of its own: it lists the tools the policy
allows, calls the allowed one, and is refused the denied one."""

from __future__ import annotations

import asyncio
import os

from agents.mcp import MCPServerStreamableHttp

from _flow import check, run

MCP_URL = os.environ["TENANTGATE_MCP_URL"]
MCP_TOKEN = os.environ["TENANTGATE_MCP_TOKEN"]


async def _with_server(work):
    server = MCPServerStreamableHttp(
        params={"url": MCP_URL, "headers": {"Authorization": f"Bearer {MCP_TOKEN}"}, "timeout": 30},
        cache_tools_list=False, name="devtools")
    async with server:
        return await work(server)


@check
def lists_the_allowed_tools() -> list[str]:
    return sorted(tool.name for tool in asyncio.run(_with_server(lambda server: server.list_tools())))


@check
def calls_the_allowed_tool() -> dict:
    result = asyncio.run(_with_server(lambda server: server.call_tool("word_count", {"text": "agents call tools"})))
    return {"is_error": result.is_error, "text": [item.text for item in result.content]}


@check
def is_refused_the_denied_tool() -> dict:
    result = asyncio.run(_with_server(lambda server: server.call_tool("delete_repository", {"name": "tenantgate"})))
    return {"is_error": result.is_error, "text": [getattr(item, "text", "") for item in result.content]}


run()
