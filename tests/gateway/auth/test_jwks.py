"""Signing-key lifecycle: discovery, caching, rotation, outages and forged-kid floods."""

import asyncio
import time

import pytest

from gateway.auth import AuthError, AuthUnavailableError, EntraVerifier
from tests.utils.issuer import CONTOSO, FABRIKAM, NORTHWIND, FaultyIssuer


async def refused(verifier: EntraVerifier, token: str) -> str:
    with pytest.raises(AuthError) as caught:
        await verifier.verify(token)
    return caught.value.code


async def eventually(condition, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_concurrent_requests_for_a_cold_tenant_share_one_fetch(fresh_issuer, make_verifier) -> None:
    verifier = make_verifier(fresh_issuer)
    tokens = [fresh_issuer.mint(CONTOSO, version=version) for version in ("1.0", "2.0") for _ in range(25)]
    principals = await asyncio.gather(*(verifier.verify(token) for token in tokens))
    assert {p.tenant_id for p in principals} == {CONTOSO}
    # One discovery and one JWKS fetch per token version.
    assert fresh_issuer.discovery_requests == fresh_issuer.jwks_requests == verifier.jwks_fetch_count == 2


async def test_keys_are_cached_per_tenant(fresh_issuer, make_verifier) -> None:
    verifier = make_verifier(fresh_issuer)
    for tenant in (CONTOSO, FABRIKAM, CONTOSO, FABRIKAM):
        await verifier.verify(fresh_issuer.mint(tenant))
    assert verifier.jwks_fetches == {CONTOSO: 1, FABRIKAM: 1}
    assert fresh_issuer.jwks_requests_by_tenant == {CONTOSO: 1, FABRIKAM: 1}


async def test_a_rotated_key_is_accepted_after_one_refetch(fresh_issuer, make_verifier) -> None:
    verifier = make_verifier(fresh_issuer)
    old_token = fresh_issuer.mint(CONTOSO)
    await verifier.verify(old_token)
    fresh_issuer.rotate()
    await verifier.verify(fresh_issuer.mint(CONTOSO))
    await verifier.verify(old_token)
    assert verifier.jwks_fetch_count == fresh_issuer.jwks_requests == 2


async def test_a_removed_key_is_refused_once_the_cache_expires(fresh_issuer, make_verifier) -> None:
    verifier = make_verifier(fresh_issuer, jwks_ttl_s=0.3)
    old_kid, old_token = fresh_issuer.signing_kid, fresh_issuer.mint(CONTOSO)
    await verifier.verify(old_token)
    fresh_issuer.rotate()
    new_token = fresh_issuer.mint(CONTOSO)
    await verifier.verify(new_token)
    fresh_issuer.remove_key(old_kid)
    await asyncio.sleep(0.35)
    assert await refused(verifier, old_token) == "unknown_key"
    await verifier.verify(new_token)


async def test_a_flood_of_unknown_kids_causes_at_most_one_fetch_per_window(fresh_issuer, make_verifier) -> None:
    verifier = make_verifier(fresh_issuer)
    await verifier.verify(fresh_issuer.mint(CONTOSO))
    before = (fresh_issuer.jwks_requests_by_tenant[CONTOSO], verifier.jwks_fetches[CONTOSO])

    for _ in range(2):
        tokens = [fresh_issuer.mint(CONTOSO, kid=f"forged-{i}-{time.monotonic_ns()}") for i in range(200)]
        results = await asyncio.gather(*(verifier.verify(t) for t in tokens), return_exceptions=True)
        assert all(isinstance(r, AuthError) and r.code == "unknown_key" for r in results)

    assert fresh_issuer.jwks_requests_by_tenant[CONTOSO] - before[0] == 1
    assert verifier.jwks_fetches[CONTOSO] - before[1] == 1


async def test_a_cold_tenant_flood_fetches_once(fresh_issuer, make_verifier) -> None:
    verifier = make_verifier(fresh_issuer)
    tokens = [fresh_issuer.mint(NORTHWIND, kid=f"forged-{i}") for i in range(200)]
    results = await asyncio.gather(*(verifier.verify(t) for t in tokens), return_exceptions=True)
    assert all(isinstance(r, AuthError) for r in results)
    assert fresh_issuer.jwks_requests == verifier.jwks_fetch_count == 1


async def test_the_unknown_kid_window_reopens(fresh_issuer, make_verifier) -> None:
    verifier = make_verifier(fresh_issuer, unknown_kid_window_s=0.5)
    await verifier.verify(fresh_issuer.mint(CONTOSO))
    for _ in range(3):
        await refused(verifier, fresh_issuer.mint(CONTOSO, kid="forged"))
    assert verifier.jwks_fetch_count == 2
    await asyncio.sleep(0.55)
    await refused(verifier, fresh_issuer.mint(CONTOSO, kid="forged"))
    assert verifier.jwks_fetch_count == fresh_issuer.jwks_requests == 3


async def test_last_good_keys_are_kept_while_the_issuer_is_down(fresh_issuer, make_verifier, caplog) -> None:
    verifier = make_verifier(fresh_issuer, jwks_ttl_s=0.2, http_timeout_s=1.0)
    token = fresh_issuer.mint(CONTOSO)
    await verifier.verify(token)
    fresh_issuer.stop()
    await asyncio.sleep(0.25)

    assert (await verifier.verify(token)).tenant_id == CONTOSO
    assert "jwks fetch failed" in caplog.text  # the refetch was tried
    assert verifier.key_sets_missing() == 0
    assert await refused(verifier, fresh_issuer.mint(CONTOSO, kid="forged")) == "unknown_key"

    with pytest.raises(AuthUnavailableError):
        await verifier.verify(fresh_issuer.mint(FABRIKAM))
    assert verifier.key_sets_missing() == 1


async def test_background_refresh_renews_keys_before_they_expire(fresh_issuer, make_verifier) -> None:
    verifier = make_verifier(fresh_issuer, jwks_ttl_s=0.4)
    assert verifier.key_sets_missing() == 0
    await verifier.start()
    await verifier.start()
    await verifier.verify(fresh_issuer.mint(CONTOSO))
    assert await eventually(lambda: fresh_issuer.jwks_requests >= 3)

    fresh_issuer.rotate()
    new_token = fresh_issuer.mint(CONTOSO)
    assert await eventually(lambda: fresh_issuer.jwks_requests >= 5)
    fetches = verifier.jwks_fetch_count
    await verifier.verify(new_token)
    assert verifier.jwks_fetch_count == fetches  # the new key was already there

    await verifier.aclose()
    stopped_at = fresh_issuer.jwks_requests
    await asyncio.sleep(0.5)
    assert fresh_issuer.jwks_requests == stopped_at


async def _slowest_verify(verifier: EntraVerifier, issuer, seconds: float) -> float:
    """The longest a fresh token (its key known) took to verify, over `seconds` of tries."""
    slowest, deadline = 0.0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        token = issuer.mint(CONTOSO)
        started = time.monotonic()
        await verifier.verify(token)
        slowest = max(slowest, time.monotonic() - started)
        await asyncio.sleep(0.05)
    return slowest


async def test_a_hung_key_endpoint_never_delays_a_request_whose_key_is_known(faulty_issuer: FaultyIssuer,
                                                                             make_verifier, caplog) -> None:
    verifier = make_verifier(faulty_issuer, jwks_ttl_s=1.0, http_timeout_s=1.0)
    await verifier.start()
    await verifier.verify(faulty_issuer.mint(CONTOSO))
    faulty_issuer.hanging.set()
    # The background refresh (at 75% of the TTL) reaches the issuer and hangs there.
    assert await eventually(lambda: faulty_issuer.hung_requests >= 1)
    # While the refresh hangs, past the keys' TTL, and after it timed out: the last good keys serve.
    assert await _slowest_verify(verifier, faulty_issuer, 2.5) < 0.5
    assert "jwks fetch failed" in caplog.text and "reason=TimeoutError" in caplog.text


async def test_a_new_key_is_accepted_promptly_once_a_hung_endpoint_recovers(faulty_issuer: FaultyIssuer,
                                                                           make_verifier) -> None:
    verifier = make_verifier(faulty_issuer, http_timeout_s=0.5, jwks_retry_s=0.2)
    await verifier.start()
    await verifier.verify(faulty_issuer.mint(CONTOSO))
    faulty_issuer.rotate()
    faulty_issuer.hanging.set()
    # Entra rotated while its endpoint hangs: the new kid's refetch times out, the kid is refused.
    assert await refused(verifier, faulty_issuer.mint(CONTOSO)) == "unknown_key"
    assert faulty_issuer.hung_requests == 1
    faulty_issuer.hanging.clear()
    recovered = time.monotonic()
    token = faulty_issuer.mint(CONTOSO)
    while True:
        try:
            await verifier.verify(token)
            break
        except AuthError as exc:
            assert exc.code == "unknown_key"
            assert time.monotonic() - recovered < 3.0, "the new key was still refused 3 s after recovery"
            await asyncio.sleep(0.05)
    assert time.monotonic() - recovered < 1.0
