"""Typed dependencies: a handler's signature says what it needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Protocol

from fastapi import Depends, Request

from gateway.audit import digest_label
from gateway.auth.exceptions import AuthError, TenantsUnknownError
from gateway.auth.principal import Principal
from gateway.errors import MissingCredentials, Unauthenticated, Unavailable
from gateway.limits.headroom import QuotaHeadroom
from gateway.tracing import trace_of

if TYPE_CHECKING:
    from gateway.audit import AuditRecorder
    from gateway.auth import EntraVerifier
    from gateway.deployments.registry import ServedModel
    from gateway.deployments.routing import Router
    from gateway.inference import InferenceBackend
    from gateway.limits import Limiter
    from gateway.metrics import GatewayMetrics
    from gateway.openai.responses_api.store import ResponseStore
    from gateway.policy.service import PolicyEngine
    from gateway.settings import Settings


class DevIssuer(Protocol):
    """A token issuer on loopback for development (devkit.issuer.LocalIssuer, which `serve --dev`
    passes in): the app starts it before its verifier and trusts only it, and stops it last."""

    @property
    def base_url(self) -> str: ...

    def start(self) -> object: ...

    def stop(self) -> None: ...


@dataclass
class Gateway:
    """Everything the app factory built, handed to services as one typed value."""

    settings: Settings
    verifier: EntraVerifier
    policy: PolicyEngine
    backend: InferenceBackend | None  # the embedded engine, when one of the deployments is embedded
    limiter: Limiter
    audit: AuditRecorder
    metrics: GatewayMetrics
    models: dict[str, ServedModel] = field(default_factory=dict)  # by the name callers use
    router: Router | None = None
    responses_store: ResponseStore | None = None  # where /v1/responses stores (Redis); None: nothing is stored
    issuer: DevIssuer | None = None  # development only (settings.dev_issuer): tests mint tokens with it
    extras: dict = field(default_factory=dict)
    headroom: QuotaHeadroom = field(default_factory=QuotaHeadroom)  # the quota store's last answer per tenant
    background: set = field(default_factory=set)  # tasks that must outlive their request


async def get_gateway(request: Request) -> Gateway:
    return request.app.state.gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]


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


async def authenticate(request: Request, gateway: GatewayDep) -> Principal:
    trace = trace_of(request)
    with trace.stage("authenticate") as span:
        principal = await verified_principal(gateway, bearer_token(request))
        request.state.principal = principal
        # Metrics and spans carry a short keyed digest of the tenant: stable for dashboards, not
        # reversible (metrics carry the tenant's name instead, once a decision allows it:
        # pipeline/admission.judge).
        request.state.tenant_label = digest_label(gateway.audit.tenant_digest(principal.tenant_id))
        span.set_attribute("tenantgate.principal.type", principal.idtyp)
    trace.set({"tenantgate.tenant": request.state.tenant_label})
    return principal


PrincipalDep = Annotated[Principal, Depends(authenticate)]

POLICY_REFUSAL = "the policy engine could not decide this request; it is denied"


def inference_caller(route: str):
    """The caller of an inference route: authenticated, and refused at once while its tenant's policy
    evaluation is held (it failed moments ago), before the body is validated, rendered or judged. A
    tenant whose data fails evaluation then costs the shared loop little more than its
    authentication, however fast it sends."""

    async def caller(request: Request, gateway: GatewayDep, principal: PrincipalDep) -> Principal:
        if gateway.policy.held(principal.tenant_id):
            request.state.decision = "error"
            refusal = Unavailable(POLICY_REFUSAL)
            gateway.audit.write({"route": route, **gateway.audit.principal_digests(principal),
                                 "policy_revision": gateway.policy.revision, "decision": None, "model": None,
                                 "deployment": None, "status": refusal.status_code, "outcome": refusal.code})
            raise refusal
        return principal

    return Annotated[Principal, Depends(caller)]
