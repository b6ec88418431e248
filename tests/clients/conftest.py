"""The client libraries people build agents with, each run unchanged against a real gateway.

The gateway serves the default model (SmolLM2-135M-Instruct) and all-MiniLM-L6-v2 on loopback, with
a local Entra-style issuer and a real Redis (for stored responses), as tests/gateway/api does. Each
library lives in a virtualenv of its own (scripts/install-clients.sh builds .venv-clients/NAME
from tests/clients/requirements/NAME.txt); a flow script under flows/ runs with that venv's python
in a subprocess, takes the gateway's URL and a token from its environment, and prints one JSON
object: per check, what the library returned, or the exception it raised. The tests assert on that.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devkit.issuer import LocalIssuer
from devkit.redis import RedisServer
from devkit.server import serving
from engine import EngineConfig, LLMEngine
from gateway.app import create_app
from gateway.inference import EncoderBackend, EngineBackend, build_encoder
from tests.gateway.api.conftest import ALPHA, AUDIENCE, DATA_DIR, DEFAULT_MODEL, EMBEDDING_MODEL, gateway_settings
from tests.utils.tools import missing_tool

REPOSITORY = Path(__file__).parents[2]
FLOWS = Path(__file__).parent / "flows"
REQUIREMENTS = Path(__file__).parent / "requirements"
VENVS = REPOSITORY / ".venv-clients"
# A tenant of these tests' own: the default model and the embedding model, and a budget of 200
# tokens a minute, less than some single requests reserve.
LAMBDA = "44444444-0000-4000-8000-000000000004"
LAMBDA_TOKENS_PER_MINUTE = 200
MODEL_CONTEXT_TOKENS = 1024  # the engine's max_model_len, the same as Alpha's max_context_tokens
FLOW_TIMEOUT_S = 600


@dataclass
class ClientGateway:
    base_url: str
    issuer: LocalIssuer

    def token(self, tenant: str = ALPHA) -> str:
        return self.issuer.mint(tenant, audience=AUDIENCE)


def client_python(name: str) -> Path:
    """The python of the client's own venv; missing, the test skips (fails under `make test`)."""
    python = VENVS / name / "bin" / "python"
    lock = REQUIREMENTS / f"{name}.txt"
    if not lock.exists():
        raise AssertionError(f"no requirements file for client {name}: {lock}")
    if not (VENVS / name / ".installed").exists() or not python.exists():
        missing_tool(f"client venv {name} not found: run scripts/install-clients.sh (make test does)")
    return python


def run_flow(client: str, flow: str, gateway: ClientGateway, *, tenant: str = ALPHA,
             env: dict[str, str] | None = None, timeout_s: float = FLOW_TIMEOUT_S) -> dict:
    """Runs flows/FLOW.py with the client's python; returns the JSON object it printed last."""
    python = client_python(client)
    environment = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"),
                   "TENANTGATE_BASE_URL": gateway.base_url + "/v1", "TENANTGATE_TOKEN": gateway.token(tenant),
                   "TENANTGATE_SMALL_BUDGET_TOKEN": gateway.token(LAMBDA),
                   "TENANTGATE_MODEL": DEFAULT_MODEL, "TENANTGATE_EMBEDDING_MODEL": EMBEDDING_MODEL,
                   "TENANTGATE_CONTEXT_TOKENS": str(MODEL_CONTEXT_TOKENS),
                   # No library may reach anything but the gateway: no telemetry, no model-cost map download.
                   "OPENAI_AGENTS_DISABLE_TRACING": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                   "LITELLM_TELEMETRY": "False", "ANONYMIZED_TELEMETRY": "False",
                   "NO_PROXY": "127.0.0.1,localhost", **(env or {})}
    finished = subprocess.run([str(python), str(FLOWS / f"{flow}.py")], env=environment, capture_output=True,
                              text=True, timeout=timeout_s, cwd=FLOWS, check=False)
    lines = [line for line in finished.stdout.splitlines() if line.startswith("{")]
    if finished.returncode != 0 or not lines:
        raise AssertionError(f"flow {flow} ({client}) exited {finished.returncode}:\n"
                             f"{finished.stdout[-3000:]}\n{finished.stderr[-5000:]}")
    report = json.loads(lines[-1])
    if os.environ.get("TENANTGATE_CLIENT_REPORTS"):  # to read what each library saw, e.g. against main
        Path(os.environ["TENANTGATE_CLIENT_REPORTS"], f"{flow}.json").write_text(json.dumps(report, indent=1))
    return report


def result(report: dict, check: str):
    """A check's result; a check that raised fails the test with what the library said."""
    outcome = report[check]
    if "error" in outcome:
        error = outcome["error"]
        raise AssertionError(f"{check}: {error['class']} (status {error['status']}): {error['message'][:1500]}")
    return outcome["result"]


def _tenants(directory: Path) -> Path:
    tenants = json.loads((DATA_DIR / "tenants.json").read_text())
    alpha = tenants["tenants"][ALPHA]
    assert {DEFAULT_MODEL, EMBEDDING_MODEL} <= set(alpha["models"])
    tenants["tenants"][LAMBDA] = alpha | {"name": "Lambda Test", "responses": {"store": False},
                                          "limits": alpha["limits"] | {"tokens_per_minute": LAMBDA_TOKENS_PER_MINUTE}}
    (directory / "tenants.json").write_text(json.dumps(tenants))
    return directory


@pytest.fixture(scope="session")
def local_issuer() -> Iterator[LocalIssuer]:
    with LocalIssuer(port=0) as issuer:
        yield issuer


@pytest.fixture(scope="session")
def embedding_encoder(encoder_dir: Path) -> EncoderBackend:
    return build_encoder(EMBEDDING_MODEL, device="cpu", dtype="float32", batch_size=16)


@pytest.fixture(scope="session")
def client_gateway(local_issuer: LocalIssuer, smollm2_dir: Path, embedding_encoder: EncoderBackend,
                   redis_server: RedisServer, tmp_path_factory) -> Iterator[ClientGateway]:
    audit_dir = tmp_path_factory.mktemp("audit")
    settings = gateway_settings(local_issuer, policy_data_dir=_tenants(tmp_path_factory.mktemp("policy-data")),
                                served_model_name=DEFAULT_MODEL, redis_url=redis_server.url, metrics_port=0,
                                audit_file=audit_dir / "audit.jsonl", audit_signing_key=audit_dir / "audit-signing.pem")
    engine = LLMEngine(EngineConfig(model=str(smollm2_dir), dtype="float32", max_model_len=MODEL_CONTEXT_TOKENS,
                                    kv_cache_memory_bytes=64 << 20, max_num_seqs=8))
    app = create_app(settings, backend=EngineBackend(engine, model_name=DEFAULT_MODEL), encoder=embedding_encoder)
    with serving(app) as base_url:
        yield ClientGateway(base_url, local_issuer)
        app.state.gateway.backend.async_engine.shutdown()
