"""The gateway's parts, as the app factory built them: one typed value, free of HTTP, handed to
the pipeline and the services (gateway/deps.py hands it to handlers)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gateway.limits.headroom import QuotaHeadroom

if TYPE_CHECKING:
    from gateway.audit import AuditRecorder
    from gateway.auth.entra import EntraVerifier
    from gateway.deployments.registry import ServedModel
    from gateway.deployments.routing import Router
    from gateway.inference import InferenceBackend
    from gateway.limits import Limiter
    from gateway.metrics import GatewayMetrics
    from gateway.openai.responses_api.store import ResponseStore
    from gateway.policy.service import PolicyEngine
    from gateway.settings import Settings


def _router() -> Router:
    from gateway.deployments.routing import Router

    return Router()


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
    router: Router = field(default_factory=lambda: _router())  # the app's is built from the settings
    responses_store: ResponseStore | None = None  # where /v1/responses stores (Redis); None: nothing is stored
    issuer: DevIssuer | None = None  # development only (settings.dev_issuer): tests mint tokens with it
    started: int = 0  # Unix time the app started: the `created` of /v1/models entries
    readiness: dict[str, bool] = field(default_factory=dict)  # /readyz's last result per check, to log changes
    headroom: QuotaHeadroom = field(default_factory=QuotaHeadroom)  # the quota store's last answer per tenant
    background: set[asyncio.Task] = field(default_factory=set)  # tasks that must outlive their request
