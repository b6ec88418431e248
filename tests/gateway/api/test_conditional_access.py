"""Conditional Access over real HTTP (issue 28): a model whose policy needs authentication context
c1, Entra's claims challenge to clients that declared cp1 (parsed by azure-core's own code and
followed at the local issuer), a 403 naming c1 to others, a sign-in too old for max_age_s, and
revocation from policy data within one reload interval."""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import msal
import openai
import pytest
import requests
from azure.core.credentials import AccessToken
from azure.core.pipeline import Pipeline
from azure.core.pipeline.policies import BearerTokenCredentialPolicy
from azure.core.pipeline.policies._utils import get_challenge_parameter
from azure.core.pipeline.transport import RequestsTransport
from azure.core.rest import HttpRequest
from msal.application import _merge_claims_challenge_and_capabilities

from devkit.issuer import DEV_CLIENT_ID, LocalIssuer
from devkit.server import serving
from gateway.app import create_app
from gateway.inference import NullBackend
from tests.gateway.api.conftest import ALPHA, AUDIENCE, DATA_DIR, gateway_settings
from tests.utils.tls import write_certificates

# Microsoft's documented claims value for c1 ("Claims challenges, claims requests, and client capabilities").
C1_CLAIMS = "eyJhY2Nlc3NfdG9rZW4iOnsiYWNycyI6eyJlc3NlbnRpYWwiOnRydWUsInZhbHVlIjoiYzEifX19"
C1_CLAIMS_JSON = '{"access_token":{"acrs":{"essential":true,"value":"c1"}}}'
RELOAD_INTERVAL_S = 0.5
CHAT = [{"role": "user", "content": "hello"}]
ADA, GRACE = "0a0a0a0a-0000-4000-8000-00000000ada0", "0a0a0a0a-0000-4000-8000-000000006ace"


@dataclass
class CaGateway:
    base_url: str
    issuer: LocalIssuer
    data_dir: Path
    audit_file: Path
    app: object

    def token(self, *, object_id: str = ADA, **claims) -> str:
        claims.setdefault("iat", int(time.time()))
        return self.issuer.mint(ALPHA, audience=AUDIENCE, object_id=object_id, extra_claims=claims)

    def chat(self, token: str, *, classification: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        if classification:
            headers["x-data-classification"] = classification
        return httpx.post(self.base_url + "/v1/chat/completions", headers=headers, timeout=30,
                          json={"model": "demo", "messages": CHAT, "max_tokens": 2})

    def audit_record(self, decision_id: str, timeout_s: float = 5.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.audit_file.read_text().splitlines():
                entry = json.loads(line)
                if entry.get("type") == "record" and entry.get("decision_id") == decision_id:
                    return entry
            time.sleep(0.02)
        raise AssertionError(f"no audit record for decision {decision_id}")


def _conditional_access_data(data_dir: Path) -> None:
    """The API tests' tenants, where Alpha's model demo needs c1 and its confidential data a sign-in
    within the hour."""
    shutil.copytree(DATA_DIR, data_dir)
    tenants_file = data_dir / "tenants.json"
    tenants = json.loads(tenants_file.read_text())
    tenants["tenants"][ALPHA]["authentication"] = {
        "models": {"demo": {"contexts": ["c1"]}},
        "classifications": {"confidential": {"max_age_s": 3600}},
    }
    tenants_file.write_text(json.dumps(tenants))


@pytest.fixture(scope="module")
def ca_gateway(local_issuer: LocalIssuer, tmp_path_factory) -> Iterator[CaGateway]:
    """A gateway on _conditional_access_data; the policy data is reloaded every RELOAD_INTERVAL_S."""
    root = tmp_path_factory.mktemp("conditional-access")
    data_dir = root / "data"
    _conditional_access_data(data_dir)
    settings = gateway_settings(local_issuer, engine="null", metrics_port=0, policy_data_dir=data_dir,
                                policy_reload_interval_s=RELOAD_INTERVAL_S, audit_file=root / "audit.jsonl",
                                audit_signing_key=root / "audit-signing.pem")
    app = create_app(settings, backend=NullBackend(model_name="demo"))
    with serving(app) as base_url:
        yield CaGateway(base_url, local_issuer, data_dir, root / "audit.jsonl", app)


def _claims_of(response: httpx.Response) -> str:
    """The challenge's claims as azure-core's BearerTokenCredentialPolicy.on_challenge reads them:
    get_challenge_parameter, padded, urlsafe base64 (azure/core/pipeline/policies/_authentication.py)."""
    encoded = get_challenge_parameter(response.headers, "Bearer", "claims")
    assert encoded
    return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode("utf-8")


def test_a_cae_client_without_c1_gets_entras_claims_challenge_through_the_openai_sdk(ca_gateway) -> None:
    token = ca_gateway.token(xms_cc=["cp1"])
    with openai.OpenAI(base_url=ca_gateway.base_url + "/v1", api_key=token, max_retries=0) as client, \
            pytest.raises(openai.AuthenticationError) as refused:
        client.chat.completions.create(model="demo", messages=CHAT, max_tokens=2)
    response = refused.value.response
    assert response.status_code == 401
    header = response.headers["www-authenticate"]
    assert header == (f'Bearer realm="", authorization_uri="{ca_gateway.issuer.base_url}/common/oauth2/authorize", '
                      f'error="insufficient_claims", claims="{C1_CLAIMS}"')
    assert get_challenge_parameter(response.headers, "Bearer", "error") == "insufficient_claims"
    assert get_challenge_parameter(response.headers, "Bearer", "authorization_uri") == (
        f"{ca_gateway.issuer.base_url}/common/oauth2/authorize")
    assert _claims_of(response) == C1_CLAIMS_JSON
    assert response.json() == {"error": {"message": "this request needs authentication context c1",
                                         "type": "invalid_request_error", "param": None,
                                         "code": "insufficient_claims"}}
    record = ca_gateway.audit_record(response.headers["x-tenantgate-decision-id"])
    assert record["status"] == 401 and record["outcome"] == "insufficient_claims"
    assert record["decision"]["reasons"] == ["this request needs authentication context c1"]


def test_the_challenge_followed_at_the_local_issuer_gets_a_token_that_is_served(ca_gateway) -> None:
    refused = ca_gateway.chat(ca_gateway.token(xms_cc=["cp1"]))
    # What MSAL sends to the token endpoint: the challenge merged with the client's capabilities.
    claims = _merge_claims_challenge_and_capabilities(["cp1"], _claims_of(refused))
    answer = httpx.post(f"{ca_gateway.issuer.base_url}/{ALPHA}/oauth2/v2.0/token", data={
        "grant_type": "password", "username": "ada@alpha.example", "scope": f"{AUDIENCE}/.default", "claims": claims})
    assert answer.status_code == 200, answer.text
    stepped_up = answer.json()["access_token"]
    with openai.OpenAI(base_url=ca_gateway.base_url + "/v1", api_key=stepped_up, max_retries=0) as client:
        completion = client.chat.completions.create(model="demo", messages=CHAT, max_tokens=2)
    assert completion.usage.completion_tokens == 2


class _LocalIssuerCredential:
    """A TokenCredential whose get_token(claims=...) asks the local issuer's token endpoint, as
    azure-identity's credentials ask Entra's: azure-core's BearerTokenCredentialPolicy calls it
    again with the challenge's claims after a 401 insufficient_claims."""

    def __init__(self, issuer: LocalIssuer) -> None:
        self.issuer = issuer
        self.claims_seen: list[str | None] = []

    def get_token(self, *scopes: str, claims: str | None = None, **kwargs) -> AccessToken:
        self.claims_seen.append(claims)
        merged = _merge_claims_challenge_and_capabilities(["cp1"], claims)
        answer = httpx.post(f"{self.issuer.base_url}/{ALPHA}/oauth2/v2.0/token", data={
            "grant_type": "password", "username": "ada@alpha.example", "scope": " ".join(scopes), "claims": merged})
        answer.raise_for_status()
        return AccessToken(answer.json()["access_token"], int(time.time()) + 3600)


def test_azure_cores_bearer_policy_follows_the_challenge_as_sent(ca_gateway) -> None:
    """azure-core's own challenge handling, unchanged, takes the 401, asks the credential for a
    token with the challenge's claims, and retries: served on the second try."""
    credential = _LocalIssuerCredential(ca_gateway.issuer)
    policy = BearerTokenCredentialPolicy(credential, f"{AUDIENCE}/.default")
    with Pipeline(transport=RequestsTransport(), policies=[policy]) as pipeline:
        request = HttpRequest("POST", ca_gateway.base_url + "/v1/chat/completions",
                              json={"model": "demo", "messages": CHAT, "max_tokens": 2})
        response = pipeline.run(request, enforce_https=False).http_response  # loopback
    assert response.status_code == 200, response.text()
    first, challenged = credential.claims_seen
    assert first is None  # the first token is asked for without claims
    assert challenged == C1_CLAIMS_JSON


def test_a_client_without_cp1_gets_a_403_naming_c1(ca_gateway) -> None:
    with openai.OpenAI(base_url=ca_gateway.base_url + "/v1", api_key=ca_gateway.token(), max_retries=0) as client, \
            pytest.raises(openai.PermissionDeniedError) as refused:
        client.chat.completions.create(model="demo", messages=CHAT, max_tokens=2)
    response = refused.value.response
    assert response.status_code == 403 and "www-authenticate" not in response.headers
    error = response.json()["error"]
    assert error["code"] == "authentication_context_required" and "authentication context c1" in error["message"]
    record = ca_gateway.audit_record(response.headers["x-tenantgate-decision-id"])
    assert record["status"] == 403 and record["outcome"] == "authentication_context_required"


def test_a_token_with_c1_is_served(ca_gateway) -> None:
    assert ca_gateway.chat(ca_gateway.token(acrs=["c1"], xms_cc=["cp1"])).status_code == 200


def test_a_sign_in_older_than_max_age_gets_the_challenge_with_max_age(ca_gateway) -> None:
    two_hours_ago = int(time.time()) - 7200
    response = ca_gateway.chat(ca_gateway.token(acrs=["c1"], xms_cc=["cp1"], auth_time=two_hours_ago),
                               classification="confidential")
    assert response.status_code == 401
    assert get_challenge_parameter(response.headers, "Bearer", "error") == "insufficient_claims"
    assert get_challenge_parameter(response.headers, "Bearer", "max_age") == "3600"
    requested = json.loads(_claims_of(response))["access_token"]
    assert requested["acrs"] == {"essential": True, "value": "c1"}
    assert requested["nbf"]["essential"] is True and int(requested["nbf"]["value"]) >= two_hours_ago + 7200 - 5
    assert "a sign-in within the last 3600 seconds" in response.json()["error"]["message"]
    recent = ca_gateway.token(acrs=["c1"], xms_cc=["cp1"], auth_time=int(time.time()) - 60)
    assert ca_gateway.chat(recent, classification="confidential").status_code == 200
    no_auth_time = ca_gateway.token(acrs=["c1"])  # nothing to compare: fails closed, a 403 without cp1
    assert ca_gateway.chat(no_auth_time, classification="confidential").status_code == 403


def test_a_revoked_object_id_is_refused_within_one_reload_interval_while_others_are_served(ca_gateway) -> None:
    ada, grace = ca_gateway.token(acrs=["c1"]), ca_gateway.token(acrs=["c1"], object_id=GRACE)
    ada_cae = ca_gateway.token(acrs=["c1"], xms_cc=["cp1"])
    assert ca_gateway.chat(ada).status_code == 200 and ca_gateway.chat(grace).status_code == 200
    # How an operator revokes: a file beside the tenant registry, merged into it at data.tenants.
    revocations = ca_gateway.data_dir / "revocations.json"
    policy = ca_gateway.app.state.gateway.policy
    reloads: list[tuple[float, float, bool]] = []  # each of the watcher's checks: started, ended, reloaded
    check = policy.reload_if_changed

    async def timed_check() -> bool:
        started = time.monotonic()
        reloaded = await check()
        reloads.append((started, time.monotonic(), reloaded))
        return reloaded

    policy.reload_if_changed = timed_check
    revocations.write_text(json.dumps({"tenants": {ALPHA: {"revocations": {"principals": [ADA]}}}}))
    written = time.monotonic()
    try:
        while (refused := ca_gateway.chat(ada)).status_code == 200:
            assert time.monotonic() - written < 30, "the revocation never took effect"
            time.sleep(0.02)
        refused_at = time.monotonic()
        # The first reload after the write is the one that refuses: the watcher noticed the file at its
        # next check, within one interval, and the new revision served as soon as it was swapped in
        # (its preparation runs in a process of its own, so the reload itself takes a moment).
        started, swapped, _ = next(r for r in reloads if r[2] and r[1] > written)
        print(f"revocation noticed {started - written:.2f} s after the write (interval {RELOAD_INTERVAL_S} s), "
              f"reloaded in {swapped - started:.2f} s, refused {refused_at - written:.2f} s after the write")
        assert started - written <= RELOAD_INTERVAL_S + 0.5  # the loop's own scheduling, on a loaded machine
        assert refused_at - swapped < 1.0  # the first request after the swap
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "token_revoked"
        assert refused.headers["www-authenticate"].startswith('Bearer realm="tenantgate", error="invalid_token"')
        challenged = ca_gateway.chat(ada_cae)
        assert challenged.status_code == 401
        assert get_challenge_parameter(challenged.headers, "Bearer", "error") == "insufficient_claims"
        assert set(json.loads(_claims_of(challenged))["access_token"]) == {"nbf"}
        assert ca_gateway.chat(grace).status_code == 200  # the tenant's other principals are served
        listing = httpx.get(ca_gateway.base_url + "/v1/models", headers={"Authorization": f"Bearer {ada}"})
        assert listing.status_code == 401 and listing.json()["error"]["code"] == "token_revoked"
    finally:
        del policy.reload_if_changed
        revocations.unlink()
        revision = ca_gateway.app.state.gateway.policy.revision
        deadline = time.monotonic() + 30
        while ca_gateway.app.state.gateway.policy.revision == revision and time.monotonic() < deadline:
            time.sleep(0.05)
    assert ca_gateway.chat(ada).status_code == 200


def test_a_tenant_cutoff_revokes_tokens_issued_before_it_and_not_after(ca_gateway) -> None:
    old = ca_gateway.token(acrs=["c1"], iat=int(time.time()) - 600)
    assert ca_gateway.chat(old).status_code == 200
    revocations = ca_gateway.data_dir / "revocations.json"
    revocations.write_text(json.dumps({"tenants": {ALPHA: {"revocations": {"issued_before": int(time.time()) - 60}}}}))
    try:
        deadline = time.monotonic() + 30
        while ca_gateway.chat(old).status_code == 200:
            assert time.monotonic() < deadline, "the cutoff never took effect"
            time.sleep(0.05)
        assert ca_gateway.chat(old).status_code == 401
        assert ca_gateway.chat(ca_gateway.token(acrs=["c1"])).status_code == 200  # a token issued since
    finally:
        revocations.unlink()
        revision = ca_gateway.app.state.gateway.policy.revision
        deadline = time.monotonic() + 30
        while ca_gateway.app.state.gateway.policy.revision == revision and time.monotonic() < deadline:
            time.sleep(0.05)


def test_a_model_listing_leaves_out_what_needs_a_step_up_and_refuses_no_one(ca_gateway) -> None:
    """GET /v1/models asks each model's question: without c1, demo is not listed (no challenge, no
    403 for the whole listing); with c1 it is."""
    def listed(token: str) -> list[str]:
        with openai.OpenAI(base_url=ca_gateway.base_url + "/v1", api_key=token, max_retries=0) as client:
            return [model.id for model in client.models.list()]

    assert "demo" not in listed(ca_gateway.token(xms_cc=["cp1"]))
    assert "demo" not in listed(ca_gateway.token())
    assert "demo" in listed(ca_gateway.token(acrs=["c1"], xms_cc=["cp1"]))


# MSAL recommends response_mode=form_post for a browser; the flow here has no browser.
@pytest.mark.filterwarnings("ignore:response_mode='form_post' is recommended")
def test_msal_gets_the_stepped_up_token_the_challenge_asks_for(tmp_path, monkeypatch) -> None:
    """MSAL itself, unchanged, against the local issuer over TLS (MSAL insists on https): a confidential
    client declaring cp1 gets a token, the gateway challenges it, acquire_token_for_client with the
    challenge's claims (MSAL merges its capabilities into them) gets one with c1, which is served; and a
    user steps up through MSAL's auth code flow with the same claims."""
    ca, certificate, key = write_certificates(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))  # the gateway's JWKS client (httpx)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca))  # MSAL's (requests)
    data_dir = tmp_path / "data"
    _conditional_access_data(data_dir)
    with LocalIssuer(port=0, tls=(certificate, key)) as issuer:
        settings = gateway_settings(issuer, engine="null", metrics_port=0, policy_data_dir=data_dir)
        # MSAL's session is closed before the issuer stops, so no connection to it is left open.
        with serving(create_app(settings, backend=NullBackend(model_name="demo"))) as base_url, \
                requests.Session() as session:
            app = msal.ConfidentialClientApplication(DEV_CLIENT_ID, client_credential="dev-secret",
                                                     authority=f"{issuer.base_url}/{ALPHA}", http_client=session,
                                                     client_capabilities=["cp1"], instance_discovery=False)
            scopes = [f"{AUDIENCE}/.default"]
            first = app.acquire_token_for_client(scopes=scopes)["access_token"]
            with openai.OpenAI(base_url=base_url + "/v1", api_key=first, max_retries=0) as client, \
                    pytest.raises(openai.AuthenticationError) as refused:
                client.chat.completions.create(model="demo", messages=CHAT, max_tokens=2)
            claims = _claims_of(refused.value.response)
            assert claims == C1_CLAIMS_JSON
            stepped_up = app.acquire_token_for_client(scopes=scopes, claims_challenge=claims)
            assert stepped_up["token_source"] == "identity_provider"  # a challenge bypasses MSAL's cache
            with openai.OpenAI(base_url=base_url + "/v1", api_key=stepped_up["access_token"], max_retries=0) as client:
                completion = client.chat.completions.create(model="demo", messages=CHAT, max_tokens=2)
            assert completion.usage.completion_tokens == 2

            # A user's step-up: MSAL's auth code flow carries the claims to the authorize endpoint,
            # where the browser would be; the redirect it answers is handed back to MSAL.
            user_app = msal.PublicClientApplication(DEV_CLIENT_ID, authority=f"{issuer.base_url}/{ALPHA}",
                                                    http_client=session, client_capabilities=["cp1"],
                                                    instance_discovery=False)
            flow = user_app.initiate_auth_code_flow(scopes, redirect_uri="http://localhost:8765/callback",
                                                    claims_challenge=claims, login_hint="ada@alpha.example")
            redirect = httpx.get(flow["auth_uri"], verify=ssl.create_default_context(cafile=str(ca)),
                                 follow_redirects=False)
            assert redirect.status_code == 302
            answer = {k: v[0] for k, v in parse_qs(urlsplit(redirect.headers["location"]).query).items()}
            user_token = user_app.acquire_token_by_auth_code_flow(flow, answer)["access_token"]
            with openai.OpenAI(base_url=base_url + "/v1", api_key=user_token, max_retries=0) as client:
                completion = client.chat.completions.create(model="demo", messages=CHAT, max_tokens=2)
            assert completion.usage.completion_tokens == 2
