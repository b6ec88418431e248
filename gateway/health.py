"""Liveness and readiness. Neither needs a token; neither says more than ok or not.

Readiness depends only on what no caller can change: the engine, the policy (for OPA, as
its background watch last found it), the quota store and the audit trail (whether its
sinks can write). Not on any tenant's signing keys:
anyone may send a token naming a registered tenant whose keys cannot be fetched, and that
must not take every replica out of the Service. Which check failed goes to the log and to
the `tenantgate_ready{check}` gauge on the metrics listener, never to the public answer.
"""

import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gateway.context import Gateway
from gateway.deps import GatewayDep

router = APIRouter()
logger = logging.getLogger("tenantgate.gateway")


@router.get("/healthz", include_in_schema=False)
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz", include_in_schema=False)
async def readyz(gateway: GatewayDep) -> JSONResponse:
    # Ready when every model has a target that can take requests (remote ones fail over among themselves).
    engines = all(any(t.ready() for t in served.targets) for served in gateway.models.values())
    # A replica whose audit sink cannot write refuses every request (503 audit_unavailable): out of the Service.
    checks = {"engine": engines, "policy": gateway.policy.ready(), "audit": gateway.audit.accepting}
    quota_store = await gateway.limiter.ping()
    if quota_store is not None:  # an in-process limiter has no store
        checks["quota_store"] = quota_store
    _record(gateway, checks)
    ready = all(checks.values())
    return JSONResponse({"status": "ready" if ready else "not ready"}, status_code=200 if ready else 503)


def _record(gateway: Gateway, checks: dict[str, bool]) -> None:
    last = gateway.readiness
    for name, ok in checks.items():
        gateway.metrics.ready.labels(name).set(1 if ok else 0)
        if last.get(name) != ok:
            if ok:
                logger.info("readiness check %s: ok", name)
            else:
                logger.warning("readiness check %s: failing", name)
            last[name] = ok
