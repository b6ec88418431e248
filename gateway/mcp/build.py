"""Builds the MCP endpoint's parts from the settings' servers file, for the app factory."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

from gateway.mcp.catalogue import Catalogue
from gateway.mcp.config import load_servers
from gateway.mcp.service import McpMetrics, McpService, Server
from gateway.mcp.upstream import Upstream

if TYPE_CHECKING:
    from gateway.context import Gateway


async def build_mcp(gateway: Gateway, stack: AsyncExitStack, tracer=None) -> McpService | None:
    """The MCP service over the servers in settings.mcp_servers_file (None without one); `stack`
    closes each server's client. Reuses the gateway's verifier, policy, limiter and audit trail."""
    path = gateway.settings.mcp_servers_file
    if path is None:
        return None
    servers = {}
    for declared in load_servers(path).servers:
        upstream = Upstream(declared)
        stack.push_async_callback(upstream.aclose)
        servers[declared.name] = Server(upstream, Catalogue(upstream, gateway.audit.write, ttl_s=declared.tools_ttl_s))
    return McpService(servers, policy=gateway.policy, limiter=gateway.limiter, audit=gateway.audit,
                      metrics=McpMetrics(gateway.metrics.registry), tracer=tracer)
