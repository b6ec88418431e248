"""The local issuer: Entra's URL layout, Entra-shaped claims, a key other processes can share."""

import base64
import hashlib
import json
import stat
import time

import httpx
import pytest

from devkit.issuer import KEY_FILE, LocalIssuer, load_or_create_key
from tests.utils.issuer import CONTOSO


def test_the_persisted_key_is_private_and_shared(tmp_path) -> None:
    key_dir = tmp_path / "dev-issuer"
    first = LocalIssuer("http://127.0.0.1:8401", key_dir=key_dir)
    assert stat.S_IMODE((key_dir / KEY_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE(key_dir.stat().st_mode) == 0o700
    assert LocalIssuer("http://127.0.0.1:8401", key_dir=key_dir).signing_kid == first.signing_kid

    rotated = first.rotate()
    assert stat.S_IMODE((key_dir / KEY_FILE).stat().st_mode) == 0o600
    assert LocalIssuer("http://127.0.0.1:8401", key_dir=key_dir).signing_kid == rotated


def test_a_key_file_readable_by_others_is_made_private(tmp_path) -> None:
    load_or_create_key(tmp_path)
    (tmp_path / KEY_FILE).chmod(0o644)
    load_or_create_key(tmp_path)
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600


def test_a_key_file_that_is_not_an_rsa_key_is_refused(tmp_path) -> None:
    (tmp_path / KEY_FILE).write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    with pytest.raises(ValueError):
        LocalIssuer("http://127.0.0.1:8401", key_dir=tmp_path)


@pytest.mark.parametrize(
    ("path", "issuer_path", "keys_path"),
    [
        (f"/{CONTOSO}/v2.0/.well-known/openid-configuration", f"/{CONTOSO}/v2.0", f"/{CONTOSO}/discovery/v2.0/keys"),
        (f"/{CONTOSO}/.well-known/openid-configuration", f"/{CONTOSO}/", f"/{CONTOSO}/discovery/keys"),
        ("/common/v2.0/.well-known/openid-configuration", "/{tenantid}/v2.0", "/common/discovery/v2.0/keys"),
    ],
)
def test_discovery_follows_entra_url_layout(path, issuer_path, keys_path, issuer) -> None:
    document = httpx.get(issuer.base_url + path).json()
    assert document["issuer"] == issuer.base_url + issuer_path
    assert document["jwks_uri"] == issuer.base_url + keys_path
    assert document["id_token_signing_alg_values_supported"] == ["RS256"]


def test_v2_keys_carry_the_issuer_template_and_v1_keys_do_not(issuer) -> None:
    v2 = httpx.get(f"{issuer.base_url}/{CONTOSO}/discovery/v2.0/keys").json()["keys"]
    v1 = httpx.get(f"{issuer.base_url}/{CONTOSO}/discovery/keys").json()["keys"]
    assert [k["kid"] for k in v1] == [k["kid"] for k in v2] == list(issuer.kids)
    assert {k["issuer"] for k in v2} == {issuer.base_url + "/{tenantid}/v2.0"}
    assert all("issuer" not in k and k["kty"] == "RSA" and k["use"] == "sig" for k in v1)


def test_an_unknown_tenant_path_is_a_400(issuer) -> None:
    assert httpx.get(f"{issuer.base_url}/contoso.example/discovery/keys").status_code == 400


@pytest.mark.parametrize(("version", "app_claim"), [("1.0", "appid"), ("2.0", "azp")])
def test_claims_are_entra_shaped(version, app_claim, issuer) -> None:
    user = issuer.claims(CONTOSO, version=version)
    app = issuer.claims(CONTOSO, version=version, app=True)
    assert user["ver"] == app["ver"] == version
    assert user["iss"] == issuer.issuer_for(CONTOSO, version)
    assert app_claim in user and user["scp"] == "Inference.Invoke" and "roles" not in user and "idtyp" not in user
    assert app["idtyp"] == "app" and app["roles"] == ["Inference.Invoke.All"] and "scp" not in app
    assert user["oid"] != app["oid"] and user["exp"] - user["iat"] == 3600
    assert "exp" not in issuer.claims(CONTOSO, extra_claims={"exp": None})


def test_only_a_published_non_signing_key_can_be_removed(issuer) -> None:
    with pytest.raises(ValueError):
        issuer.remove_key(issuer.signing_kid)
    with pytest.raises(ValueError):
        issuer.remove_key("never-published")


def test_the_issuer_restarts_on_the_same_port() -> None:
    issuer = LocalIssuer(port=0).start()
    url = f"{issuer.base_url}/{CONTOSO}/discovery/keys"
    assert httpx.get(url).status_code == 200
    issuer.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(url)
    with issuer:
        assert httpx.get(url).status_code == 200
    issuer.stop()  # stopping twice is harmless
    assert issuer.jwks_requests == 2


def test_an_issuer_on_port_zero_has_no_url_before_it_starts() -> None:
    with pytest.raises(RuntimeError):
        LocalIssuer(port=0).base_url  # noqa: B018 - reading it is what raises


def test_a_port_in_use_is_an_error_not_a_leak(issuer) -> None:
    with pytest.raises(OSError):
        LocalIssuer(issuer.base_url).start()


def _token_claims(answer: httpx.Response) -> dict:
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["token_type"] == "Bearer" and body["expires_in"] == 3600
    payload = body["access_token"].split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def test_the_token_endpoint_honours_a_claims_request_as_entra_does(issuer) -> None:
    claims = json.dumps({"access_token": {"acrs": {"essential": True, "value": "c1"},
                                          "xms_cc": {"values": ["cp1"]}}})
    before = int(time.time())
    answer = httpx.post(f"{issuer.base_url}/{CONTOSO}/oauth2/v2.0/token", data={
        "grant_type": "password", "username": "ada@contoso.example", "scope": "api://tenantgate/.default",
        "claims": claims})
    token = _token_claims(answer)
    assert token["acrs"] == ["c1"] and token["xms_cc"] == ["cp1"] and token["aud"] == "api://tenantgate"
    assert token["auth_time"] >= before and token["scp"] == "Inference.Invoke" and token["ver"] == "2.0"


def test_an_nbf_claims_request_gives_a_token_issued_no_earlier(issuer) -> None:
    later = int(time.time()) + 30
    claims = json.dumps({"access_token": {"nbf": {"essential": True, "value": str(later)}}})
    token = _token_claims(httpx.post(f"{issuer.base_url}/{CONTOSO}/oauth2/v2.0/token",
                                     data={"grant_type": "client_credentials", "claims": claims}))
    assert token["nbf"] == token["iat"] == later and token["idtyp"] == "app"
    assert "auth_time" not in token  # no app sign-in session


def test_each_user_sign_in_is_a_session_of_its_own_for_a_stable_object_id(issuer) -> None:
    form = {"grant_type": "password", "username": "ada@contoso.example"}
    first, second = (_token_claims(httpx.post(f"{issuer.base_url}/{CONTOSO}/oauth2/v2.0/token", data=form))
                     for _ in range(2))
    other = _token_claims(httpx.post(f"{issuer.base_url}/{CONTOSO}/oauth2/v2.0/token",
                                     data={**form, "username": "grace@contoso.example"}))
    assert first["oid"] == second["oid"] != other["oid"] and first["sid"] != second["sid"]


@pytest.mark.parametrize("form", [
    {"grant_type": "authorization_code"},
    {"grant_type": "password"},  # no username
    {"grant_type": "client_credentials", "claims": "{"},
    {"grant_type": "client_credentials", "claims": '{"access_token": []}'},
    {"grant_type": "client_credentials", "claims": '{"access_token": {"acrs": {"values": ["c0"]}}}'},
    {"grant_type": "client_credentials", "claims": '{"access_token": {"nbf": {"value": "soon"}}}'},
    {"grant_type": "client_credentials", "claims": "x" * 5000},
])
def test_a_token_request_it_cannot_honour_is_a_400(form, issuer) -> None:
    answer = httpx.post(f"{issuer.base_url}/{CONTOSO}/oauth2/v2.0/token", data=form)
    assert answer.status_code == 400 and answer.json()["error"] == "invalid_request"


def _authorize(issuer, **query) -> httpx.Response:
    params = {"response_type": "code", "client_id": "0d3c7f5e-6b1a-4c2d-9e8f-7a6b5c4d3e2f",
              "redirect_uri": "http://localhost:8765/callback", "state": "s1", **query}
    return httpx.get(f"{issuer.base_url}/{CONTOSO}/oauth2/v2.0/authorize", params=params, follow_redirects=False)


def _code(redirect: httpx.Response) -> str:
    assert redirect.status_code == 302, redirect.text
    location = httpx.URL(redirect.headers["location"])
    assert (location.host, location.params["state"]) == ("localhost", "s1")
    return location.params["code"]


def test_the_authorize_endpoint_binds_the_claims_and_pkce_to_a_one_time_code(issuer) -> None:
    verifier = "a-code-verifier-of-forty-three-characters-xx"
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    code = _code(_authorize(issuer, claims='{"access_token":{"acrs":{"essential":true,"value":"c1"}}}',
                            code_challenge=challenge, code_challenge_method="S256", login_hint="ada@contoso.example"))
    form = {"grant_type": "authorization_code", "code": code, "client_id": "0d3c7f5e-6b1a-4c2d-9e8f-7a6b5c4d3e2f",
            "redirect_uri": "http://localhost:8765/callback", "code_verifier": verifier}
    token = _token_claims(httpx.post(f"{issuer.base_url}/{CONTOSO}/oauth2/v2.0/token", data=form))
    assert token["acrs"] == ["c1"] and token["scp"] == "Inference.Invoke" and "auth_time" in token
    again = httpx.post(f"{issuer.base_url}/{CONTOSO}/oauth2/v2.0/token", data=form)
    assert again.status_code == 400  # a code is redeemed once


@pytest.mark.parametrize("change", [{"code_verifier": "another-verifier"}, {"redirect_uri": "http://localhost:1/x"},
                                    {"client_id": "11111111-1111-4111-8111-111111111111"}])
def test_a_code_redeemed_by_another_client_or_verifier_is_refused(change, issuer) -> None:
    verifier = "a-code-verifier-of-forty-three-characters-xx"
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    code = _code(_authorize(issuer, code_challenge=challenge, code_challenge_method="S256"))
    form = {"grant_type": "authorization_code", "code": code, "client_id": "0d3c7f5e-6b1a-4c2d-9e8f-7a6b5c4d3e2f",
            "redirect_uri": "http://localhost:8765/callback", "code_verifier": verifier, **change}
    assert httpx.post(f"{issuer.base_url}/{CONTOSO}/oauth2/v2.0/token", data=form).status_code == 400


@pytest.mark.parametrize("query", [{"redirect_uri": "https://attacker.example/cb"}, {"response_type": "token"},
                                   {"claims": "{"}, {"code_challenge": "x", "code_challenge_method": "plain"}])
def test_the_authorize_endpoint_redirects_nowhere_but_loopback_and_refuses_bad_requests(query, issuer) -> None:
    answer = _authorize(issuer, **query)
    assert answer.status_code == 400 and "location" not in answer.headers
