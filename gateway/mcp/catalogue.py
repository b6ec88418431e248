"""Each upstream server's tools as the gateway last listed them, with the digest of each tool's
definition, and the ledger of first sightings and changes (the rug-pull defence).

A tool's digest is the SHA-256 of its canonical definition (name, description, inputSchema,
annotations; canonical JSON, as the audit chain hashes entries). The first digest the gateway
sees of a tool is its recorded digest; the policy accepts either a pinned digest or, where the
tenant pins none, the recorded one. A changed definition is therefore withheld until the policy
pins the new digest. Every first sighting and every change is an audit record in the signed chain.

The recorded digests are a ledger: in this process's memory by default, or in Redis beside the
budgets (RedisLedger), where every replica and every restart finds the digest the first one
recorded, so a replica that starts after a server changed a tool does not take the new definition
for the first.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from gateway.encoding import canonical_json
from gateway.mcp.exceptions import INVALID_REQUEST, JsonRpcError, UpstreamFailed
from gateway.mcp.upstream import Upstream

logger = logging.getLogger("tenantgate.mcp")

DEFINITION_FIELDS = ("name", "description", "inputSchema", "annotations")
MAX_TOOLS = 1024  # per server: a server that lists more is refused, not truncated silently
MAX_PAGES = 32
MAX_TOOL_NAME_CHARS = 128


def tool_digest(definition: dict) -> str:
    """sha256:<hex> over the canonical JSON of the definition's name, description, inputSchema and
    annotations (an absent field counts as null)."""
    canonical = canonical_json({field: definition.get(field) for field in DEFINITION_FIELDS})
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


class Ledger(Protocol):
    async def recorded(self, server: str, tool: str, digest: str) -> str:
        """The tool's recorded digest: the one recorded before, or `digest`, recorded now."""
        ...


class MemoryLedger:
    def __init__(self) -> None:
        self._first: dict[tuple[str, str], str] = {}

    async def recorded(self, server: str, tool: str, digest: str) -> str:
        return self._first.setdefault((server, tool), digest)


# One round trip: record the digest unless one is, and answer the one that is.
_RECORD = "redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) return redis.call('HGET', KEYS[1], ARGV[1])"
LEDGER_KEY = "tenantgate:mcp:recorded:"


class RedisLedger:
    """Recorded digests in a Redis hash per server, shared by replicas and kept across restarts. A
    Redis that cannot answer fails the listing (503): a tool is never judged without its record."""

    def __init__(self, client) -> None:
        self._client = client
        self._script = client.register_script(_RECORD)

    async def recorded(self, server: str, tool: str, digest: str) -> str:
        try:
            value = await self._script(keys=[LEDGER_KEY + server], args=[tool, digest])
        except Exception:  # noqa: BLE001 - redis raises many kinds; each means no answer
            raise JsonRpcError(INVALID_REQUEST, "the gateway cannot read its record of tool definitions at the "
                               "moment, so this request is refused; retry shortly", status=503,
                               headers={"Retry-After": "2"}) from None
        return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    definition: dict  # as the server sent it: what a listing shows the caller
    digest: str
    recorded_digest: str  # the first digest this gateway saw of the tool

    def policy_input(self) -> dict:
        return {"name": self.name, "digest": self.digest, "recorded_digest": self.recorded_digest}


class Catalogue:
    """The tools of one server, listed again when older than ttl_s (one listing at a time: callers
    that find it stale meanwhile wait for that one)."""

    def __init__(self, upstream: Upstream, record, *, ttl_s: float, ledger: Ledger | None = None) -> None:
        self._upstream = upstream
        self._record = record  # writes one audit record (AuditRecorder.write)
        self._ttl_s = ttl_s
        self._ledger = ledger or MemoryLedger()
        self._tools: dict[str, Tool] = {}
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()
        self._last: dict[str, str] = {}  # tool -> the digest this process saw last

    async def tools(self) -> dict[str, Tool]:
        if self._fresh():
            return self._tools
        async with self._lock:
            if not self._fresh():
                await self._refresh()
        return self._tools

    def _fresh(self) -> bool:
        return self._fetched_at is not None and time.monotonic() - self._fetched_at < self._ttl_s

    async def _refresh(self) -> None:
        definitions: list[dict] = []
        cursor = None
        for _ in range(MAX_PAGES):
            result, _ = await self._upstream.request("tools/list", {"cursor": cursor} if cursor else {})
            page = result.get("tools")
            if not isinstance(page, list):
                raise UpstreamFailed(f"MCP server {self._upstream.name} listed no tools array")
            definitions.extend(page)
            if len(definitions) > MAX_TOOLS:
                raise UpstreamFailed(f"MCP server {self._upstream.name} lists more than {MAX_TOOLS} tools")
            cursor = result.get("nextCursor")
            if not isinstance(cursor, str) or not cursor:
                break
        tools = {}
        for definition in definitions:
            name = definition.get("name") if isinstance(definition, dict) else None
            if not isinstance(name, str) or not name or len(name) > MAX_TOOL_NAME_CHARS or name in tools:
                continue  # unnamed or repeated: never listed, never callable
            digest = tool_digest(definition)
            recorded = await self._ledger.recorded(self._upstream.name, name, digest)
            self._sighted(name, digest, recorded)
            tools[name] = Tool(name, definition, digest, recorded)
        self._tools, self._fetched_at = tools, time.monotonic()

    def _sighted(self, name: str, digest: str, recorded: str) -> None:
        """An audit record when this process sees a tool first, or sees it change. A first sighting
        whose digest is not the recorded one (another replica, or this one before a restart,
        recorded another) is a change too."""
        last = self._last.get(name)
        if last == digest:
            return
        previous = last if last is not None else (recorded if recorded != digest else None)
        event = "first_seen" if previous is None else "changed"
        # Written before the digest is taken as seen: a refused record (AuditUnavailable) fails the
        # listing, and the next one records the sighting again.
        self._record({"route": "mcp.tool", "event": event, "server": self._upstream.name, "tool": name,
                      "tool_digest": digest, "previous_digest": previous})
        if previous is not None:
            logger.warning("MCP server %s changed the definition of tool %s: %s -> %s",
                           self._upstream.name, name, previous, digest)
        self._last[name] = digest

    def digests(self) -> dict[str, str]:
        """Each tool's current digest (tenantgate mcp pin)."""
        return {name: tool.digest for name, tool in sorted(self._tools.items())}
