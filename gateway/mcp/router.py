"""/mcp/{server}: MCP's Streamable HTTP transport (POST one JSON-RPC message, JSON back; DELETE ends
a session; no server-initiated stream, so GET is 405), with the gateway as OAuth resource server.

A request without a valid token is 401 with `WWW-Authenticate: Bearer resource_metadata="…"`, whose
document (RFC 9728, /.well-known/oauth-protected-resource/mcp/{server}) names the Entra authority
and the scope to ask for. Tokens are checked by the gateway's verifier, audience included (RFC
8707: this gateway's, never another resource's). A token without the tools scope (or app role) is
403 `insufficient_scope` naming the scope to step up to. The token goes no further: the gateway
calls the server with its own credential.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.auth.exceptions import AuthError, TenantsUnknownError
from gateway.auth.principal import Principal, canonical_guid
from gateway.mcp.exceptions import INVALID_REQUEST, JsonRpcError
from gateway.mcp.jsonrpc import error, parse_message
from gateway.mcp.service import McpService

logger = logging.getLogger("tenantgate.mcp")

REQUIRED_SCOPE = "Tools.Invoke"  # delegated tokens (scp)
REQUIRED_APP_ROLE = "Tools.Invoke.All"  # app-only tokens (roles)
MAX_MESSAGE_BYTES = 256 * 1024  # one JSON-RPC message from a caller: a tool's arguments, not its files
METADATA_PREFIX = "/.well-known/oauth-protected-resource"
UNAUTHORIZED = -32001  # carried with 401 and 403: the transport's answer, in JSON-RPC's shape

router = APIRouter(include_in_schema=False)


def _service(request: Request) -> McpService | None:
    return getattr(request.app.state, "mcp", None)


def _base_url(request: Request) -> str:
    """The configured public URL; else the request's own (its Host header: the caller's to write)."""
    return request.app.state.gateway.settings.public_url.rstrip("/") or str(request.base_url).rstrip("/")


def _metadata_url(request: Request, server: str) -> str:
    return f"{_base_url(request)}{METADATA_PREFIX}/mcp/{server}"


def _rpc_error(exc: JsonRpcError, id_=None) -> JSONResponse:
    return JSONResponse(error(id_, exc), status_code=exc.status, headers=exc.headers)


def _unknown_server() -> JSONResponse:
    return _rpc_error(JsonRpcError(INVALID_REQUEST, "no MCP server of that name is served here", status=404))


def _scope(request: Request) -> str:
    audience = request.app.state.gateway.settings.audiences[0]
    return f"{audience}/{REQUIRED_SCOPE}"


@router.get(METADATA_PREFIX + "/mcp/{server}")
async def protected_resource_metadata(server: str, request: Request) -> Response:
    """RFC 9728's document for one server. The authority is the caller's tenant's when it names one
    (`?tenant=<guid>`, as a client that knows its tenant does), else Entra's multi-tenant one."""
    service = _service(request)
    if service is None or server not in service.servers:
        return _unknown_server()
    verifier = request.app.state.gateway.verifier
    tenant = canonical_guid(request.query_params.get("tenant")) or "organizations"
    return JSONResponse({
        "resource": f"{_base_url(request)}/mcp/{server}",
        "authorization_servers": [verifier.issuer_for(tenant, "2.0")],
        "scopes_supported": [_scope(request)],
        "bearer_methods_supported": ["header"],
        "resource_name": f"tenantgate MCP server {server}",
    }, headers={"Cache-Control": "public, max-age=300" if request.app.state.gateway.settings.public_url
                else "no-store"})  # a document naming a caller-written Host must not reach a shared cache


def _challenge(request: Request, server: str, **params: str) -> dict[str, str]:
    """The WWW-Authenticate header of a 401 or 403: its parameters, then where the metadata document is."""
    named = "".join(f', {name}="{value}"' for name, value in params.items())
    metadata = _metadata_url(request, server)
    return {"WWW-Authenticate": f'Bearer realm="tenantgate"{named}, resource_metadata="{metadata}"'}


async def _principal(request: Request, server: str) -> Principal | Response:
    """The verified caller, or the 401/403/503 that ends the request."""
    header = request.headers.get("authorization")
    scheme, _, token = (header or "").partition(" ")
    if not header or scheme.lower() != "bearer" or not token.strip():
        return _rpc_error(JsonRpcError(UNAUTHORIZED, "an Authorization: Bearer <Entra ID access token> header "
                                       "is required", status=401, headers=_challenge(request, server)))
    gateway = request.app.state.gateway
    try:
        principal = await gateway.verifier.verify(token.strip())
    except TenantsUnknownError:
        gateway.metrics.auth_failures.labels("tenants_unknown").inc()
        return _rpc_error(JsonRpcError(INVALID_REQUEST, "the gateway cannot check tokens until its policy source "
                                       "has answered; retry shortly", status=503, headers={"Retry-After": "2"}))
    except AuthError as exc:
        gateway.metrics.auth_failures.labels(exc.code).inc()
        return _rpc_error(JsonRpcError(UNAUTHORIZED, "the access token is invalid or is not accepted by this "
                                       "service", status=401,
                                       headers=_challenge(request, server, error="invalid_token")))
    if principal.idtyp == "app":
        allowed = REQUIRED_APP_ROLE in principal.roles
    else:
        allowed = REQUIRED_SCOPE in principal.scopes
    if not allowed:
        scope = _scope(request) if principal.idtyp == "user" else REQUIRED_APP_ROLE
        return _rpc_error(JsonRpcError(UNAUTHORIZED, f"the token lacks the permission to use tools ({scope})",
                                       status=403,
                                       headers=_challenge(request, server, error="insufficient_scope", scope=scope)))
    return principal


def _foreign_origin(request: Request) -> bool:
    """A browser's request from another origin (DNS rebinding): the transport spec says refuse it."""
    origin = request.headers.get("origin")
    if origin is None:
        return False
    return urlsplit(origin).netloc.lower() != (request.headers.get("host") or "").lower()


async def _body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_MESSAGE_BYTES):
        raise JsonRpcError(INVALID_REQUEST, f"a message may be at most {MAX_MESSAGE_BYTES} bytes", status=413)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_MESSAGE_BYTES:
            raise JsonRpcError(INVALID_REQUEST, f"a message may be at most {MAX_MESSAGE_BYTES} bytes", status=413)
    return bytes(body)


@router.post("/mcp/{server}")
async def post_message(server: str, request: Request) -> Response:
    service = _service(request)
    if service is None or server not in service.servers:
        return _unknown_server()
    if _foreign_origin(request):
        return _rpc_error(JsonRpcError(INVALID_REQUEST, "requests from another origin are refused", status=403))
    principal = await _principal(request, server)
    if isinstance(principal, Response):
        return principal
    message = None
    try:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise JsonRpcError(INVALID_REQUEST, "the body must be application/json", status=415)
        message = parse_message(await _body(request))
        reply = await service.handle(principal, server, message, request.headers)
    except JsonRpcError as exc:
        if message is not None and message.notification and exc.status < 400:
            return Response(status_code=202)  # a notification gets no response, error or not
        return _rpc_error(exc, message.id if message is not None else None)
    if reply.body is None:
        return Response(status_code=reply.status, headers=reply.headers)
    return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)


@router.delete("/mcp/{server}")
async def end_session(server: str, request: Request) -> Response:
    service = _service(request)
    if service is None or server not in service.servers:
        return _unknown_server()
    principal = await _principal(request, server)
    if isinstance(principal, Response):
        return principal
    session_id = request.headers.get("mcp-session-id")
    if session_id is None:
        return _rpc_error(JsonRpcError(INVALID_REQUEST, "an Mcp-Session-Id header is required", status=400))
    if not service.sessions.close(session_id, (principal.tenant_id, principal.object_id), server):
        return _rpc_error(JsonRpcError(INVALID_REQUEST, "no such session", status=404))
    return Response(status_code=204)


@router.get("/mcp/{server}")
async def no_stream(server: str) -> Response:
    """The gateway opens no server-initiated stream (it sends no requests or notifications of its own)."""
    return Response(status_code=405, headers={"Allow": "POST, DELETE"})
