"""Every refusal in OpenAI's error shape with the right status; no 5xx for bad input, no stack trace."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from devkit.issuer import LocalIssuer
from devkit.server import serving
from gateway.app import create_app
from gateway.errors import GatewayError
from gateway.inference import NullBackend
from gateway.policy.loader import DEFAULT_POLICY_DIR, rego_files
from tests.gateway.api.conftest import ALPHA, DATA_DIR, EPSILON, PLATFORM, UNREGISTERED, gateway_settings

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _post(gateway, body, *, tenant: str = ALPHA, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {gateway.token(tenant)}", **kwargs.pop("headers", {})}
    return httpx.post(gateway.base_url + "/v1/chat/completions", headers=headers, timeout=30,
                      **({"json": body} if not isinstance(body, bytes) else {"content": body}), **kwargs)


def _assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "Traceback" not in error["message"]
    return error


def test_oversized_body_is_413(gateway) -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": "x" * (2 << 20)}]}
    error = _assert_openai_error(_post(gateway, body), 413)
    assert error["code"] == "payload_too_large"


def test_oversized_chunked_body_is_413(gateway) -> None:
    def chunks():
        for _ in range(40):
            yield b"x" * 65536

    response = httpx.post(gateway.base_url + "/v1/chat/completions", content=chunks(), timeout=30,
                          headers={"Authorization": f"Bearer {gateway.token(ALPHA)}"})
    _assert_openai_error(response, 413)


@pytest.mark.parametrize("body", [b"{not json", b"[]", b'"text"', b"", json.dumps({**CHAT, "extra": 1}).encode()])
def test_malformed_bodies_are_400(gateway, body: bytes) -> None:
    response = _post(gateway, body, headers={"Content-Type": "application/json"})
    _assert_openai_error(response, 400)


def test_context_overflow_is_400_before_the_engine(gateway) -> None:
    long = {**CHAT, "messages": [{"role": "user", "content": "word " * 3000}]}
    error = _assert_openai_error(_post(gateway, long), 400)
    assert error["code"] == "context_length_exceeded"  # the tenant's policy caps the context first
    assert "1024 tokens" in error["message"]


def test_unregistered_tenant_is_refused_before_any_key_fetch(gateway) -> None:
    fetches = gateway.issuer.jwks_requests if hasattr(gateway.issuer, "jwks_requests") else None
    error = _assert_openai_error(_post(gateway, CHAT, tenant=UNREGISTERED), 401)
    assert error["type"] == "invalid_request_error"
    if fetches is not None:
        assert gateway.issuer.jwks_requests == fetches


def test_rate_limit_is_429_with_retry_after(gateway) -> None:
    """Epsilon may send 2 requests a minute; a burst of 3 gets at least one 429 with Retry-After."""
    responses = [_post(gateway, CHAT, tenant=EPSILON) for _ in range(3)]
    limited = [r for r in responses if r.status_code == 429]
    assert limited, [r.status_code for r in responses]
    assert all(r.status_code in (200, 429) for r in responses)
    error = _assert_openai_error(limited[0], 429)
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests"  # OpenAI's: the budget's kind
    assert 1 <= int(limited[0].headers["retry-after"]) <= 60


def _documented_errors() -> dict[tuple[int, str], str]:
    """docs/api.md's error table: (status, code) -> its type cell."""
    text = (Path(__file__).parents[3] / "docs" / "api.md").read_text()
    table = text[text.index("| Status | `type` | `code` | When |"):].split("\n\n")[0].splitlines()[2:]
    rows = {}
    for row in table:
        status, type_cell, codes = (cell.strip() for cell in row.strip("|").split("|")[:3])
        for code in codes.replace("`", "").split(","):
            rows[(int(status), code.strip())] = type_cell
    return rows


def _error_classes(cls=GatewayError):
    yield cls
    for sub in cls.__subclasses__():
        yield from _error_classes(sub)


def test_the_documented_error_types_are_the_ones_answered(gateway) -> None:
    """Each error the gateway raises has its row in docs/api.md, with the type it is answered with;
    the routes' 404 and 405, made by the handler, likewise."""
    documented = _documented_errors()
    answered = {(cls.status_code, cls.code, cls.type) for cls in _error_classes()}
    answered |= {(429, "rate_limit_exceeded", "tokens")}  # RateLimited's kind, per budget
    for path, method in (("/v1/nope", "GET"), ("/v1/models", "DELETE")):
        error = _assert_openai_error(httpx.request(method, gateway.base_url + path), 404 if path == "/v1/nope" else 405)
        answered.add((404 if path == "/v1/nope" else 405, error["code"], error["type"]))
    for status, code, type_ in answered:
        assert (status, code) in documented, (status, code)
        assert f"`{type_}`" in documented[(status, code)], (status, code, type_)


def test_metrics_are_on_their_own_port_only(gateway) -> None:
    assert httpx.get(gateway.base_url + "/metrics").status_code == 404
    text = httpx.get(gateway.metrics_url).text
    assert "tenantgate_requests" in text or "tenantgate_policy_evaluation_seconds" in text
    assert "tenantgate_engine_time_to_first_token_seconds" in text  # the engine's metrics, same registry
    assert "tenantgate_audit_sink_errors 0.0" in text  # the audit trail wrote everything
    assert ALPHA not in text  # no raw tenant ids in labels


def test_the_api_description_is_served_in_development_only(gateway, local_issuer, tmp_path: Path) -> None:
    for path in ("/docs", "/openapi.json", "/redoc"):
        assert httpx.get(gateway.base_url + path).status_code == 200
    production = gateway_settings(
        local_issuer, environment="production", authority="https://login.microsoftonline.com",
        v1_issuer_host="https://sts.windows.net", namespace_secret="a production secret of 32 bytes or more",
        audit_signing_key=tmp_path / "audit-signing.pem", metrics_port=0, operator_tenants=[PLATFORM])
    with serving(create_app(production, backend=NullBackend(model_name="demo"))) as base:
        for path in ("/docs", "/openapi.json", "/redoc", "/docs/oauth2-redirect"):
            _assert_openai_error(httpx.get(base + path), 404)
        assert httpx.get(base + "/readyz").status_code == 200  # the app itself is up


def test_health_and_readiness(gateway) -> None:
    assert httpx.get(gateway.base_url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(gateway.base_url + "/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready"}  # no per-check detail on the public port
    metrics = httpx.get(gateway.metrics_url).text
    assert 'tenantgate_ready{check="engine"} 1.0' in metrics and 'tenantgate_ready{check="policy"} 1.0' in metrics


def test_a_forged_token_for_a_tenant_whose_discovery_fails_leaves_readiness_alone(faulty_issuer) -> None:
    """A registered tenant that Entra no longer knows (deleted, or a typo in the registry): one
    forged token makes the gateway try its keys and fail. The token is refused; readiness stays."""
    faulty_issuer.deleted.add(ALPHA)
    app = _null_gateway(faulty_issuer)
    forger = LocalIssuer(faulty_issuer.base_url)  # the tenant's issuer URL, a key nobody published
    with serving(app) as base:
        forged = forger.mint(ALPHA, audience="api://tenantgate")
        response = httpx.post(base + "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {forged}"})
        assert _assert_openai_error(response, 401)["type"] == "invalid_request_error"
        assert faulty_issuer.refused_requests == 1  # the keys were tried, and the issuer said no
        ready = httpx.get(base + "/readyz")
        assert ready.status_code == 200 and ready.json() == {"status": "ready"}
        # The operator still sees it, on the metrics listener.
        registry = app.state.gateway.metrics.registry
        assert registry.get_sample_value("tenantgate_jwks_key_sets_missing") == 1
        assert registry.get_sample_value("tenantgate_auth_failures_total", {"code": "keys_unavailable"}) == 1


# -- policy trouble denies with 503 ------------------------------------------------------------


def _null_gateway(local_issuer, **settings):
    return create_app(gateway_settings(local_issuer, metrics_port=0, **settings),
                      backend=NullBackend(model_name="demo"))


def test_malformed_decision_is_503(local_issuer, tmp_path: Path) -> None:
    (tmp_path / "decision.rego").write_text(
        'package tenantgate\n\ndecision := {"allow": true, "reasons": []}\n')
    with serving(_null_gateway(local_issuer, policy_dir=tmp_path, policy_data_dir=DATA_DIR)) as base:
        token = local_issuer.mint(ALPHA, audience="api://tenantgate")
        response = httpx.post(base + "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {token}"})
    error = _assert_openai_error(response, 503)
    assert "denied" in error["message"] and "limits" not in error["message"]


def test_unreachable_opa_is_503(local_issuer) -> None:
    from devkit.server import free_port

    app = _null_gateway(local_issuer, policy_backend="opa", opa_url=f"http://127.0.0.1:{free_port()}")
    with serving(app) as base:
        token = local_issuer.mint(ALPHA, audience="api://tenantgate")
        # The tenant list comes from OPA too: with OPA never reached, no token can be judged.
        response = httpx.post(base + "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {token}"})
        error = _assert_openai_error(response, 503)
        assert error["code"] == "service_unavailable" and response.headers["retry-after"] == "2"
        assert httpx.get(base + "/readyz").status_code == 503


def test_a_gateway_started_before_opa_serves_once_opa_answers(local_issuer, opa_server_factory) -> None:
    from devkit.server import free_port

    port = free_port()
    app = _null_gateway(local_issuer, policy_backend="opa", opa_url=f"http://127.0.0.1:{port}",
                        opa_refresh_interval_s=0.2)
    modules = [str(p) for p in rego_files(DEFAULT_POLICY_DIR, include_tests=False)]
    with serving(app) as base:
        headers = {"Authorization": f"Bearer {local_issuer.mint(ALPHA, audience='api://tenantgate')}"}
        early = httpx.post(base + "/v1/chat/completions", json=CHAT, headers=headers)
        assert _assert_openai_error(early, 503)["code"] == "service_unavailable"  # unknown, not a bad token
        opa_server_factory([*modules, str(DATA_DIR / "tenants.json")], port=port)
        # Nothing asks /readyz: the gateway learns the tenants from OPA by itself.
        deadline = time.monotonic() + 15
        while (response := httpx.post(base + "/v1/chat/completions", json=CHAT, headers=headers)).status_code == 503:
            assert time.monotonic() < deadline, "the gateway never learned the tenants from OPA"
            time.sleep(0.1)
        assert response.status_code == 200, response.text
        assert httpx.get(base + "/readyz").status_code == 200


def test_opa_backend_serves_and_fails_closed_when_opa_stops(local_issuer, opa_server_factory) -> None:
    modules = [str(p) for p in rego_files(DEFAULT_POLICY_DIR, include_tests=False)]
    opa = opa_server_factory([*modules, str(DATA_DIR / "tenants.json")])
    app = _null_gateway(local_issuer, policy_backend="opa", opa_url=opa.url)
    with serving(app) as base:
        headers = {"Authorization": f"Bearer {local_issuer.mint(ALPHA, audience='api://tenantgate')}"}
        ok = httpx.post(base + "/v1/chat/completions", json=CHAT, headers=headers)
        assert ok.status_code == 200, ok.text
        assert httpx.get(base + "/readyz").status_code == 200
        opa.process.terminate()
        opa.process.wait(10)
        down = httpx.post(base + "/v1/chat/completions", json=CHAT, headers=headers)
        error = _assert_openai_error(down, 503)
        assert error["code"] == "service_unavailable"


def test_embedded_policy_reloads_when_data_changes(local_issuer, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    tenants = json.loads((DATA_DIR / "tenants.json").read_text())
    (data_dir / "tenants.json").write_text(json.dumps(tenants))
    app = _null_gateway(local_issuer, policy_data_dir=data_dir, policy_reload_interval_s=0.1)
    with serving(app) as base:
        headers = {"Authorization": f"Bearer {local_issuer.mint(ALPHA, audience='api://tenantgate')}"}
        before = httpx.post(base + "/v1/chat/completions", json={**CHAT, "max_tokens": 50}, headers=headers)
        assert before.json()["usage"]["completion_tokens"] == 50
        revision = app.state.gateway.policy.revision
        tenants["tenants"][ALPHA]["limits"]["max_tokens"] = 5
        (data_dir / "tenants.json").write_text(json.dumps(tenants))
        deadline = time.monotonic() + 10
        while app.state.gateway.policy.revision == revision and time.monotonic() < deadline:
            time.sleep(0.05)
        assert app.state.gateway.policy.revision != revision
        after = httpx.post(base + "/v1/chat/completions", json={**CHAT, "max_tokens": 50}, headers=headers)
        assert after.json()["usage"]["completion_tokens"] == 5
        # A broken edit keeps the last good policy serving.
        (data_dir / "tenants.json").write_text("{broken")
        time.sleep(0.5)
        still = httpx.post(base + "/v1/chat/completions", json={**CHAT, "max_tokens": 50}, headers=headers)
        assert still.status_code == 200 and still.json()["usage"]["completion_tokens"] == 5


# -- an unexpected exception: a fixed 500 for the caller, nothing of its message in any log ----


class _BrokenBackend(NullBackend):
    """An engine bug whose message quotes the request (as a tokenizer or template error may)."""

    CANARY = "canary-quoted-prompt-7f3a"

    async def generate(self, token_ids, params, envelope, request_id):
        raise RuntimeError(f"the engine choked on {self.CANARY}")
        yield  # an async generator, like the real one


def test_an_unexpected_exception_is_a_fixed_500_and_its_message_reaches_no_log(local_issuer, caplog, capfd) -> None:
    app = create_app(gateway_settings(local_issuer, metrics_port=0), backend=_BrokenBackend(model_name="demo"))
    with caplog.at_level("DEBUG"), serving(app) as base:
        token = local_issuer.mint(ALPHA, audience="api://tenantgate")
        response = httpx.post(base + "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {token}"},
                              timeout=30)
    error = _assert_openai_error(response, 500)
    assert error["message"] == "internal error"
    # Both the gateway's loggers and what uvicorn writes to stderr itself ("Exception in ASGI application").
    logs = caplog.text + capfd.readouterr().err
    assert "RuntimeError" in logs  # the server log says what failed, and where
    assert _BrokenBackend.CANARY not in logs and _BrokenBackend.CANARY not in response.text
