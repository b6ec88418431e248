"""A verified token is remembered only while everything it was verified against still holds."""

from __future__ import annotations

import asyncio

import pytest

from gateway.auth.exceptions import AuthError
from tests.utils.issuer import CONTOSO


async def _code(verifier, token: str) -> str:
    with pytest.raises(AuthError) as caught:
        await verifier.verify(token)
    return caught.value.code


async def test_a_repeated_token_is_verified_once(issuer, make_verifier, monkeypatch) -> None:
    verifier = make_verifier(issuer)
    calls = []
    real = verifier._verify

    async def counting(token: str):
        calls.append(token)
        return await real(token)

    monkeypatch.setattr(verifier, "_verify", counting)
    token = issuer.mint(CONTOSO)
    first, second = await verifier.verify(token), await verifier.verify(token)
    assert first == second and len(calls) == 1


async def test_a_cached_token_is_refused_once_it_expires(issuer, make_verifier) -> None:
    verifier = make_verifier(issuer, leeway_s=0)
    token = issuer.mint(CONTOSO, lifetime_s=1)
    await verifier.verify(token)
    await asyncio.sleep(1.6)
    assert await _code(verifier, token) == "token_expired"


async def test_a_cached_token_is_refused_once_its_tenant_is_no_longer_allowed(issuer, make_verifier) -> None:
    allowed = {CONTOSO}
    verifier = make_verifier(issuer, tenant_allowed=lambda tid: tid in allowed)
    token = issuer.mint(CONTOSO)
    await verifier.verify(token)
    allowed.clear()
    assert await _code(verifier, token) == "tenant_not_allowed"
