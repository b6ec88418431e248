"""MCP: the tools agents call, per tenant, governed in Rego (docs/mcp.md).

/mcp/{server} fronts each declared MCP server over Streamable HTTP; the gateway is the OAuth
resource server, judges every tools/list and tools/call with the tools decision, pins tool
definitions by digest, budgets calls with the gateway's limiter and audits each call.
"""

from gateway.mcp.build import build_mcp
from gateway.mcp.catalogue import tool_digest
from gateway.mcp.config import McpServer, McpServersFile, load_servers
from gateway.mcp.exceptions import McpConfigError
from gateway.mcp.router import router
from gateway.mcp.service import McpService

__all__ = ["McpConfigError", "McpServer", "McpServersFile", "McpService", "build_mcp", "load_servers", "router",
           "tool_digest"]
