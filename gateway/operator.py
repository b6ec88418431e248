"""The operator listener: /metrics, /admin/* and the console (/console) on their own port, never the API port.

/metrics answers whoever can reach the port, as a Prometheus scrape expects (keep the port
inside the cluster). /admin/* needs an Entra access token from one of the platform's own tenants
(TENANTGATE_OPERATOR_TENANTS), enabled in the policy data, that carries the app role
`TenantGate.Operator` (in development, one from the dev issuer: `tenantgate token --tenant
"TenantGate Platform" --role TenantGate.Operator`). Without a token the answer is 401; a token
lacking the role, or from any other tenant, is 403, and the refusal is audited. The role alone
proves nothing: a customer tenant's own admin can grant it to the customer's apps.

The listener runs in a thread with its own event loop, so a slow admin report never holds
up the API; tokens are still checked on the gateway's loop, by the gateway's own verifier.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Annotated

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from prometheus_client.exposition import choose_encoder

from engine.remote import NO_NATIVE_TELEMETRY, EdgeLimits, edge_config
from gateway.auth.principal import Principal
from gateway.context import Gateway
from gateway.deps import bearer_token, verified_principal
from gateway.error_handlers import install_handlers
from gateway.errors import GatewayError
from gateway.middleware import BodySizeLimit

OPERATOR_ROLE = "TenantGate.Operator"
STARTUP_TIMEOUT_S = 10.0


class NotOperator(GatewayError):
    status_code = 403
    type = "permission_denied"
    code = "operator_role_required"


class NotOperatorTenant(NotOperator):
    code = "operator_tenant_required"


async def verified_on_gateway_loop(request: Request, token: str) -> Principal:
    """The token's principal, checked by the gateway's verifier on the gateway's loop."""
    gateway: Gateway = request.app.state.gateway
    checked = asyncio.run_coroutine_threadsafe(verified_principal(gateway, token), request.app.state.gateway_loop)
    return await asyncio.wrap_future(checked)


def operator_refusal(gateway: Gateway, principal: Principal) -> NotOperator | None:
    """Why this verified principal is not an operator, or None if it is: it must carry the
    TenantGate.Operator app role and come from a platform tenant the policy data lists as enabled."""
    if OPERATOR_ROLE not in principal.roles:
        return NotOperator(f"this needs the {OPERATOR_ROLE} app role")
    if (principal.tenant_id not in gateway.settings.operator_tenant_ids
            or gateway.policy.tenant_enabled(principal.tenant_id) is not True):
        return NotOperatorTenant("operators come only from the platform's own tenant")
    return None


async def operator_for(request: Request, token: str, route: str) -> Principal:
    """The token's principal, if an operator; a refusal past authentication is audited under `route`."""
    principal = await verified_on_gateway_loop(request, token)
    refusal = operator_refusal(request.app.state.gateway, principal)
    if refusal is not None:
        audit_operator(request.app.state.gateway, principal, route, refusal.status_code, refusal.code)
        raise refusal
    return principal


def _admin_route(request: Request) -> str:
    """admin.usage, admin.console: the route name an /admin/* request's records carry."""
    return "admin." + request.url.path.removeprefix("/admin/").strip("/").replace("/", ".")


async def operator(request: Request) -> Principal:
    """The caller, if an operator (the bearer token of the request)."""
    return await operator_for(request, bearer_token(request), _admin_route(request))


OperatorDep = Annotated[Principal, Depends(operator)]


def audit_operator(gateway: Gateway, operator: Principal, route: str, status: int, outcome: str) -> None:
    """What an operator read or did, and how it went: a record in the audit trail."""
    gateway.audit.write({"route": route, **gateway.audit.principal_digests(operator), "status": status,
                         "outcome": outcome})


def operator_app(gateway: Gateway, gateway_loop: asyncio.AbstractEventLoop) -> FastAPI:
    from gateway.console import install_console
    from gateway.usage.router import router as usage_router

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None, telemetry=NO_NATIVE_TELEMETRY)
    app.state.gateway = gateway
    app.state.gateway_loop = gateway_loop
    install_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=gateway.settings.max_body_bytes)

    @app.get("/metrics")
    def metrics(request: Request) -> Response:
        # OpenMetrics for a scraper that asks for it (Prometheus does): it carries the units.
        encode, media_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(gateway.metrics.registry), media_type=media_type)

    app.include_router(usage_router)
    install_console(app)
    return app


class OperatorListener:
    """The operator port, behind the same edge as the API port: its own connection bound, the same
    header cap, deadlines and body cap (Helm binds it to every interface of the pod)."""

    def __init__(self, app: FastAPI, host: str, port: int, limits: EdgeLimits) -> None:
        # log_config=None leaves logging as the gateway set it up (access_log=False would also
        # silence the API listener's access log: uvicorn turns that logger off process-wide).
        config = edge_config(app, limits, host=host, port=port, log_config=None, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="operator-listener", daemon=True)

    def start(self) -> int:
        """Serves in the background; returns the bound port."""
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                config = self._server.config
                raise OSError(f"the operator listener could not listen on {config.host}:{config.port}")
            time.sleep(0.01)
        return self._server.servers[0].sockets[0].getsockname()[1]

    def close(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(10)
