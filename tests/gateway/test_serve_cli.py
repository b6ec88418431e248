"""The README's run command path: `tenantgate serve --dev`, a token from `tenantgate token`,
and a call with the openai SDK; the same command refused in production; what `serve` logs;
and how it shuts down on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from devkit.server import TENANTGATE, free_port, tenantgate_serve, wait_ready
from devkit.server import gateway_env as _env
from tests.gateway.api.conftest import ALPHA, AUDIENCE, DATA_DIR, serve_env


def test_dev_serve_then_token_then_openai_sdk(smollm2_dir: Path) -> None:
    """The README's path: `serve --dev` serves SmolLM2 and all-MiniLM-L6-v2 by default, and they answer."""
    port, issuer_port = free_port(), free_port()
    env = _env(TENANTGATE_DEV_ISSUER_PORT=str(issuer_port), TENANTGATE_METRICS_PORT="0",
               TENANTGATE_KV_CACHE_MEMORY_BYTES=str(32 << 20))
    server = subprocess.Popen([TENANTGATE, "serve", "--dev", "--port", str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_ready(f"http://127.0.0.1:{port}", server,
                   output=lambda: server.stdout.read() if server.poll() is not None else "")
        token = subprocess.run(
            [TENANTGATE, "token", "--tenant", "northwind", "--issuer", f"http://127.0.0.1:{issuer_port}"],
            env=env, capture_output=True, text=True, check=True).stdout.strip()
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=token, max_retries=0) as client:
            assert [m.id for m in client.models.list()] == ["smollm2-135m-instruct", "all-minilm-l6-v2"]
            embedded = client.embeddings.create(model="all-minilm-l6-v2", input="What does a gateway do?")
            assert len(embedded.data[0].embedding) == 384 and embedded.usage.prompt_tokens == 8
            reply = client.chat.completions.create(
                model="smollm2-135m-instruct", max_tokens=16, temperature=0,
                messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert reply.choices[0].message.content == "The capital of France is Paris."
        _restricted_round_trip(f"http://127.0.0.1:{port}", issuer_port, env)
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=30)
    assert "tenantgate token --tenant northwind" in output  # the printed instructions
    assert '"model": "smollm2-135m-instruct"' in output
    assert token not in output  # the server never logs a bearer token


def _restricted_round_trip(base_url: str, issuer_port: int, env: dict) -> None:
    """The example data's Conditional Access (issue 28): northwind's restricted requests need c1. A
    client without cp1 is told so (403), one with cp1 gets Entra's challenge, and a token that
    `tenantgate token --claims` minted from the challenge's claims is served."""

    def token(*options: str) -> str:
        return subprocess.run([TENANTGATE, "token", "--tenant", "northwind", "--issuer",
                               f"http://127.0.0.1:{issuer_port}", *options],
                              env=env, capture_output=True, text=True, check=True).stdout.strip()

    def restricted(bearer: str) -> httpx.Response:
        return httpx.post(base_url + "/v1/chat/completions", timeout=60, json={
            "model": "smollm2-135m-instruct", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]},
            headers={"Authorization": f"Bearer {bearer}", "x-data-classification": "restricted"})

    denied = restricted(token())
    assert denied.status_code == 403 and "authentication context c1" in denied.json()["error"]["message"]
    challenged = restricted(token("--xms-cc", "cp1"))
    assert challenged.status_code == 401, challenged.text
    claims = challenged.headers["www-authenticate"].split('claims="')[1].split('"')[0]
    assert restricted(token("--xms-cc", "cp1", "--claims", claims)).status_code == 200


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


@pytest.mark.parametrize(("document", "problem"), [
    ('{"models": {"m": [{"name": "a", "kind": "openai"}]}}', "kind openai needs a dialect and a url"),
    ('{"models": {"m": [{"name": "a", "kind": "tenantgate", "replicas": ["http://127.0.0.1:9"]}]}}',
     "need envelope_signing_key"),
    ("not json", "is not JSON"),
])
def test_a_bad_deployments_file_is_refused_before_serving(tmp_path: Path, document: str, problem: str) -> None:
    (tmp_path / "deployments.json").write_text(document)
    result = subprocess.run([TENANTGATE, "serve"],
                            env=_env(TENANTGATE_DEPLOYMENTS_FILE=str(tmp_path / "deployments.json")),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert problem in result.stderr and "Traceback" not in result.stderr


def test_an_otlp_protocol_the_gateway_cannot_speak_is_refused_before_serving() -> None:
    result = subprocess.run([TENANTGATE, "serve"], env=_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
                                                            OTEL_EXPORTER_OTLP_PROTOCOL="grpc"),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "OTEL_EXPORTER_OTLP_PROTOCOL grpc is not supported" in result.stderr and "Traceback" not in result.stderr


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


def test_sigterm_lets_requests_finish_then_aborts_the_rest_within_the_shutdown_timeout(
        local_issuer, demo_model_dir: Path, tmp_path: Path) -> None:
    timeout_s, long_tokens = 2.0, 1900  # a stream of 1,900 tokens takes the demo model far longer than 2 s
    tenants = json.loads((DATA_DIR / "tenants.json").read_text())
    tenants["tenants"][ALPHA]["limits"] |= {"max_tokens": 2000, "max_context_tokens": 2048}
    (tmp_path / "tenants.json").write_text(json.dumps(tenants))
    audit = tmp_path / "audit.jsonl"
    env = serve_env(local_issuer, TENANTGATE_ENGINE="embedded", TENANTGATE_MODEL="demo",
                    TENANTGATE_KV_CACHE_MEMORY_BYTES=str(64 << 20), TENANTGATE_POLICY_DATA_DIR=str(tmp_path),
                    TENANTGATE_AUDIT_FILE=str(audit), TENANTGATE_SHUTDOWN_TIMEOUT_S=str(timeout_s))
    with tenantgate_serve(tmp_path, env) as server, \
            openai.OpenAI(base_url=server.base_url + "/v1", api_key=local_issuer.mint(ALPHA, audience=AUDIENCE),
                          max_retries=0, timeout=60) as client:
        streaming = {name: threading.Event() for name in ("long", "short")}
        ended: dict[str, tuple] = {}

        def consume(name: str, max_tokens: int) -> None:
            chunks, reason, error = 0, None, None
            try:
                for chunk in client.completions.create(model="demo", prompt="Once upon a time", stream=True,
                                                       max_tokens=max_tokens, temperature=0):
                    chunks += 1
                    reason = chunk.choices[0].finish_reason or reason
                    streaming[name].set()
            except openai.APIError as exc:
                error = type(exc).__name__
            ended[name] = (chunks, reason, error)
            streaming[name].set()

        threads = [threading.Thread(target=consume, args=("long", long_tokens)),
                   threading.Thread(target=consume, args=("short", 8))]
        for thread, event in zip(threads, streaming.values()):
            thread.start()
            assert event.wait(60)
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(httpx.ConnectError):  # no new connections once shutting down
            httpx.get(server.base_url + "/healthz", timeout=2)
        returncode = server.process.wait(60)
        took = time.monotonic() - signalled
        for thread in threads:
            thread.join(60)

    assert returncode in (0, -signal.SIGTERM)
    assert took < timeout_s + 4, f"the gateway took {took:.1f} s to exit"
    assert ended["short"] == (8, "length", None)  # in flight, and finished within the timeout
    chunks, reason, error = ended["long"]
    assert reason is None and chunks < long_tokens and error is not None  # cut off at the timeout
    records = [r for r in map(json.loads, audit.read_text().splitlines()) if r["type"] == "record"]
    by_tokens = {r["usage"]["completion_tokens"]: r for r in records}
    assert len(records) == 2 and by_tokens[8]["engine"]["finish_reason"] == "length"
    aborted = next(r for r in records if r["usage"]["completion_tokens"] != 8)
    assert aborted["engine"]["finish_reason"] == "abort"  # the engine request was aborted, its KV freed


def test_serve_dev_without_the_development_helpers_says_so(capsys, monkeypatch) -> None:
    """The product image has no devkit: gateway.main then registers no dev app, and --dev is refused."""
    import argparse

    import uvicorn

    from gateway.cli import add_parser

    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *args, **kwargs: pytest.fail("it served"))
    parser = argparse.ArgumentParser(prog="tenantgate")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", "--dev"])
    assert args.func(args) == 2
    assert "development helpers (devkit)" in capsys.readouterr().err


def test_the_app_factory_builds_no_issuer_of_its_own() -> None:
    from gateway.app import create_app
    from gateway.settings import Settings

    with pytest.raises(ValueError, match="settings.dev_issuer"):
        create_app(Settings(dev_issuer=True))
