"""The MCP endpoint's work, free of HTTP: one JSON-RPC message from a verified principal to one
upstream server, judged by the tools decision and enforced here.

tools/list shows only the tools the decision lists (a denied tool, or one whose definition is not
the accepted one, is withheld). tools/call is refused unless the decision allows that tool, with
its definition's digest and these arguments; it then runs under the tool's budget (the gateway's
limiter: calls per minute for the tenant and for the principal, calls in flight) and within the
smaller of the server's and the decision's result cap. Every call leaves one audit record:
server, tool, digest, decision, outcome, latency, result bytes; arguments and result only when
the decision's logging allows redacted content, and then through the redactor.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client import CollectorRegistry, Counter, Histogram

from engine import random_hex
from gateway.audit import AuditRecorder
from gateway.auth.principal import Principal
from gateway.errors import AuditUnavailable, RateLimited
from gateway.limits import Admission, Limiter, QuotaStoreUnavailable, Ticket
from gateway.mcp.catalogue import Catalogue, Tool
from gateway.mcp.exceptions import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    POLICY_UNAVAILABLE,
    RATE_LIMITED,
    RESULT_TOO_LARGE,
    JsonRpcError,
    UpstreamFailed,
)
from gateway.mcp.jsonrpc import Message
from gateway.mcp.sessions import SessionFull, Sessions
from gateway.mcp.upstream import ResultTooLarge, Upstream
from gateway.metrics import Bound
from gateway.policy.exceptions import PolicyError
from gateway.policy.schema import ToolsDecision
from gateway.policy.service import PolicyEngine, ToolsJudgement

logger = logging.getLogger("tenantgate.mcp")

# The handshake revisions this endpoint speaks, newest first; the `mcp` package's client offers the newest.
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18")
# The stateless revisions (no handshake, no session: each request carries its envelope in params._meta).
MODERN_VERSIONS = ("2026-07-28",)
VERSION_META = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_META = "io.modelcontextprotocol/clientCapabilities"
HEADER_MISMATCH = -32020
UNSUPPORTED_PROTOCOL_VERSION = -32022
# 2026-07-28 answers these codes with these statuses (the spec's table); others travel with 200.
MODERN_STATUS = {INVALID_PARAMS: 400, METHOD_NOT_FOUND: 404}
POLICY_DENIED = -32001
SERVER_VERSION = "0.1.0"
INSTRUCTIONS = "Tools of this server as the tenant's policy allows them."
QUOTA_STORE_RETRY_S = 2


@dataclass
class Reply:
    """What the endpoint answers: an HTTP status, a JSON-RPC body (None: 202, nothing), headers."""

    status: int
    body: dict | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Server:
    upstream: Upstream
    catalogue: Catalogue


class McpMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter("tenantgate_mcp_tool_calls", "MCP tools/call by server and outcome",
                             ["server", "outcome"], registry=registry)
        self.duration = Histogram("tenantgate_mcp_tool_call_duration_seconds",
                                  "MCP tools/call latency through the gateway, upstream included", ["server"],
                                  registry=registry)
        self.listings = Counter("tenantgate_mcp_tool_listings", "MCP tools/list by server and outcome",
                                ["server", "outcome"], registry=registry)
        # The children a call touches, bound once per label set (servers and outcomes are few).
        self.call_count, self.call_time = Bound(self.calls), Bound(self.duration)
        self.listing_count = Bound(self.listings)


class McpService:
    def __init__(self, servers: dict[str, Server], *, policy: PolicyEngine, limiter: Limiter, audit: AuditRecorder,
                 metrics: McpMetrics, sessions: Sessions | None = None, tracer=None) -> None:
        self.servers = servers
        self.policy = policy
        self.limiter = limiter
        self.audit = audit
        self.metrics = metrics
        self.sessions = sessions or Sessions()
        self.tracer = tracer

    async def aclose(self) -> None:
        for server in self.servers.values():
            await server.upstream.aclose()

    # -- the session -----------------------------------------------------------------------

    async def handle(self, principal: Principal, server_name: str, message: Message,
                     headers: Mapping[str, str]) -> Reply:
        """headers: the request's, by lower-case name (mcp-session-id, mcp-protocol-version, mcp-method, mcp-name)."""
        server = self.servers[server_name]  # the router answered an unknown server already
        if _is_modern(message, headers):
            try:
                return await self._modern(principal, server_name, server, message, headers)
            except JsonRpcError as exc:
                if exc.status == 200 and exc.code in MODERN_STATUS:
                    exc.status = MODERN_STATUS[exc.code]
                raise
        owner = (principal.tenant_id, principal.object_id)
        session_id = headers.get("mcp-session-id")
        if message.method == "initialize":
            return self._initialize(owner, server_name, message)
        if session_id is None:
            raise JsonRpcError(INVALID_REQUEST, "an Mcp-Session-Id header is required: initialize first", status=400)
        session = self.sessions.find(session_id, owner, server_name)
        if session is None:  # never opened, ended, or another principal's: the same answer
            raise JsonRpcError(INVALID_REQUEST, "no such session: initialize a new one", status=404)
        if message.notification:
            return Reply(202)
        if message.method == "ping":
            return Reply(200, _result(message, {}))
        if message.method == "tools/list":
            return await self._list(principal, server_name, server, message)
        if message.method == "tools/call":
            return await self._call(principal, server_name, server, message)
        raise JsonRpcError(METHOD_NOT_FOUND, "method not found: this endpoint serves tools/list and tools/call")

    def _initialize(self, owner: tuple[str, str], server_name: str, message: Message) -> Reply:
        if message.notification:
            raise JsonRpcError(INVALID_REQUEST, "initialize is a request, not a notification", status=400)
        asked = message.params.get("protocolVersion")
        version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
        try:
            session = self.sessions.open(owner, server_name, version)
        except SessionFull:
            raise JsonRpcError(INVALID_REQUEST, "the gateway holds as many MCP sessions as it may; retry later",
                               status=503, headers={"Retry-After": "30"}) from None
        result = {"protocolVersion": version, "capabilities": {"tools": {"listChanged": False}},
                  "serverInfo": _server_info(server_name), "instructions": INSTRUCTIONS}
        return Reply(200, _result(message, result), {"Mcp-Session-Id": session.id})

    # -- 2026-07-28: each request on its own --------------------------------------------------

    async def _modern(self, principal: Principal, server_name: str, server: Server, message: Message,
                      headers: Mapping[str, str]) -> Reply:
        version = _checked_envelope(message, headers)
        if version not in MODERN_VERSIONS:
            raise JsonRpcError(UNSUPPORTED_PROTOCOL_VERSION, "Unsupported protocol version", status=400,
                               data={"supported": list(MODERN_VERSIONS), "requested": version})
        if message.notification:
            return Reply(202)
        if message.method == "server/discover":
            return Reply(200, _result(message, {
                "supportedVersions": list(MODERN_VERSIONS), "capabilities": {"tools": {"listChanged": False}},
                "instructions": INSTRUCTIONS, "resultType": "complete", "ttlMs": 0, "cacheScope": "private",
                "_meta": {"io.modelcontextprotocol/serverInfo": _server_info(server_name)}}))
        if message.method == "tools/list":
            reply = await self._list(principal, server_name, server, message)
        elif message.method == "tools/call":
            reply = await self._call(principal, server_name, server, message)
        else:
            raise JsonRpcError(METHOD_NOT_FOUND, "method not found: this endpoint serves tools/list and tools/call")
        result = reply.body["result"] if reply.body is not None else {}
        # A listing is never to be reused: the policy may list otherwise a moment later.
        extra = {"ttlMs": 0, "cacheScope": "private"} if message.method == "tools/list" else {}
        result.update({"resultType": "complete", **extra})
        return reply

    # -- the decision ----------------------------------------------------------------------

    async def _decide(self, document: dict) -> ToolsJudgement:
        try:
            return await self.policy.decide_tools(document)
        except PolicyError:
            raise JsonRpcError(POLICY_UNAVAILABLE, "the policy could not decide this request, so it is refused; "
                               "retry shortly", status=503, headers={"Retry-After": "2"}) from None

    async def _admit(self, principal: Principal, server_name: str, tool: str | None,
                     decision: ToolsDecision, principal_digest: str | None = None) -> Ticket:
        """A ticket under the tool's budget; principal_digest: the caller's, when the record has it already."""
        principal_digest = principal_digest or self.audit.principal_digests(principal)["principal"]
        budget = decision.tool
        # A budget key of its own per tenant, server and tool (the listing's: tool None), keyed like the
        # tenant's own keys so that no id appears in the quota store.
        key = self.audit.digest(f"mcp:{principal.tenant_id}:{server_name}:{tool or ''}")
        admission = Admission(tenant=key, principal=principal_digest, request_id=random_hex(), tokens=0,
                              requests_per_minute=budget.calls_per_minute, tokens_per_minute=1,
                              principal_requests_per_minute=budget.calls_per_minute, principal_tokens_per_minute=1,
                              concurrent_requests=budget.concurrency)
        try:
            return await self.limiter.admit(admission)
        except RateLimited as exc:
            message = exc.message.replace("the tenant's", "this tool's").replace("the caller's",
                                                                                 "this tool's, per caller,")
            raise JsonRpcError(RATE_LIMITED, message, status=429,
                               headers={"Retry-After": exc.headers.get("Retry-After", "1")},
                               data={"retry_after_s": exc.retry_after_s}) from None
        except QuotaStoreUnavailable:
            raise JsonRpcError(RATE_LIMITED, "the quota store is unreachable, so this call is refused (fail closed); "
                               "retry shortly", status=503,
                               headers={"Retry-After": str(QUOTA_STORE_RETRY_S)}) from None

    # -- tools/list ------------------------------------------------------------------------

    async def _list(self, principal: Principal, server_name: str, server: Server, message: Message) -> Reply:
        outcome = "error"
        try:
            tools = await server.catalogue.tools()
            judgement = await self._decide({
                "principal": principal.policy_input(), "server": server_name, "method": "tools/list",
                "tools": [tool.policy_input() for tool in tools.values()]})
            decision = judgement.decision
            if not decision.allow:
                outcome = "denied"
                raise _denied(decision)
            ticket = await self._admit(principal, server_name, None, decision)
            await self.limiter.settle(ticket, 0)
            listed = [tools[name].definition for name in decision.listed if name in tools]
            outcome = "ok"
            return Reply(200, _result(message, {"tools": listed}))
        finally:
            self.metrics.listing_count(server_name, outcome).inc()

    # -- tools/call ------------------------------------------------------------------------

    async def _call(self, principal: Principal, server_name: str, server: Server, message: Message) -> Reply:
        name, arguments = message.params.get("name"), message.params.get("arguments", {})
        if not isinstance(name, str) or not name:
            raise JsonRpcError(INVALID_PARAMS, "tools/call needs the tool's name (params.name)")
        if not isinstance(arguments, dict):
            raise JsonRpcError(INVALID_PARAMS, "a tool's arguments must be an object (params.arguments)")
        started = time.perf_counter()
        record: dict = {"route": "mcp.tools/call", **self.audit.principal_digests(principal), "server": server_name,
                        "tool": None, "tool_digest": None, "policy_revision": None, "decision": None,
                        "outcome": "error", "status": 200, "latency_ms": None, "result_bytes": 0}
        span = self._span(server_name)
        try:
            reply = await self._run_call(principal, server_name, server, message, name, arguments, record)
        except JsonRpcError as exc:
            record["status"], record["error_code"] = exc.status, exc.code
            if record["outcome"] == "error" and exc.code in (POLICY_DENIED, RATE_LIMITED):
                record["outcome"] = "denied" if exc.code == POLICY_DENIED else "rate_limited"
            self._finish(record, started, span, server_name)
            try:
                self.audit.write(record)
            except AuditUnavailable:
                pass  # a refusal already: the trail logged that it could not keep the record
            raise
        except BaseException:
            self._finish(record, started, span, server_name)
            raise
        self._finish(record, started, span, server_name)
        # The answer waits for its record: a call the trail cannot keep is not acknowledged.
        try:
            self.audit.write(record)
        except AuditUnavailable:
            raise JsonRpcError(INVALID_REQUEST, AuditUnavailable.MESSAGE, status=503,
                               headers={"Retry-After": "5"}) from None
        return reply

    def _finish(self, record: dict, started: float, span, server_name: str) -> None:
        elapsed = time.perf_counter() - started
        record["latency_ms"] = round(elapsed * 1000, 3)
        self.metrics.call_count(server_name, record["outcome"]).inc()
        self.metrics.call_time(server_name).observe(elapsed)
        if span is None:
            return
        if record["tool"] is not None:  # a listed tool's name: the server's, not the caller's text
            span.update_name(f"execute_tool {record['tool']}")
            span.set_attribute("gen_ai.tool.name", record["tool"])
        if record["outcome"] not in ("ok", "tool_error"):
            span.set_attribute("error.type", record["outcome"])
            span.set_status(Status(StatusCode.ERROR))
        span.set_attribute("tenantgate.mcp.outcome", record["outcome"])
        span.end()

    async def _run_call(self, principal: Principal, server_name: str, server: Server, message: Message,
                        name: str, arguments: dict, record: dict) -> Reply:
        try:
            tools = await server.catalogue.tools()
        except UpstreamFailed:
            record["outcome"] = "upstream_error"
            raise
        tool: Tool | None = tools.get(name)
        if tool is None:  # not on the server: the caller's text goes nowhere (not even the record)
            record["outcome"] = "unknown_tool"
            raise JsonRpcError(INVALID_PARAMS, "unknown tool: this server lists no tool of that name")
        record["tool"], record["tool_digest"] = tool.name, tool.digest
        judgement = await self._decide({
            "principal": principal.policy_input(), "server": server_name, "method": "tools/call",
            "tool": {**tool.policy_input(), "arguments": arguments}})
        decision = judgement.decision
        record["policy_revision"] = judgement.revision
        record["decision"] = {"allow": decision.allow, "reasons": decision.reasons}
        if not decision.allow:
            raise _denied(decision)
        ticket = await self._admit(principal, server_name, tool.name, decision, record["principal"])
        try:
            try:
                result, size = await server.upstream.request(
                    "tools/call", {"name": tool.name, "arguments": arguments},
                    max_bytes=decision.tool.max_result_bytes or 1)
            except ResultTooLarge:
                record["outcome"] = "result_too_large"
                raise JsonRpcError(RESULT_TOO_LARGE, "the tool's result is larger than this caller may receive "
                                   f"({decision.tool.max_result_bytes} bytes)") from None
            except JsonRpcError:  # the server's own error, or its failure: never taken for the gateway's refusal
                record["outcome"] = "upstream_error"
                raise
        finally:
            await self.limiter.settle(ticket, 0)
        record["result_bytes"] = size
        record["outcome"] = "tool_error" if result.get("isError") is True else "ok"
        content = self._content(decision, arguments, result)
        if content is not None:
            record["content"] = content
        return Reply(200, _result(message, result))

    def _content(self, decision: ToolsDecision, arguments: dict, result: dict) -> dict | None:
        if decision.logging.content != "redacted" or self.audit.redactor is None:
            return None
        return self.audit.redactor.redact({"arguments": arguments, "result": result}, decision.logging.redact)

    def _span(self, server_name: str):
        if self.tracer is None:
            return None
        # The GenAI conventions' tool execution span; the tool's name is the server's (it was listed),
        # the arguments and result never enter it.
        return self.tracer.start_span("execute_tool", kind=SpanKind.INTERNAL, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.type": "extension",
            "mcp.method.name": "tools/call", "tenantgate.mcp.server": server_name})

    # -- tenantgate mcp pin ---------------------------------------------------------------

    async def digests(self) -> dict[str, dict[str, str]]:
        return {name: {tool: t.digest for tool, t in sorted((await server.catalogue.tools()).items())}
                for name, server in sorted(self.servers.items())}


def _server_info(server_name: str) -> dict:
    return {"name": f"tenantgate/{server_name}", "version": SERVER_VERSION}


def _is_modern(message: Message, headers: Mapping[str, str]) -> bool:
    """A 2026-07-28-style request: its version in the header or in the envelope, and no session."""
    if headers.get("mcp-session-id") is not None or message.method == "initialize":
        return False
    meta = message.params.get("_meta")
    return (headers.get("mcp-protocol-version") not in (None, *PROTOCOL_VERSIONS)
            or (isinstance(meta, dict) and VERSION_META in meta))


def _checked_envelope(message: Message, headers: Mapping[str, str]) -> object:
    """The envelope's protocol version, once the envelope is whole and the routing headers agree with
    the body (the spec's ladder: a client that disagrees with itself is told so first)."""
    meta = message.params.get("_meta")
    if not isinstance(meta, dict) or VERSION_META not in meta or CAPABILITIES_META not in meta:
        raise JsonRpcError(INVALID_PARAMS, f"params._meta must carry {VERSION_META!r} and {CAPABILITIES_META!r}",
                           status=400)
    version = meta[VERSION_META]
    if headers.get("mcp-protocol-version") != version:
        raise JsonRpcError(HEADER_MISMATCH, "the MCP-Protocol-Version header does not match params._meta",
                           status=400)
    if headers.get("mcp-method") != message.method:
        raise JsonRpcError(HEADER_MISMATCH, "the Mcp-Method header does not match the method", status=400)
    name = message.params.get("name") if message.method == "tools/call" else None
    if name is not None and _header_value(headers.get("mcp-name")) != name:
        raise JsonRpcError(HEADER_MISMATCH, "the Mcp-Name header does not match params.name", status=400)
    if not isinstance(version, str):
        raise JsonRpcError(INVALID_PARAMS, "the protocol version must be a string", status=400)
    return version


_B64_SENTINEL = re.compile(r"=\?base64\?(?P<payload>[A-Za-z0-9+/]*={0,2})\?=")


def _header_value(value: str | None) -> str | None:
    """A routing header's value: verbatim, or the UTF-8 text of its `=?base64?…?=` form (None if malformed)."""
    if value is None or (match := _B64_SENTINEL.fullmatch(value)) is None:
        return value
    try:
        return base64.b64decode(match["payload"], validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def _denied(decision: ToolsDecision) -> JsonRpcError:
    return JsonRpcError(POLICY_DENIED, "denied by policy: " + "; ".join(decision.reasons), status=403,
                        data={"reasons": decision.reasons})


def _result(message: Message, value: dict) -> dict:
    return {"jsonrpc": "2.0", "id": message.id, "result": value}


__all__ = ["McpMetrics", "McpService", "Reply", "Server", "UpstreamFailed"]
