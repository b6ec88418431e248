"""Liveness and readiness. Neither needs a token; neither says more than ok or not."""

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gateway.deps import GatewayDep

router = APIRouter()


@router.get("/healthz", include_in_schema=False)
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz", include_in_schema=False)
async def readyz(gateway: GatewayDep) -> JSONResponse:
    checks = {
        "engine": gateway.backend.ready(),
        "policy": gateway.policy.ready(),
        "signing_keys": gateway.verifier.key_sets_missing() == 0,
    }
    if hasattr(gateway.limiter, "ping"):
        checks["quota_store"] = await gateway.limiter.ping()
    ready = all(checks.values())
    return JSONResponse({"status": "ready" if ready else "not ready", "checks": checks},
                        status_code=200 if ready else 503)
