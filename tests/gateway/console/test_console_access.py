"""Who gets the operator console, over real HTTP: nobody without a session (401 and the login
page), no token without the TenantGate.Operator role (403), no sign-in sent from another site,
and nothing at all on the public port. The session cookie's attributes, sign-out, the TTL, and
the JSON twin at /admin/console."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest

from devkit.server import serving
from gateway.app import create_app
from gateway.console.sessions import Sessions
from gateway.operator import OPERATOR_ROLE
from tests.gateway.api.conftest import ALPHA, AUDIENCE, PLATFORM, PLATFORM_OFF, gateway_settings


@pytest.fixture(scope="module")
def gateway(local_issuer, tmp_path_factory) -> Iterator[SimpleNamespace]:
    """A gateway on the null engine (no embedded engine: no KV or step records to show)."""
    root = tmp_path_factory.mktemp("console-access")
    settings = gateway_settings(local_issuer, engine="null", audit_file=root / "audit.jsonl",
                                audit_signing_key=root / "audit.pem", operator_tenants=[PLATFORM, PLATFORM_OFF])
    app = create_app(settings)
    with serving(app) as base_url:
        yield SimpleNamespace(base_url=base_url, operator_url=f"http://127.0.0.1:{settings.metrics_port}",
                              settings=settings, issuer=local_issuer, app=app)


def _operator_token(gateway) -> str:
    return gateway.issuer.mint(PLATFORM, audience=AUDIENCE, app=True, roles=(OPERATOR_ROLE,))


def _login(client: httpx.Client, token: str, **headers) -> httpx.Response:
    return client.post("/console/login", data={"token": token}, headers=headers)


def _admin_records(gateway, prefix: str = "admin.console") -> list[dict]:
    lines = gateway.settings.audit_file.read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == "record" and e["route"].startswith(prefix)]


@pytest.fixture
def client(gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.operator_url, timeout=30) as client:
        yield client


def test_without_a_session_every_page_is_401_with_the_login_page(client) -> None:
    for path in ("/console", "/console/tenants", "/console/audit", "/console/no-such-view"):
        answer = client.get(path)
        assert answer.status_code == 401 and answer.headers["content-type"].startswith("text/html")
        assert 'action="/console/login"' in answer.text and answer.headers["www-authenticate"].startswith("Bearer")
    assert client.get("/console", headers={"Cookie": "tenantgate_console=forged"}).status_code == 401
    assert client.get("/console/login").status_code == 200
    answer = client.get("/admin/console")
    assert answer.status_code == 401 and answer.json()["error"]["type"] == "invalid_request_error"


def test_a_token_without_the_operator_role_is_refused(gateway, client) -> None:
    user = gateway.issuer.mint(ALPHA, audience=AUDIENCE)  # a valid token of a tenant's user
    answer = _login(client, user)
    assert answer.status_code == 403 and OPERATOR_ROLE in answer.text and "set-cookie" not in answer.headers
    record = _admin_records(gateway)[-1]  # who tried is on the record, as digests
    assert (record["route"], record["status"], record["outcome"]) == ("admin.console.login", 403,
                                                                      "operator_role_required")
    assert len(record["tenant"]) == 32 and ALPHA not in json.dumps(record)
    refused = client.get("/admin/console", headers={"Authorization": f"Bearer {user}"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "operator_role_required"
    assert _login(client, "not-a-token").status_code == 401
    assert _login(client, "").status_code == 401


@pytest.mark.parametrize("tenant", [ALPHA, PLATFORM_OFF], ids=["customer-tenant", "disabled-platform-tenant"])
def test_the_operator_role_from_a_customer_or_disabled_tenant_is_refused_and_audited(gateway, client,
                                                                                      tenant: str) -> None:
    """A customer's own Entra admin can grant TenantGate.Operator to the customer's apps, and a
    disabled tenant's tokens still verify: neither may read other tenants' usage or the console."""
    token = gateway.issuer.mint(tenant, audience=AUDIENCE, app=True, roles=(OPERATOR_ROLE,))
    headers = {"Authorization": f"Bearer {token}"}
    for path, route in (("/admin/console", "admin.console"),
                        ("/admin/usage?from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z", "admin.usage")):
        answer = client.get(path, headers=headers)
        assert answer.status_code == 403, (path, answer.text)
        assert answer.json()["error"]["code"] == "operator_tenant_required"
        record = _admin_records(gateway, "admin.")[-1]
        assert (record["route"], record["status"], record["outcome"]) == (route, 403, "operator_tenant_required")
        assert record["tenant"] == gateway.app.state.gateway.audit.tenant_digest(tenant)
    login = _login(client, token)
    assert login.status_code == 403 and "platform" in login.text and "set-cookie" not in login.headers
    record = _admin_records(gateway)[-1]
    assert (record["route"], record["status"], record["outcome"]) == ("admin.console.login", 403,
                                                                      "operator_tenant_required")
    assert tenant not in json.dumps(record)


def test_a_sign_in_sent_from_another_site_is_refused(gateway, client) -> None:
    token = _operator_token(gateway)
    for headers in ({"Origin": "http://attacker.example"}, {"Sec-Fetch-Site": "cross-site"}):
        answer = _login(client, token, **headers)
        assert answer.status_code == 403 and "set-cookie" not in answer.headers
    assert _login(client, token, Origin=gateway.operator_url, **{"Sec-Fetch-Site": "same-origin"}).status_code == 303


def test_a_session_is_an_httponly_strict_cookie_until_sign_out(gateway, client) -> None:
    answer = _login(client, _operator_token(gateway))
    assert answer.status_code == 303 and answer.headers["location"] == "/console"
    cookie = answer.headers["set-cookie"]
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"httponly", "samesite", "path", "max-age"} <= attributes and "secure" not in attributes  # plain HTTP here
    assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie
    assert "Path=/console" in cookie and "Max-Age=900" in cookie
    assert _operator_token(gateway) not in cookie  # the token stays on the gateway

    page = client.get("/console")
    assert page.status_code == 200 and 'id="view-tenants"' in page.text
    assert "script-src" not in page.headers["content-security-policy"]  # default-src 'none': no script at all
    assert page.headers["x-frame-options"] == "DENY" and page.headers["cache-control"] == "no-store"
    kv = client.get("/console/kv")
    assert kv.status_code == 200 and "embeds no engine" in kv.text
    assert client.get("/console/no-such-view").status_code == 404
    assert client.get("/console/console.css").headers["content-type"].startswith("text/css")

    session = client.cookies["tenantgate_console"]
    out = client.post("/console/logout")
    assert out.status_code == 303 and out.headers["location"] == "/console/login"
    replayed = httpx.get(gateway.operator_url + "/console", headers={"Cookie": f"tenantgate_console={session}"})
    assert replayed.status_code == 401  # the session ended on the gateway, not only in this browser


def test_the_public_port_has_no_console(gateway) -> None:
    token = _operator_token(gateway)
    with httpx.Client(base_url=gateway.base_url, timeout=30) as public:
        for path in ("/console", "/console/login", "/console/tenants", "/console/console.css", "/admin/console"):
            assert public.get(path, headers={"Authorization": f"Bearer {token}"}).status_code == 404, path
        assert public.post("/console/login", data={"token": token}).status_code == 404


def test_admin_console_serves_the_views_as_json_to_operators(gateway, client) -> None:
    headers = {"Authorization": f"Bearer {_operator_token(gateway)}"}
    answer = client.get("/admin/console", headers=headers)
    assert answer.status_code == 200
    assert {"tenants", "quotas", "kv", "prefix", "regimes", "audit", "policy"} <= answer.json().keys()
    assert answer.json()["kv"]["engine"] is False and answer.json()["audit"]["verdict"] == "ok"
    one = client.get("/admin/console", params={"view": "policy"}, headers=headers).json()
    assert one.keys() == {"generated", "policy"} and one["policy"]["backend"] == "embedded"
    assert client.get("/admin/console", params={"view": "nope"}, headers=headers).status_code == 400
    assert _admin_records(gateway)[-1]["route"] == "admin.console"


def test_a_session_ends_at_its_ttl() -> None:
    now = [1000.0]
    sessions = Sessions(ttl_s=900, clock=lambda: now[0])
    first = sessions.open("token-a")
    assert sessions.token(first) == "token-a" and sessions.token("unknown") is None and sessions.token(None) is None
    now[0] += 899
    assert sessions.token(first) == "token-a"
    now[0] += 1
    assert sessions.token(first) is None
    second = sessions.open("token-b")
    sessions.close(second)
    assert sessions.token(second) is None


def test_every_value_is_escaped() -> None:
    from gateway.console.router import _page

    page = _page("refused.html", 403, message='<script>alert("x")</script>').body.decode()
    assert "<script>" not in page and "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page
