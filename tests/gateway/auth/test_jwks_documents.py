"""What the verifier accepts from the network: discovery and JWKS documents, key by key."""

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from devkit.issuer import LocalIssuer, sign_rs256
from gateway.auth import AuthError, AuthUnavailableError, EntraVerifier
from gateway.encoding import b64url
from tests.utils.issuer import CONTOSO, FABRIKAM, verifier_options

AUTHORITY = "https://login.example"


def entra_like(issuer: LocalIssuer, **replace: object):
    """A transport serving issuer's documents at AUTHORITY; replace maps a path to a Response."""
    requested: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        requested.append(str(request.url))
        path = request.url.path
        if path in replace:
            return replace[path]
        tid = path.split("/")[1]
        if path.endswith("openid-configuration"):
            doc = issuer.discovery_document(tid, "2.0" if "/v2.0/" in path else "1.0")
            doc["jwks_uri"] = doc["jwks_uri"].replace(issuer.base_url, AUTHORITY)
            return httpx.Response(200, json=doc)
        return httpx.Response(200, json=issuer.jwks_document("2.0" if "/v2.0/" in path else "1.0"))

    return httpx.MockTransport(handle), requested


@pytest.fixture(scope="module")
def offline_issuer() -> LocalIssuer:
    """Never started: mints tokens whose iss is AUTHORITY; the mock transport serves its keys."""
    return LocalIssuer(AUTHORITY)


async def verify_through(transport: httpx.MockTransport, token: str, **overrides: object):
    client = httpx.AsyncClient(transport=transport)
    options = {"authority": AUTHORITY, "v1_issuer_host": AUTHORITY, **overrides}
    verifier = EntraVerifier(**verifier_options(LocalIssuer(AUTHORITY), **options, http_client=client))
    try:
        return await verifier.verify(token)
    finally:
        await verifier.aclose()
        await client.aclose()


async def test_the_mock_authority_serves_valid_keys(offline_issuer) -> None:
    transport, requested = entra_like(offline_issuer)
    principal = await verify_through(transport, offline_issuer.mint(CONTOSO))
    assert principal.tenant_id == CONTOSO
    assert requested == [
        f"{AUTHORITY}/{CONTOSO}/v2.0/.well-known/openid-configuration",
        f"{AUTHORITY}/{CONTOSO}/discovery/v2.0/keys",
    ]


def _keys_path(version: str = "2.0") -> str:
    return f"/{CONTOSO}/discovery/v2.0/keys" if version == "2.0" else f"/{CONTOSO}/discovery/keys"


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(200, content=b'{"keys": [' + b'{"kty": "oct"},' * 30000 + b"{}]}"),
        httpx.Response(200, json=[{"keys": []}]),
        httpx.Response(200, content=b"<html>not json</html>"),
        httpx.Response(302, headers={"Location": "https://attacker.example/keys"}),
        httpx.Response(500, json={"keys": []}),
        httpx.Response(200, json={"keys": "none"}),
        httpx.Response(200, json={"keys": []}),
    ],
    ids=["too-large", "not-an-object", "not-json", "redirect", "server-error", "keys-not-a-list", "no-keys"],
)
async def test_an_unusable_jwks_response_leaves_no_keys(response, offline_issuer) -> None:
    transport, requested = entra_like(offline_issuer, **{_keys_path(): response})
    with pytest.raises(AuthUnavailableError):
        await verify_through(transport, offline_issuer.mint(CONTOSO))
    assert not any("attacker" in url for url in requested)


async def test_a_jwks_uri_outside_the_authority_is_never_fetched(offline_issuer) -> None:
    doc = offline_issuer.discovery_document(CONTOSO, "2.0")
    doc["jwks_uri"] = "https://attacker.example/keys"
    path = f"/{CONTOSO}/v2.0/.well-known/openid-configuration"
    transport, requested = entra_like(offline_issuer, **{path: httpx.Response(200, json=doc)})
    with pytest.raises(AuthUnavailableError):
        await verify_through(transport, offline_issuer.mint(CONTOSO))
    assert requested == [AUTHORITY + path]


async def test_a_discovery_issuer_of_another_tenant_is_refused(offline_issuer) -> None:
    doc = offline_issuer.discovery_document(FABRIKAM, "2.0")
    doc["jwks_uri"] = f"{AUTHORITY}/{CONTOSO}/discovery/v2.0/keys"
    path = f"/{CONTOSO}/v2.0/.well-known/openid-configuration"
    transport, _ = entra_like(offline_issuer, **{path: httpx.Response(200, json=doc)})
    with pytest.raises(AuthError, match="issuer"):
        await verify_through(transport, offline_issuer.mint(CONTOSO))


@pytest.mark.parametrize("version", ["1.0", "2.0"])
async def test_a_key_bound_to_another_issuer_is_refused(version, offline_issuer) -> None:
    jwks = offline_issuer.jwks_document(version)
    for jwk in jwks["keys"]:
        jwk["issuer"] = "https://login.example/{tenantid}/v2.0/other"
    transport, _ = entra_like(offline_issuer, **{_keys_path(version): httpx.Response(200, json=jwks)})
    with pytest.raises(AuthError, match="issuer"):
        await verify_through(transport, offline_issuer.mint(CONTOSO, version=version))


async def test_a_v1_token_accepts_keys_tagged_with_the_v2_issuer(offline_issuer) -> None:
    # Entra's multi-tenant key set tags keys with the v2 issuer template, used for v1 tokens too.
    jwks = offline_issuer.jwks_document("2.0")
    transport, _ = entra_like(offline_issuer, **{_keys_path("1.0"): httpx.Response(200, json=jwks)})
    principal = await verify_through(transport, offline_issuer.mint(CONTOSO, version="1.0"))
    assert principal.token_version == "1.0"


@pytest.mark.parametrize(
    "change",
    [{"kty": "EC"}, {"use": "enc"}, {"alg": "RS512"}, {"n": "AQAB"}, {"e": "AAAAAAAB"}, {"n": "not base64!"}],
    ids=["kty-ec", "use-enc", "alg-rs512", "modulus-too-small", "exponent-one", "modulus-not-base64"],
)
async def test_an_unusable_key_is_ignored(change, offline_issuer) -> None:
    jwks = offline_issuer.jwks_document("2.0")
    weak = dict(jwks["keys"][0], kid="weak", **change)
    jwks["keys"].append(weak)
    transport, _ = entra_like(offline_issuer, **{_keys_path(): httpx.Response(200, json=jwks)})
    assert (await verify_through(transport, offline_issuer.mint(CONTOSO))).tenant_id == CONTOSO
    with pytest.raises(AuthError) as caught:
        await verify_through(transport, offline_issuer.mint(CONTOSO, kid="weak"))
    assert caught.value.code == "unknown_key"


async def test_a_1024_bit_key_is_ignored(offline_issuer) -> None:
    small = rsa.generate_private_key(65537, 1024)
    numbers = small.public_key().public_numbers()
    jwks = offline_issuer.jwks_document("2.0")
    jwks["keys"].append(dict(jwks["keys"][0], kid="small", n=b64url(numbers.n.to_bytes(128, "big"))))
    transport, _ = entra_like(offline_issuer, **{_keys_path(): httpx.Response(200, json=jwks)})
    token = sign_rs256({"alg": "RS256", "kid": "small"}, offline_issuer.claims(CONTOSO), small)
    with pytest.raises(AuthError) as caught:
        await verify_through(transport, token)
    assert caught.value.code == "unknown_key"
