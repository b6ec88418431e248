"""The in-process and the Redis limiter keep the same budgets (the Redis one against a real redis-server)."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from gateway.errors import RateLimited
from gateway.limits import Admission, InProcessLimiter
from gateway.limits.redis import RedisLimiter, redis_client
from tests.utils.limits import admission


@pytest.fixture(params=["memory", "redis"])
async def limiter(request):
    if request.param == "memory":
        yield InProcessLimiter()
        return
    server = request.getfixturevalue("redis_server")
    limiter = RedisLimiter(redis_client(server.url, timeout_s=1.0))
    yield limiter
    await limiter.aclose()


@pytest.fixture
def tenant() -> str:
    return uuid.uuid4().hex  # keys of their own in the shared redis-server


async def _admitted(limiter, make, n: int) -> tuple[int, RateLimited | None]:
    for i in range(n):
        try:
            ticket = await limiter.admit(make())
        except RateLimited as exc:
            return i, exc
        await limiter.settle(ticket, ticket.admission.tokens)
    return n, None


async def test_requests_per_minute_admits_the_minutes_budget_then_refuses(limiter, tenant) -> None:
    count, refusal = await _admitted(limiter, lambda: admission(tenant, rpm=5), 10)
    assert count == 5
    assert "requests-per-minute" in refusal.message and 1 <= refusal.retry_after_s <= 12
    assert refusal.type == "requests"  # OpenAI's error type: the kind of budget


async def test_tokens_per_minute_counts_the_reservation(limiter, tenant) -> None:
    count, refusal = await _admitted(limiter, lambda: admission(tenant, tokens=300, tpm=1000), 10)
    assert count == 3 and "tenant's tokens-per-minute" in refusal.message and refusal.type == "tokens"


async def test_unused_tokens_are_returned_at_settle(limiter, tenant) -> None:
    for _ in range(10):  # each reserves 300 of 1,000 but uses 50
        ticket = await limiter.admit(admission(tenant, tokens=300, tpm=1000))
        await limiter.settle(ticket, 50)
    with pytest.raises(RateLimited):
        for _ in range(10):
            await limiter.admit(admission(tenant, tokens=300, tpm=1000))


async def test_a_principal_budget_binds_before_the_tenants(limiter, tenant) -> None:
    count, refusal = await _admitted(limiter, lambda: admission(tenant, "alice", rpm=100, prpm=2), 5)
    assert count == 2 and "caller's requests-per-minute" in refusal.message
    other = await limiter.admit(admission(tenant, "bob", rpm=100, prpm=2))  # another principal still passes
    assert other.accounted


async def test_concurrent_requests_are_capped_until_settled(limiter, tenant) -> None:
    first = await limiter.admit(admission(tenant, concurrent=2))
    await limiter.admit(admission(tenant, concurrent=2))
    with pytest.raises(RateLimited) as caught:
        await limiter.admit(admission(tenant, concurrent=2))
    assert "concurrent" in caught.value.message
    await limiter.settle(first, 10)
    await limiter.admit(admission(tenant, concurrent=2))


async def test_tenants_do_not_share_budgets(limiter, tenant) -> None:
    await _admitted(limiter, lambda: admission(tenant, rpm=1), 3)
    assert (await limiter.admit(admission(tenant + "-other", rpm=1))).accounted


@pytest.mark.parametrize("field", ["rpm", "tpm", "prpm", "ptpm", "concurrent"])
async def test_a_zero_limit_admits_nothing(limiter, tenant, field) -> None:
    with pytest.raises(RateLimited) as caught:
        await limiter.admit(admission(tenant, **{field: 0}) if field not in ("prpm", "ptpm")
                            else _zero_principal(tenant, field))
    assert "allows no requests" in caught.value.message


def _zero_principal(tenant: str, field: str) -> Admission:
    a = admission(tenant)
    values = {f: getattr(a, f) for f in a.__dataclass_fields__}
    values["principal_requests_per_minute" if field == "prpm" else "principal_tokens_per_minute"] = 0
    return Admission(**values)


async def test_a_reservation_larger_than_the_budget_is_refused_for_good(limiter, tenant) -> None:
    """No wait lets it through: the answer says not to retry (the openai SDK obeys x-should-retry)
    and has no Retry-After; an embeddings call, which has no max_tokens, is told to send less input."""
    with pytest.raises(RateLimited) as caught:
        await limiter.admit(admission(tenant, tokens=5000, tpm=1000))
    refusal = caught.value
    assert "can never be admitted" in refusal.message and "lower max_tokens" in refusal.message
    assert refusal.headers == {"x-should-retry": "false"} and refusal.type == "tokens"
    with pytest.raises(RateLimited) as caught:
        await limiter.admit(dataclasses.replace(admission(tenant, tokens=5000, tpm=1000), embeds=True))
    assert "max_tokens" not in caught.value.message and "send less input" in caught.value.message


async def test_redis_keys_share_one_hash_tag(redis_server, tenant) -> None:
    from gateway.limits.redis import keys

    tags = {key.split("{")[1].split("}")[0] for key in keys(admission(tenant))}
    assert tags == {tenant}
