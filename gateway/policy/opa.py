"""The OPA side: finding the binary, and a small client for `opa run --server`'s data API."""

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import httpx

from gateway.policy.exceptions import PolicyEvaluationError
from gateway.policy.schema import Decision, validate_decision

OPA_VERSION = "1.22.3"
DECISION_PATH = "/v1/data/tenantgate/decision"


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
        response = self._client.post(DECISION_PATH, json={"input": input_document})
        if response.status_code != 200:
            raise PolicyEvaluationError(f"OPA answered HTTP {response.status_code}")
        body = response.json()
        if "result" not in body:
            raise PolicyEvaluationError("OPA returned no decision (is the bundle active?)")
        return body["result"]

    def decide(self, input_document: Mapping) -> Decision:
        return validate_decision(self.evaluate(input_document))
