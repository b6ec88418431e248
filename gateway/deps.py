"""Typed dependencies: a handler's signature says what it needs.

Each route resolves one dependency, a coroutine that takes the request alone and does the rest
in plain calls: FastAPI's solver costs per dependency it walks, and runs a plain `def`
dependency on a worker thread, so a chain of small ones cost more than the work they did.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from gateway.audit import digest_label
from gateway.auth.exceptions import AuthError, TenantsUnknownError
from gateway.auth.principal import Principal
from gateway.context import Gateway
from gateway.errors import MissingCredentials, Unauthenticated, Unavailable
from gateway.pipeline.admission import POLICY_REFUSAL
from gateway.pipeline.exchange import Exchange
from gateway.tracing import trace_of

CLASSIFICATION_HEADER = "x-data-classification"


async def get_gateway(request: Request) -> Gateway:
    return request.app.state.gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]


def exchange_of(request: Request) -> Exchange:
    """The call's HTTP side as the pipeline sees it: made once per request, kept in its scope state,
    where the middleware reads the response headers and metric labels the pipeline set."""
    exchange = getattr(request.state, "exchange", None)
    if exchange is None:
        # The request only by a weak reference: the exchange lives in the request's own scope, so a
        # strong one is a reference cycle, and every request's objects (its Request, the server's
        # cycle, the middleware's wrappers: about 30) would wait for the cyclic collector instead of
        # going when it ends. The collector's passes over them cost more than a tenth of a cache
        # hit's CPU at concurrency 32 (issue 31). The endpoint holds the request while it runs.
        held = weakref.ref(request)

        async def disconnected() -> None:
            alive = held()
            if alive is None:  # the request has ended: there is no caller left to watch
                await asyncio.Event().wait()
                return
            receive = alive.receive
            del alive
            while (await receive())["type"] != "http.disconnect":
                pass

        exchange = Exchange(data_classification=request.headers.get(CLASSIFICATION_HEADER),
                            trace=trace_of(request), disconnected=disconnected)
        request.state.exchange = exchange
    return exchange


def bearer_token(request: Request) -> str:
    header = request.headers.get("authorization")
    if not header:
        raise MissingCredentials()
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
    return token.strip()


async def verified_principal(gateway: Gateway, token: str) -> Principal:
    """The token's principal, or the one answer every refused token gets."""
    try:
        return await gateway.verifier.verify(token)
    except TenantsUnknownError:
        gateway.metrics.auth_failures.labels("tenants_unknown").inc()
        raise Unavailable("the gateway cannot check tokens until its policy source has answered; retry shortly",
                          headers={"Retry-After": "2"}) from None
    except AuthError as exc:
        # The reason is for the log (the verifier wrote it) and the metric; the caller gets one answer.
        gateway.metrics.auth_failures.labels(exc.code).inc()
        raise Unauthenticated() from None


async def authenticated(request: Request, gateway: Gateway, exchange: Exchange) -> Principal:
    trace = exchange.trace
    with trace.stage("authenticate") as span:
        principal = await verified_principal(gateway, bearer_token(request))
        # Metrics and spans carry a short keyed digest of the tenant: stable for dashboards, not
        # reversible (metrics carry the tenant's name instead, once a decision allows it:
        # pipeline/admission.judge).
        exchange.tenant_label = digest_label(gateway.audit.tenant_digest(principal.tenant_id))
        span.set_attribute("tenantgate.principal.type", principal.idtyp)
    trace.set({"tenantgate.tenant": exchange.tenant_label})
    return principal


@dataclass(frozen=True, slots=True)
class Call:
    """What a route's handler works with: the gateway, the call's Exchange and its caller."""

    gateway: Gateway
    exchange: Exchange
    principal: Principal


async def authenticated_call(request: Request) -> Call:
    gateway: Gateway = request.app.state.gateway
    exchange = exchange_of(request)
    return Call(gateway, exchange, await authenticated(request, gateway, exchange))


CallDep = Annotated[Call, Depends(authenticated_call)]


def inference_caller(route: str) -> Callable[[Request], Awaitable[Call]]:
    """The call of an inference route: authenticated, and refused at once while its tenant's policy
    evaluation is held (it failed moments ago), before the body is validated, rendered or judged. A
    tenant whose data fails evaluation then costs the shared loop little more than its
    authentication, however fast it sends."""

    async def caller(request: Request) -> Call:
        call = await authenticated_call(request)
        gateway, exchange, principal = call.gateway, call.exchange, call.principal
        if gateway.policy.held(principal.tenant_id):
            exchange.decision = "error"
            refusal = Unavailable(POLICY_REFUSAL)
            gateway.audit.write({"route": route, **gateway.audit.principal_digests(principal),
                                 "policy_revision": gateway.policy.revision, "decision": None, "model": None,
                                 "deployment": None, "status": refusal.status_code, "outcome": refusal.code})
            raise refusal
        return call

    return caller
