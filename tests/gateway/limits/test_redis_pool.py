"""The Redis pool makes a healthy Redis look healthy: many concurrent admissions wait their turn
for a connection instead of being refused, a busy pool never opens the breaker for every tenant,
and connections a restarted Redis dropped are reopened instead of failing callers."""

from __future__ import annotations

import asyncio
import time
import uuid

from gateway.limits import QuotaStoreUnavailable
from gateway.limits.redis import RedisLimiter, redis_client
from tests.utils.limits import admission

CONCURRENT_ADMISSIONS = 200  # redis-py's default pool refuses past 100, at once


async def _admit_all(limiter: RedisLimiter, tenant: str, count: int) -> list[str]:
    """The outcome of `count` admissions started together: "ok" or the refusal's class name."""
    async def one() -> str:
        try:
            ticket = await limiter.admit(admission(tenant, rpm=10**6, tpm=10**9, concurrent=10**6))
        except QuotaStoreUnavailable as exc:
            return type(exc).__name__
        await limiter.settle(ticket, 1)
        return "ok"

    return list(await asyncio.gather(*(one() for _ in range(count))))


async def test_two_hundred_concurrent_admissions_are_all_admitted(redis_server) -> None:
    limiter = RedisLimiter(redis_client(redis_server.url, timeout_s=2.0), breaker_s=1.0)
    try:
        outcomes = await _admit_all(limiter, uuid.uuid4().hex, CONCURRENT_ADMISSIONS)
        assert outcomes.count("ok") == CONCURRENT_ADMISSIONS, f"refused: {len(outcomes) - outcomes.count('ok')}"
        assert limiter.ready()
    finally:
        await limiter.aclose()


async def test_a_busy_pool_refuses_its_waiter_only_and_never_opens_the_breaker(redis_server) -> None:
    """A pool of 2 with a 50 ms wait, 40 callers at once: those that cannot get a connection in time
    are refused (fail closed), but the next caller is served, since Redis itself answered throughout."""
    limiter = RedisLimiter(redis_client(redis_server.url, timeout_s=0.05, max_connections=2), breaker_s=30.0)
    try:
        await _admit_all(limiter, uuid.uuid4().hex, 40)
        assert limiter.ready(), "a busy pool opened the breaker: every tenant would be refused for 30 s"
        assert await _admit_all(limiter, uuid.uuid4().hex, 1) == ["ok"]
    finally:
        await limiter.aclose()


async def test_after_a_redis_restart_the_pooled_connections_fail_no_caller(own_redis_server) -> None:
    limiter = RedisLimiter(redis_client(own_redis_server.url, timeout_s=1.0), breaker_s=5.0)
    tenant = uuid.uuid4().hex
    try:
        assert (await _admit_all(limiter, tenant, 20)).count("ok") == 20  # 20 connections in the pool
        own_redis_server.stop()
        own_redis_server.start()  # the same port; every pooled connection is now dead
        await asyncio.sleep(1.1)  # idle past the health check: each is pinged (and reopened) before use
        started = time.monotonic()
        outcomes = await _admit_all(limiter, tenant, 20)
        assert outcomes.count("ok") == 20, f"{20 - outcomes.count('ok')} refused while Redis was answering"
        assert limiter.ready() and time.monotonic() - started < 5
    finally:
        await limiter.aclose()


async def test_the_first_admission_after_redis_answers_again_closes_an_open_breaker(own_redis_server) -> None:
    # Admissions while Redis is down open a 30 s breaker; Redis is back long before it would end.
    limiter = RedisLimiter(redis_client(own_redis_server.url, timeout_s=0.5), breaker_s=30.0)
    tenant = uuid.uuid4().hex
    try:
        own_redis_server.stop()
        assert set(await _admit_all(limiter, tenant, 5)) == {"QuotaStoreUnavailable"}  # fail closed
        assert not limiter.ready()
        own_redis_server.start()
        outcomes = await _admit_all(limiter, tenant, 1) + await _admit_all(limiter, tenant, 20)
        assert outcomes.count("ok") == 21, f"{21 - outcomes.count('ok')} refused while Redis was answering"
        assert limiter.ready()
    finally:
        await limiter.aclose()


async def test_while_the_breaker_is_open_one_admission_at_a_time_asks_redis(own_redis_server) -> None:
    # A hung Redis: an admission that asks waits its whole timeout, so only one may be asking.
    limiter = RedisLimiter(redis_client(own_redis_server.url, timeout_s=0.5), breaker_s=30.0)
    tenant = uuid.uuid4().hex
    try:
        with own_redis_server.hung():
            assert await _admit_all(limiter, tenant, 1) == ["QuotaStoreUnavailable"]  # opens the breaker
            started = time.monotonic()
            done = []

            async def timed() -> None:
                await _admit_all(limiter, tenant, 1)
                done.append(time.monotonic() - started)

            await asyncio.gather(*(timed() for _ in range(10)))
        assert sorted(done)[-1] >= 0.4  # one asked, and waited for its timeout
        assert sorted(done)[-2] < 0.1, sorted(done)  # the other nine were refused at once
    finally:
        await limiter.aclose()
