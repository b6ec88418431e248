"""A LocalIssuer on a free loopback port, and the example tenants tests sign tokens for."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs

from devkit.issuer import DEFAULT_AUDIENCE, DEV_CLIENT_ID, LocalIssuer

# Tenants of policies/data/tenants.example.json.
CONTOSO = "2f6c1a7e-5b3d-4e8a-9c0f-1a2b3c4d5e6f"
FABRIKAM = "8d4e2b10-7c6f-4a91-b3d5-e6f708192a3b"
NORTHWIND = "c1a9e3f5-2d4b-4c6e-8f0a-b2c4d6e8f0a1"
TAILSPIN = "5e7f9a1b-3c5d-4e6f-8a0b-c1d2e3f4a5b6"  # disabled in the example data
ALLOWED_TENANTS = frozenset({CONTOSO, FABRIKAM, NORTHWIND})
AUDIENCES = (DEFAULT_AUDIENCE, DEV_CLIENT_ID)


@contextmanager
def running_issuer(key_dir: Path | None = None) -> Iterator[LocalIssuer]:
    """A started issuer on 127.0.0.1 and a free port; stopped on exit."""
    with LocalIssuer(port=0, key_dir=key_dir) as issuer:
        yield issuer


def verifier_options(issuer: LocalIssuer, **overrides: object) -> dict:
    """EntraVerifier keyword arguments that trust this issuer for both token versions."""
    options: dict = {
        "authority": issuer.base_url,
        "v1_issuer_host": issuer.base_url,
        "audiences": AUDIENCES,
        "tenant_allowed": ALLOWED_TENANTS.__contains__,
    }
    options.update(overrides)
    return options


class FaultyIssuer(LocalIssuer):
    """A LocalIssuer that fails the ways Entra can: a tenant it answers 400 for, as Entra does
    for a deleted tenant or a mistyped id (`deleted`), and endpoints that accept a request and
    then say nothing (`hanging`; each held request is counted in `hung_requests`)."""

    HANG_LIMIT_S = 60.0

    def __init__(self) -> None:
        super().__init__(port=0)
        self.deleted: set[str] = set()
        self.hanging = threading.Event()
        self.hung_requests = 0
        self.refused_requests = 0

    def stop(self) -> None:
        self.hanging.clear()  # the held requests end, so the server can stop
        super().stop()

    def _app(self):
        from starlette.responses import JSONResponse

        app = super()._app()

        async def faulty(scope, receive, send) -> None:
            if self.hanging.is_set():
                self.hung_requests += 1
                deadline = time.monotonic() + self.HANG_LIMIT_S
                while self.hanging.is_set() and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            if scope["path"].strip("/").split("/")[0] in self.deleted:
                self.refused_requests += 1
                body = {"error": "invalid_tenant", "error_description": "AADSTS90002: Tenant not found."}
                await JSONResponse(body, 400)(scope, receive, send)
                return
            await app(scope, receive, send)

        return faulty


class WorkloadIdentityIssuer(LocalIssuer):
    """A LocalIssuer that also answers Entra's token endpoint for one workload identity, as OPA's
    oauth2 credentials call it: a client-credentials grant from `client_id` in `tenant_id` whose
    client assertion is `federated_token` (the token the workload identity webhook projects into
    the pod) gets `access_token` for `scope`; anything else gets 400 invalid_client."""

    ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"

    def __init__(self, *, tenant_id: str, client_id: str, federated_token: str, scope: str, **options) -> None:
        super().__init__(port=0, **options)
        self._expected = {"grant_type": "client_credentials", "client_id": client_id,
                          "client_assertion_type": self.ASSERTION_TYPE, "client_assertion": federated_token}
        self._tenant_id, self._scope = tenant_id, scope
        self.access_token = secrets.token_urlsafe(32)
        self.token_grants: list[bool] = []  # one entry per token request: granted or not

    def _app(self):
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def token(request) -> JSONResponse:
            form = {name: values[0] for name, values in parse_qs((await request.body()).decode()).items()}
            granted = (request.path_params["tid"] == self._tenant_id and self._scope in form.get("scope", "").split()
                       and all(form.get(name) == value for name, value in self._expected.items()))
            self.token_grants.append(granted)
            if not granted:
                return JSONResponse({"error": "invalid_client"}, 400)
            return JSONResponse({"token_type": "Bearer", "expires_in": 3599, "access_token": self.access_token})

        app = super()._app()
        # Ahead of the local issuer's own token endpoint (the development flows' one, same path).
        app.router.routes.insert(0, Route("/{tid}/oauth2/v2.0/token", token, methods=["POST"]))
        return app
