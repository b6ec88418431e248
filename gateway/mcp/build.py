"""Builds the MCP endpoint's parts from the settings' servers file, for the app factory."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

from gateway.mcp.catalogue import Catalogue, RedisLedger
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
    settings = gateway.settings
    ledger = None
    if settings.redis_url.get_secret_value():  # beside the budgets: one record for every replica
        from gateway.limits.redis import redis_client

        client = redis_client(settings.redis_url.get_secret_value(), timeout_s=settings.redis_timeout_s,
                              entra=settings.redis_entra, max_connections=16)
        stack.push_async_callback(client.aclose)
        ledger = RedisLedger(client)
    servers = {}
    for declared in load_servers(path).servers:
        upstream = Upstream(declared)
        stack.push_async_callback(upstream.aclose)
        catalogue = Catalogue(upstream, gateway.audit.write, ttl_s=declared.tools_ttl_s, ledger=ledger)
        servers[declared.name] = Server(upstream, catalogue)
    return McpService(servers, policy=gateway.policy, limiter=gateway.limiter, audit=gateway.audit,
                      metrics=McpMetrics(gateway.metrics.registry), tracer=tracer)
