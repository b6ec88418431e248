"""An end-to-end MCP gateway: uvicorn on a loopback port fronting the example MCP server (the `mcp`
package's MCPServer, on loopback too), the repository's policies on a copy of the example tenants,
and the local Entra-style issuer with real RSA keys. Callers use the official `mcp` client."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from devkit.issuer import LocalIssuer
from devkit.mcp_server import ExampleMcpServer, serving_example
from devkit.server import serving
from gateway.app import create_app
from gateway.policy.loader import DEFAULT_POLICY_DIR
from gateway.settings import Settings

NORTHWIND = "c1a9e3f5-2d4b-4c6e-8f0a-b2c4d6e8f0a1"  # the example policy's tenant with devtools
FABRIKAM = "8d4e2b10-7c6f-4a91-b3d5-e6f708192a3b"  # registered, no MCP servers
AUDIENCE = "api://tenantgate"
SERVER_KEY = "the-gateways-own-key-for-devtools"
KEY_ENV = "TENANTGATE_TEST_DEVTOOLS_KEY"


@dataclass
class McpGateway:
    base_url: str
    issuer: LocalIssuer
    upstream: ExampleMcpServer
    app: object
    data_dir: Path
    audit_file: Path
    audit_key: Path
    spans: InMemorySpanExporter

    @property
    def url(self) -> str:
        return self.base_url + "/mcp/devtools"

    def token(self, tenant: str = NORTHWIND, **options) -> str:
        options.setdefault("scopes", ("Tools.Invoke",))
        return self.issuer.mint(tenant, audience=options.pop("audience", AUDIENCE), **options)

    def audit_records(self) -> list[dict]:
        return [e for e in map(json.loads, self.audit_file.read_text().splitlines()) if e["type"] == "record"]

    def tenants(self) -> dict:
        return json.loads((self.data_dir / "tenants.example.json").read_text())

    def write_tenants(self, data: dict) -> None:
        """New policy data, waited for until the gateway's policy has reloaded it."""
        policy = self.app.state.gateway.policy
        before = policy.revision
        (self.data_dir / "tenants.example.json").write_text(json.dumps(data))
        deadline = time.monotonic() + 30
        while policy.revision == before:
            assert time.monotonic() < deadline, "the policy did not reload"
            time.sleep(0.05)

    @asynccontextmanager
    async def session(self, token: str | None = None, **options) -> AsyncIterator[ClientSession]:
        """The official client's session (ClientSession over its Streamable HTTP client), initialized."""
        headers = {"Authorization": f"Bearer {token or self.token(**options)}"}
        async with create_mcp_http_client(headers=headers) as http:
            async with streamable_http_client(self.url, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    yield session


@contextmanager
def running_mcp_gateway(issuer: LocalIssuer, workdir: Path, **overrides) -> Iterator[McpGateway]:
    """The gateway (null engine, the example tenants in a copy it may edit) fronting the example MCP
    server as devtools, with the gateway's own key for it in the environment while it runs."""
    data_dir = workdir / "data"
    data_dir.mkdir()
    shutil.copy(DEFAULT_POLICY_DIR / "data" / "tenants.example.json", data_dir)
    with pytest.MonkeyPatch.context() as patch, serving_example() as upstream:
        patch.setenv(KEY_ENV, SERVER_KEY)
        servers = workdir / "mcp-servers.json"
        servers.write_text(json.dumps({"servers": [
            {"name": "devtools", "url": upstream.url, "api_key_env": KEY_ENV, "tools_ttl_s": 0, "timeout_s": 10}]}))
        settings = Settings(
            engine="null", served_model_name="demo", embedding_model="", authority=issuer.base_url,
            v1_issuer_host=issuer.base_url, audiences=[AUDIENCE], policy_data_dir=data_dir,
            policy_reload_interval_s=0.1, metrics_port=0, audit_stdout=False, audit_file=workdir / "audit.jsonl",
            audit_signing_key=workdir / "audit-signing.pem", mcp_servers_file=servers, **overrides)
        spans = InMemorySpanExporter()
        tracing = TracerProvider()
        tracing.add_span_processor(SimpleSpanProcessor(spans))
        app = create_app(settings, tracing=tracing)
        with serving(app) as base_url:
            yield McpGateway(base_url, issuer, upstream, app, data_dir, workdir / "audit.jsonl",
                             workdir / "audit-signing.pem", spans)


@pytest.fixture(scope="module")
def mcp_gateway(local_issuer: LocalIssuer, tmp_path_factory) -> Iterator[McpGateway]:
    with running_mcp_gateway(local_issuer, tmp_path_factory.mktemp("mcp")) as gateway:
        yield gateway


def run(coroutine):
    return asyncio.run(coroutine)


def mcp_error(coroutine) -> MCPError:
    """The MCPError the coroutine ends with (the client raises it inside its task groups)."""
    try:
        run(coroutine)
    except BaseException as exc:
        found = _first(exc)
        if found is None:
            raise
        return found
    raise AssertionError("the call succeeded; an MCP error was expected")


def _first(exc: BaseException) -> MCPError | None:
    if isinstance(exc, MCPError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        if (found := _first(inner)) is not None:
            return found
    return None


@asynccontextmanager
async def modern_client(gateway: McpGateway, token: str | None = None, **options) -> AsyncIterator[Client]:
    """The official high-level `mcp.Client` in its default mode (auto: server/discover, so 2026-07-28)."""
    headers = {"Authorization": f"Bearer {token or gateway.token(**options)}"}
    async with create_mcp_http_client(headers=headers) as http:
        async with Client(streamable_http_client(gateway.url, http_client=http)) as client:
            yield client
