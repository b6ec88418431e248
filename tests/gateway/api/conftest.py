"""An end-to-end gateway: uvicorn on a loopback port, the demo engine and all-MiniLM-L6-v2's
encoder, the repository's policies with test tenants, and a local Entra-style issuer with real RSA keys."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from devkit.issuer import LocalIssuer
from devkit.server import ServerStartError, free_port, gateway_env, serving
from engine import EngineConfig, ListSink, LLMEngine, PrometheusSink
from gateway.app import create_app
from gateway.inference import EncoderBackend, EngineBackend, build_encoder
from gateway.metrics import GatewayMetrics
from gateway.settings import Settings

DATA_DIR = Path(__file__).parent / "data"
# demo allowed, max_tokens 512, tenant isolation, stores responses 2 days
ALPHA = "aaaaaaaa-0000-4000-8000-00000000000a"
BETA = "bbbbbbbb-0000-4000-8000-00000000000b"  # demo not among its models
GAMMA = "cccccccc-0000-4000-8000-00000000000c"  # demo allowed, max_tokens 4, its name in metric labels
DELTA = "dddddddd-0000-4000-8000-00000000000d"  # exclusive, deterministic, no cache
EPSILON = "ffffffff-0000-4000-8000-00000000000f"  # 2 requests per minute
ZETA = "99999999-0000-4000-8000-000000000009"  # 3,000 tokens per minute, max_tokens 90
ETA = "88888888-0000-4000-8000-000000000008"  # fail_open: served while the quota store is down (stores responses)
THETA = "77777777-0000-4000-8000-000000000007"  # like Alpha, but logs redacted content (minus /request/user)
# like Theta, logs no content; completion prompts may spell special tokens
IOTA = "66666666-0000-4000-8000-000000000006"
KAPPA = "55555555-0000-4000-8000-000000000005"  # only the embedding model, 3,000 tokens per minute
EMBEDDING_MODEL = "all-minilm-l6-v2"  # Alpha, Gamma, Theta and Kappa may use it
DEFAULT_MODEL = "smollm2-135m-instruct"  # tenantgate serve's default; Alpha and Theta may use it
SMOLLM2 = DEFAULT_MODEL  # served by smollm2_client, to Alpha
MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH = 2048, 12  # Alpha's bounds there (the policy's defaults: 16384 and 16)
LAMBDA = "44444444-0000-4000-8000-000000000004"  # like Alpha, but its cache scope (and stored responses) per principal
PLATFORM = "f0f0f0f0-0000-4000-8000-0000000000f0"  # the platform's own tenant: development's operator tenant
PLATFORM_OFF = "f1f1f1f1-0000-4000-8000-0000000000f1"  # a platform tenant the data lists as disabled
UNREGISTERED = "eeeeeeee-0000-4000-8000-00000000000e"
AUDIENCE = "api://tenantgate"


@dataclass
class Gateway:
    base_url: str
    metrics_url: str
    issuer: LocalIssuer
    engine: LLMEngine
    sink: ListSink
    app: object
    clients: list
    audit_file: Path

    def audit_records(self) -> list[dict]:
        return [e for e in map(json.loads, self.audit_file.read_text().splitlines()) if e["type"] == "record"]

    def audit_record(self, request_id: str, timeout_s: float = 5.0) -> dict:
        """The request's audit record, once written (it waits for the engine's x-record)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for record in self.audit_records():
                if record["request_id"] == request_id:
                    return record
            time.sleep(0.02)
        raise AssertionError(f"no audit record for {request_id}")

    def token(self, tenant: str = ALPHA, **options) -> str:
        return self.issuer.mint(tenant, audience=options.pop("audience", AUDIENCE), **options)

    def client(self, tenant: str = ALPHA, **options) -> openai.OpenAI:
        """An SDK client with a fresh token; closed when the session's gateway stops."""
        client = openai.OpenAI(base_url=self.base_url + "/v1", api_key=self.token(tenant, **options),
                               max_retries=0, timeout=60)
        self.clients.append(client)
        return client

    @property
    def state(self):
        return self.app.state.gateway


@pytest.fixture(scope="session")
def demo_engine(demo_model_dir: Path) -> tuple[LLMEngine, ListSink]:
    sink = ListSink()
    config = EngineConfig(model=str(demo_model_dir), kv_cache_memory_bytes=64 << 20, max_num_seqs=16,
                          max_model_len=1024)
    return LLMEngine(config, sinks=[sink]), sink


@pytest.fixture(scope="session")
def embedding_encoder(encoder_dir: Path) -> EncoderBackend:
    """The gateway's embedded encoder in float32, the oracle tests' dtype, in steps of four
    inputs' tokens (a large request then runs in many, as the fairness test needs)."""
    return build_encoder(EMBEDDING_MODEL, device="cpu", dtype="float32", batch_size=4)


def gateway_settings(issuer: LocalIssuer, **overrides) -> Settings:
    values = dict(
        authority=issuer.base_url, v1_issuer_host=issuer.base_url, audiences=[AUDIENCE],
        policy_data_dir=DATA_DIR, served_model_name="demo", metrics_port=free_port(),
        policy_reload_interval_s=0, audit_stdout=False,
    )
    return Settings(**(values | overrides))


def serve_env(issuer: LocalIssuer, **settings: str) -> dict[str, str]:
    """The environment of a `tenantgate serve` subprocess for these tenants: the null engine
    (settings may choose another), the issuer's keys, no metrics listener, no audit on stdout."""
    return gateway_env(**{
        "TENANTGATE_ENGINE": "null", "TENANTGATE_SERVED_MODEL_NAME": "demo", "TENANTGATE_AUDIENCES": AUDIENCE,
        "TENANTGATE_AUTHORITY": issuer.base_url, "TENANTGATE_V1_ISSUER_HOST": issuer.base_url,
        "TENANTGATE_POLICY_DATA_DIR": str(DATA_DIR), "TENANTGATE_METRICS_PORT": "0", "TENANTGATE_AUDIT_STDOUT": "false",
    } | settings)


@contextmanager
def running_gateway(issuer: LocalIssuer, engine: LLMEngine, sink: ListSink, audit_dir: Path, model_name: str,
                    encoder: EncoderBackend | None) -> Iterator[Gateway]:
    with ExitStack() as stack:
        for attempt in range(3):
            # The metrics port is chosen before the gateway listens on it, and another process may
            # take it in between: then the gateway starts again on another.
            settings = gateway_settings(issuer, served_model_name=model_name, audit_file=audit_dir / "audit.jsonl",
                                        audit_signing_key=audit_dir / "audit-signing.pem")
            metrics = GatewayMetrics()
            backend = EngineBackend(engine, model_name=model_name)
            app = create_app(settings, backend=backend, metrics=metrics, encoder=encoder)
            try:
                base_url = stack.enter_context(serving(app))
                break
            except ServerStartError as exc:
                backend.async_engine.shutdown()  # the app leaves a backend it was given running
                if not exc.address_in_use or attempt == 2:
                    raise
        engine_metrics = PrometheusSink(metrics.registry)
        engine_metrics.watch(engine)
        engine.sinks.append(engine_metrics)
        running = Gateway(base_url, f"http://127.0.0.1:{settings.metrics_port}/metrics", issuer, engine,
                          sink, app, [], settings.audit_file)
        yield running
        for client in running.clients:
            client.close()
        app.state.gateway.backend.async_engine.shutdown()


@pytest.fixture(scope="session")
def gateway(local_issuer: LocalIssuer, demo_engine, embedding_encoder, tmp_path_factory) -> Iterator[Gateway]:
    engine, sink = demo_engine
    with running_gateway(local_issuer, engine, sink, tmp_path_factory.mktemp("audit"), "demo",
                         embedding_encoder) as running:
        yield running


@pytest.fixture(scope="session")
def default_model_gateway(local_issuer: LocalIssuer, smollm2_dir: Path, tmp_path_factory) -> Iterator[Gateway]:
    """The same gateway on the model `tenantgate serve` serves by default (SmolLM2-135M-Instruct),
    for tests whose answers must make sense; Alpha and Theta may use it."""
    sink = ListSink()
    config = EngineConfig(model=str(smollm2_dir), dtype="float32", kv_cache_memory_bytes=64 << 20,
                          max_num_seqs=8, max_model_len=1024)
    with running_gateway(local_issuer, LLMEngine(config, sinks=[sink]), sink, tmp_path_factory.mktemp("audit"),
                         DEFAULT_MODEL, None) as running:
        yield running


@pytest.fixture(scope="session")
def smollm2_client(local_issuer: LocalIssuer, smollm2_dir: Path, tmp_path_factory) -> Iterator[openai.OpenAI]:
    """The openai SDK on a gateway that serves the default model, SmolLM2-135M-Instruct, to Alpha
    (with schema bounds of its own: MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH)."""
    data_dir = tmp_path_factory.mktemp("policy-data")
    tenants = json.loads((DATA_DIR / "tenants.json").read_text())
    assert SMOLLM2 in tenants["tenants"][ALPHA]["models"]
    tenants["tenants"][ALPHA]["limits"] |= {"max_schema_bytes": MAX_SCHEMA_BYTES, "max_schema_depth": MAX_SCHEMA_DEPTH}
    (data_dir / "tenants.json").write_text(json.dumps(tenants))
    audit_dir = tmp_path_factory.mktemp("audit")
    settings = gateway_settings(local_issuer, policy_data_dir=data_dir, served_model_name=SMOLLM2,
                                audit_file=audit_dir / "audit.jsonl", audit_signing_key=audit_dir / "audit-signing.pem")
    engine = LLMEngine(EngineConfig(model=str(smollm2_dir), max_model_len=512, kv_cache_memory_bytes=64 << 20))
    app = create_app(settings, backend=EngineBackend(engine, model_name=SMOLLM2))
    with serving(app) as base_url:
        with openai.OpenAI(base_url=base_url + "/v1", api_key=local_issuer.mint(ALPHA, audience=AUDIENCE),
                           max_retries=0, timeout=600) as sdk:
            yield sdk
        app.state.gateway.backend.async_engine.shutdown()
