"""The README's run command path: `tenantgate serve --dev`, a token from `tenantgate token`,
and a call with the openai SDK; and the same command refused in production."""

from __future__ import annotations

import subprocess
from pathlib import Path

import openai

from tests.gateway.api.conftest import serve_env
from tests.utils.server import TENANTGATE, free_port, tenantgate_serve, wait_ready
from tests.utils.server import gateway_env as _env


def test_dev_serve_then_token_then_openai_sdk(demo_model_dir: Path) -> None:
    port, issuer_port = free_port(), free_port()
    env = _env(TENANTGATE_DEV_ISSUER_PORT=str(issuer_port), TENANTGATE_METRICS_PORT="0",
               TENANTGATE_KV_CACHE_MEMORY_BYTES=str(32 << 20))
    server = subprocess.Popen([TENANTGATE, "serve", "--dev", "--port", str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_ready(f"http://127.0.0.1:{port}", server, output=lambda: server.stdout.read() if server.poll() is not None else "")
        token = subprocess.run(
            [TENANTGATE, "token", "--tenant", "northwind", "--issuer", f"http://127.0.0.1:{issuer_port}"],
            env=env, capture_output=True, text=True, check=True).stdout.strip()
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=token, max_retries=0) as client:
            reply = client.chat.completions.create(model="demo", max_tokens=5,
                                                   messages=[{"role": "user", "content": "Hello"}])
        assert reply.choices[0].message.content and reply.usage.completion_tokens <= 5
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=30)
    assert "tenantgate token --tenant northwind" in output  # the printed instructions
    assert token not in output  # the server never logs a bearer token


def test_production_refuses_the_development_issuer() -> None:
    result = subprocess.run([TENANTGATE, "serve", "--dev"], env=_env(TENANTGATE_ENVIRONMENT="production"),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "refused outside development" in result.stderr


def test_production_refuses_the_development_namespace_secret() -> None:
    result = subprocess.run([TENANTGATE, "serve"], env=_env(TENANTGATE_ENVIRONMENT="production"),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "namespace_secret" in result.stderr and "tenantgate-development" not in result.stderr


def test_serve_logs_the_gateway_at_info_unless_told_otherwise(local_issuer, tmp_path: Path) -> None:
    logs = {}
    for args in ((), ("--log-level", "warning")):
        metrics_port = free_port()
        with tenantgate_serve(tmp_path, serve_env(local_issuer, TENANTGATE_METRICS_PORT=str(metrics_port)),
                              *args) as server:
            logs[args] = (server.stderr.read_text(), metrics_port)
    default, port = logs[()]
    assert f"INFO tenantgate.gateway: metrics on http://127.0.0.1:{port}/metrics" in default
    quiet, _ = logs[("--log-level", "warning")]
    assert "tenantgate.gateway" not in quiet
