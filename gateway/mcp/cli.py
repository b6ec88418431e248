"""`tenantgate mcp pin`: the current digest of each tool of each declared MCP server, printed in the
policy data's format, for review and then a tenant's `mcp` entry (docs/mcp.md, "Pinning").

    tenantgate mcp pin                               # the servers of $TENANTGATE_MCP_SERVERS_FILE
    tenantgate mcp pin --servers mcp-servers.json --server devtools

Connects to each server as the gateway does (its own credential), lists its tools and prints
{"mcp": {"servers": {NAME: {"tools": {TOOL: {"digests": ["sha256:…"]}}}}}}. It pins nothing by
itself: the printed digests are what the servers serve now, and a reviewer decides to accept them.

Exit codes: 0 printed, 1 a server could not be listed, 2 unusable arguments or servers file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from gateway.mcp.catalogue import Catalogue
from gateway.mcp.config import load_servers
from gateway.mcp.exceptions import JsonRpcError, McpConfigError
from gateway.mcp.upstream import ResultTooLarge, Upstream

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
SERVERS_ENV = "TENANTGATE_MCP_SERVERS_FILE"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    mcp = subparsers.add_parser("mcp", help="the MCP servers the gateway fronts", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = mcp.add_subparsers(dest="mcp_command", required=True)
    pin = commands.add_parser("pin", help="print each tool's current digest in the policy data's format")
    pin.add_argument("--servers", metavar="FILE", help=f"the MCP servers file (default ${SERVERS_ENV})")
    pin.add_argument("--server", action="append", default=[], metavar="NAME", help="only this server (repeatable)")
    pin.set_defaults(func=cmd_pin)


def cmd_pin(args: argparse.Namespace) -> int:
    path = args.servers or os.environ.get(SERVERS_ENV)
    if not path:
        print(f"tenantgate mcp pin: name the servers file (--servers or ${SERVERS_ENV})", file=sys.stderr)
        return EXIT_USAGE
    try:
        servers = [s for s in load_servers(Path(path)).servers if not args.server or s.name in args.server]
    except McpConfigError as exc:
        print(f"tenantgate mcp pin: {exc}", file=sys.stderr)
        return EXIT_USAGE
    unknown = set(args.server) - {s.name for s in servers}
    if unknown:
        print(f"tenantgate mcp pin: no such server: {', '.join(sorted(unknown))}", file=sys.stderr)
        return EXIT_USAGE
    try:
        document = asyncio.run(pins(servers))
    except (JsonRpcError, ResultTooLarge, ValueError) as exc:
        print(f"tenantgate mcp pin: {getattr(exc, 'message', None) or type(exc).__name__}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(document, indent=2, sort_keys=True))
    return EXIT_OK


async def pins(servers) -> dict:
    found: dict = {}
    for server in servers:
        upstream = Upstream(server)
        try:
            tools = await Catalogue(upstream, lambda record: None, ttl_s=0).tools()
        finally:
            await upstream.aclose()
        found[server.name] = {"tools": {name: {"digests": [tool.digest]} for name, tool in sorted(tools.items())}}
    return {"mcp": {"servers": found}}
