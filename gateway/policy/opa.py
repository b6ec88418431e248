"""The OPA side: finding the binary, a small client for `opa run --server`'s data API, and
the watch that keeps the gateway's view of a running OPA current."""

import asyncio
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import httpx

from gateway.background import BackgroundTask
from gateway.policy.exceptions import PolicyEvaluationError
from gateway.policy.schema import Decision, validate_decision

logger = logging.getLogger("tenantgate.policy")

OPA_VERSION = "1.22.3"
DECISION_PATH = "/v1/data/tenantgate/decision"
TOOLS_DECISION_PATH = "/v1/data/tenantgate/tools/decision"
ARGUMENTS_PATH = "/v1/data/tenantgate/tools/arguments/denials"
# OPA by default treats a built-in's error (a division by a string, say) as undefined, so a deny rule
# whose body errors simply does not deny: it fails open, where regorus raises and the gateway
# refuses (503). Strict built-in errors make OPA answer 500 instead, which the gateway refuses too.
DECISION_PARAMS = {"strict-builtin-errors": "true"}


def find_opa() -> str | None:
    """The opa binary on PATH, else in $(go env GOPATH)/bin, else None."""
    found = shutil.which("opa")
    if found:
        return found
    gopath = os.environ.get("GOPATH")
    if not gopath and shutil.which("go"):
        gopath = subprocess.run(
            ["go", "env", "GOPATH"], capture_output=True, text=True, check=False
        ).stdout.strip()
    if gopath and (Path(gopath) / "bin" / "opa").is_file():
        return str(Path(gopath) / "bin" / "opa")
    return None


class OpaClient:
    """Asks an OPA server for data.tenantgate.decision over HTTP (keep-alive connection)."""

    def __init__(self, base_url: str, *, timeout: float = 2.0) -> None:
        self._client = httpx.Client(base_url=base_url, timeout=timeout)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "OpaClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def evaluate(self, input_document: Mapping) -> dict:
        response = self._client.post(DECISION_PATH, params=DECISION_PARAMS, json={"input": input_document})
        if response.status_code != 200:
            raise PolicyEvaluationError(f"OPA answered HTTP {response.status_code}")
        body = response.json()
        if "result" not in body:
            raise PolicyEvaluationError("OPA returned no decision (is the bundle active?)")
        return body["result"]

    def decide(self, input_document: Mapping) -> Decision:
        return validate_decision(self.evaluate(input_document))


class OpaWatch:
    """Whether an OPA server is healthy with its bundles active, and which tenants its data
    registers, asked every `interval_s` in the background, never on a caller's request.

    `tenants` is None until OPA has answered once: the gateway then cannot tell a registered
    tenant from an unknown one and answers 503. A later failure keeps the last good list
    (the policy itself still judges every request, so a tenant removed since is denied there).
    """

    def __init__(self, client: httpx.AsyncClient, *, interval_s: float) -> None:
        self._client = client
        self._interval_s = interval_s
        self._watcher = BackgroundTask("tenantgate-opa-watch")
        self.healthy = False
        self.tenants: frozenset[str] | None = None
        self.enabled_tenants: frozenset[str] | None = None  # those whose data says enabled: true

    async def refresh(self) -> None:
        """One look at OPA; never raises (but cancellation)."""
        try:
            health = await self._client.get("/health", params={"bundles": "true"})
            response = await self._client.get("/v1/data/tenants")
            body = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            if self.healthy or self.tenants is None:
                logger.warning("opa unreachable: %s", type(exc).__name__)
            self.healthy = False
            return
        result = body.get("result") if isinstance(body, dict) else None
        if isinstance(result, dict):
            if self.tenants is None:
                logger.info("opa tenant list loaded: %d tenants", len(result))
            self.tenants = frozenset(result)
            self.enabled_tenants = frozenset(tid for tid, tenant in result.items()
                                             if isinstance(tenant, dict) and tenant.get("enabled") is True)
        self.healthy = health.status_code == 200

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.refresh()
            except Exception:  # the watch must outlive one bad answer
                logger.exception("opa watch failed once; it keeps watching")

    async def start(self) -> None:
        await self.refresh()
        self._watcher.start(self._run())

    async def aclose(self) -> None:
        await self._watcher.stop()
