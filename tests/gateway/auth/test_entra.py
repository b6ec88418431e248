import asyncio
import logging
import time
import uuid

import httpx
import pytest

from devkit.issuer import DEFAULT_AUDIENCE, DEV_CLIENT_ID
from gateway.auth import AuthError, EntraVerifier, Principal, TenantsUnknownError
from gateway.auth.exceptions import MESSAGES
from tests.utils.bad_tokens import CASE_IDS, bad_token_cases
from tests.utils.issuer import CONTOSO, FABRIKAM, TAILSPIN, verifier_options

OID = "6a1f0c2e-9b8d-4e7f-a6c5-d4e3f2a1b0c9"

EXPECTED_CODES = {
    **{case: "unsupported_algorithm" for case in CASE_IDS if case.startswith("alg-")},
    **{case: "forbidden_header" for case in CASE_IDS if case.startswith("header-") and "json" not in case},
    **{case: "invalid_issuer" for case in CASE_IDS if case.startswith("issuer-")},
    **{case: "missing_kid" for case in ("kid-missing", "kid-empty", "kid-not-a-string")},
    **{case: "invalid_signature" for case in ("foreign-key-same-kid", "tampered-payload", "signature-empty")},
    "signature-of-another-token": "invalid_signature",
    "foreign-key-own-kid": "unknown_key",
    "unknown-kid": "unknown_key",
    "wrong-audience": "invalid_audience",
    "audience-list": "invalid_audience",
    "wrong-issuer": "invalid_issuer",
    "tid-not-allowed": "tenant_not_allowed",
    "tid-other-tenant": "invalid_issuer",
    **{case: "invalid_tenant" for case in ("tid-not-a-guid", "tid-braced-guid", "tid-missing")},
    **{case: "unsupported_token_version" for case in ("ver-missing", "ver-unknown")},
    "expired": "token_expired",
    "nbf-in-the-future": "token_not_yet_valid",
    "iat-in-the-future": "token_not_yet_valid",
    **{case: "missing_claim" for case in ("exp-missing", "iat-missing", "oid-missing", "azp-missing")},
    "exp-a-string": "invalid_claim",
    "oid-not-a-guid": "invalid_claim",
    **{
        case: "invalid_token_type"
        for case in (
            "roles-without-idtyp-app",
            "roles-on-a-user-token",
            "idtyp-app-with-scp",
            "idtyp-app-without-roles",
            "scp-and-roles-missing",
        )
    },
    "oversized": "token_too_large",
    **{
        case: "malformed_token"
        for case in (
            "exp-nan",
            "duplicate-tid-member",
            "empty-string",
            "two-segments",
            "five-segments",
            "malformed-base64",
            "padded-base64",
            "embedded-space",
            "non-json-header",
            "header-json-array",
            "payload-json-array",
            "payload-json-string",
            "non-ascii",
        )
    },
}


@pytest.fixture(scope="session")
def bad_tokens(issuer) -> dict[str, str]:
    cases = bad_token_cases(
        issuer, CONTOSO, DEFAULT_AUDIENCE, other_tenant_id=FABRIKAM, disallowed_tenant_id=TAILSPIN
    )
    return dict(cases)


def test_every_bad_token_case_has_an_expected_code() -> None:
    assert len(CASE_IDS) >= 30 and len(set(CASE_IDS)) == len(CASE_IDS)
    assert set(EXPECTED_CODES) == set(CASE_IDS)


@pytest.mark.parametrize("case_id", CASE_IDS)
async def test_bad_token_is_refused_without_echoing_it(case_id, bad_tokens, issuer, make_verifier, caplog) -> None:
    token = bad_tokens[case_id]
    verifier = make_verifier(issuer)
    with caplog.at_level(logging.DEBUG, logger="tenantgate.auth"), pytest.raises(AuthError) as caught:
        await verifier.verify(token)
    error = caught.value
    assert error.code == EXPECTED_CODES[case_id]
    assert str(error) == error.message == MESSAGES[error.code]
    assert error.__cause__ is None
    if token:
        assert token not in str(error) and token not in caplog.text


async def test_the_corpus_baseline_token_verifies(issuer, make_verifier) -> None:
    # Proves the bad cases fail for their own defect, not for one they all share.
    token = issuer.mint(CONTOSO, audience=DEFAULT_AUDIENCE)
    assert (await make_verifier(issuer).verify(token)).tenant_id == CONTOSO


@pytest.mark.parametrize(("version", "audience"), [("1.0", DEFAULT_AUDIENCE), ("2.0", DEV_CLIENT_ID)])
async def test_delegated_token_verifies_into_a_user_principal(version, audience, issuer, make_verifier) -> None:
    token = issuer.mint(
        CONTOSO, version=version, audience=audience, object_id=OID, scopes=("Inference.Invoke", "Models.Read")
    )
    principal = await make_verifier(issuer).verify(token)
    assert principal == Principal(
        tenant_id=CONTOSO,
        object_id=OID,
        app_id=DEV_CLIENT_ID,
        scopes=("Inference.Invoke", "Models.Read"),
        roles=(),
        idtyp="user",
        token_version=version,
        session=principal.session,  # gateway/auth/claims.py's own tests read it
    )


@pytest.mark.parametrize(("version", "audience"), [("1.0", DEFAULT_AUDIENCE), ("2.0", DEV_CLIENT_ID)])
async def test_app_token_verifies_into_an_app_principal(version, audience, issuer, make_verifier) -> None:
    app_id = str(uuid.uuid4())
    token = issuer.mint(FABRIKAM, version=version, audience=audience, app=True, app_id=app_id, object_id=OID)
    principal = await make_verifier(issuer).verify(token)
    assert principal == Principal(
        tenant_id=FABRIKAM,
        object_id=OID,
        app_id=app_id,
        scopes=(),
        roles=("Inference.Invoke.All",),
        idtyp="app",
        token_version=version,
        session=principal.session,
    )
    session = principal.session
    assert session.iat is not None and session.uti is not None and session.acrs == ()
    assert principal.policy_input() == {
        "tenant_id": FABRIKAM,
        "object_id": OID,
        "app_id": app_id,
        "idtyp": "app",
        "scopes": [],
        "roles": ["Inference.Invoke.All"],
        "acrs": [], "amr": [], "xms_cc": [], "iat": session.iat, "uti": session.uti,
    }


async def test_guids_are_normalised_to_lower_case(issuer, make_verifier) -> None:
    token = issuer.mint(CONTOSO, extra_claims={"tid": CONTOSO.upper(), "oid": OID.upper()})
    principal = await make_verifier(issuer).verify(token)
    assert (principal.tenant_id, principal.object_id) == (CONTOSO, OID)


async def test_identity_ignores_names_and_email(issuer, make_verifier) -> None:
    token = issuer.mint(CONTOSO, object_id=OID, extra_claims={"upn": "admin@fabrikam.example", "email": "x@y.z"})
    principal = await make_verifier(issuer).verify(token)
    assert (principal.tenant_id, principal.object_id) == (CONTOSO, OID)


@pytest.mark.parametrize(
    ("claims", "leeway_s", "accepted"),
    [
        ({"exp": -30}, 60.0, True),
        ({"exp": -90}, 60.0, False),
        ({"exp": -30}, 0.0, False),
        ({"nbf": 30}, 60.0, True),
        ({"nbf": 90}, 60.0, False),
        ({"nbf": 30}, 0.0, False),
    ],
)
async def test_lifetime_is_checked_with_the_configured_leeway(claims, leeway_s, accepted, issuer, make_verifier):
    now = int(time.time())
    token = issuer.mint(CONTOSO, extra_claims={name: now + offset for name, offset in claims.items()})
    verifier = make_verifier(issuer, leeway_s=leeway_s)
    if accepted:
        await verifier.verify(token)
    else:
        with pytest.raises(AuthError, match="expired|not valid yet"):
            await verifier.verify(token)


@pytest.mark.parametrize("tenant", [TAILSPIN, str(uuid.uuid4())])
async def test_a_tenant_policy_refuses_causes_no_fetch(tenant, fresh_issuer, make_verifier) -> None:
    verifier = make_verifier(fresh_issuer)
    with pytest.raises(AuthError) as caught:
        await verifier.verify(fresh_issuer.mint(tenant, audience=DEFAULT_AUDIENCE))
    assert caught.value.code == "tenant_not_allowed"
    assert verifier.jwks_fetch_count == 0
    assert fresh_issuer.discovery_requests == fresh_issuer.jwks_requests == 0


async def test_an_unexpected_error_fails_closed_as_an_auth_error(issuer) -> None:
    def broken_policy(tenant_id: str) -> bool:
        raise RuntimeError(f"policy store down while checking {tenant_id}")

    verifier = EntraVerifier(**verifier_options(issuer, tenant_allowed=broken_policy))
    try:
        with pytest.raises(AuthError) as caught:
            await verifier.verify(issuer.mint(CONTOSO))
    finally:
        await verifier.aclose()
    assert caught.value.code == "invalid_token" and caught.value.__cause__ is None
    assert CONTOSO not in str(caught.value)


async def test_a_tenant_list_not_known_yet_is_neither_accepted_nor_refused(fresh_issuer, make_verifier) -> None:
    verifier = make_verifier(fresh_issuer, tenant_allowed=lambda tenant_id: None)
    with pytest.raises(TenantsUnknownError):
        await verifier.verify(fresh_issuer.mint(CONTOSO))
    assert fresh_issuer.discovery_requests == fresh_issuer.jwks_requests == 0


async def test_a_truthy_non_boolean_from_policy_does_not_allow(issuer, make_verifier) -> None:
    verifier = make_verifier(issuer, tenant_allowed=lambda tenant_id: "yes")
    with pytest.raises(AuthError, match="may not call"):
        await verifier.verify(issuer.mint(CONTOSO))


async def test_cancellation_is_not_turned_into_an_auth_error(issuer) -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        return httpx.Response(500)

    client = httpx.AsyncClient(transport=httpx.MockTransport(hang))
    verifier = EntraVerifier(**verifier_options(issuer, http_client=client))
    task = asyncio.create_task(verifier.verify(issuer.mint(CONTOSO)))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await verifier.aclose()
    await client.aclose()


def test_unsafe_settings_are_refused() -> None:
    allowed = {"audiences": ["api://tenantgate"], "tenant_allowed": lambda tid: True}
    with pytest.raises(ValueError, match="https"):
        EntraVerifier(authority="http://login.microsoftonline.com", **allowed)
    with pytest.raises(ValueError, match="audiences"):
        EntraVerifier(authority="https://login.microsoftonline.com", audiences=[], tenant_allowed=lambda t: True)
    with pytest.raises(ValueError, match="audiences"):
        EntraVerifier(authority="https://login.microsoftonline.com", audiences="api://x", tenant_allowed=lambda t: True)
