"""The bad-token corpus over real HTTP: every case is a 401 with a challenge, never a 5xx,
and nothing of the token comes back in the body."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from tests.gateway.api.conftest import ALPHA, AUDIENCE, GAMMA, UNREGISTERED
from tests.utils.bad_tokens import CASE_IDS, bad_token_cases

BODY = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
# The one answer for every refused token, whatever the reason.
REFUSED = {"error": {"message": "the access token is invalid or is not accepted by this service",
                     "type": "invalid_request_error", "param": None, "code": "invalid_token"}}
CHALLENGE = ('Bearer realm="tenantgate", error="invalid_token", '
             'error_description="the access token is invalid or is not accepted by this service"')


def _post(gateway, token: str) -> httpx.Response:
    # h11 refuses trailing whitespace in a header, so the empty token is sent as a bare "Bearer".
    return httpx.post(gateway.base_url + "/v1/chat/completions", json=BODY, timeout=30,
                      headers={"Authorization": f"Bearer {token}".strip().encode()})


@pytest.fixture(scope="module")
def corpus(gateway) -> dict[str, str]:
    cases = bad_token_cases(gateway.issuer, ALPHA, AUDIENCE, other_tenant_id=GAMMA, disallowed_tenant_id=UNREGISTERED)
    return dict(cases)


def test_corpus_has_at_least_30_cases() -> None:
    assert len(CASE_IDS) >= 30


@pytest.mark.parametrize("case", CASE_IDS)
def test_bad_token_is_401(gateway, corpus, case: str) -> None:
    token = corpus[case]
    response = _post(gateway, token)
    assert response.status_code == 401, (case, response.status_code, response.text)
    assert response.headers["www-authenticate"].startswith("Bearer")
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    if token:  # a token was presented: the answer says nothing of why it was refused
        assert response.json() == REFUSED, (case, response.text)
        assert response.headers["www-authenticate"] == CHALLENGE
    if len(token) > 16:
        assert token[-16:] not in response.text and token[:32] not in response.text


def test_an_unknown_tenant_gets_the_same_answer_as_a_bad_signature(gateway, corpus, caplog) -> None:
    """Else anyone could test whether a tenant is a customer. The reason is kept where operators
    look: the log and tenantgate_auth_failures_total{code}."""
    registry = gateway.state.metrics.registry

    def failures(code: str) -> float:
        return registry.get_sample_value("tenantgate_auth_failures_total", {"code": code}) or 0.0

    before = failures("tenant_not_allowed"), failures("invalid_signature")
    with caplog.at_level(logging.INFO, logger="tenantgate.auth"):
        unknown, forged = _post(gateway, corpus["tid-not-allowed"]), _post(gateway, corpus["tampered-payload"])
    assert unknown.status_code == forged.status_code == 401
    assert unknown.headers["www-authenticate"] == forged.headers["www-authenticate"]
    assert unknown.json() == forged.json() == REFUSED
    assert (failures("tenant_not_allowed"), failures("invalid_signature")) == (before[0] + 1, before[1] + 1)
    assert "code=tenant_not_allowed" in caplog.text and "code=invalid_signature" in caplog.text


def test_unknown_kid_flood_fetches_keys_at_most_once_per_window(gateway) -> None:
    """200 concurrent tokens with unknown kids for one tenant: every one a 401, at most one refetch."""
    state = gateway.state
    before = state.verifier.jwks_fetches[GAMMA] if hasattr(state.verifier, "jwks_fetches") else None
    # Make sure the tenant's keys are cached, so only unknown-kid refetches remain.
    warm = httpx.get(gateway.base_url + "/v1/models", headers={"Authorization": f"Bearer {gateway.token(GAMMA)}"})
    assert warm.status_code == 200
    fetched = state.verifier.jwks_fetch_count

    async def flood() -> list[int]:
        async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as client:
            tokens = [gateway.issuer.mint(GAMMA, audience=AUDIENCE, kid=f"unknown-{i}") for i in range(200)]
            responses = await asyncio.gather(*(client.get("/v1/models", headers={"Authorization": f"Bearer {t}"})
                                               for t in tokens))
            return [r.status_code for r in responses]

    statuses = asyncio.run(flood())
    assert statuses == [401] * 200
    assert state.verifier.jwks_fetch_count - fetched <= 1
    if before is not None:
        assert state.verifier.jwks_fetches[GAMMA] - before <= 2  # the warm-up fetch plus at most one refetch
