"""Concurrency leases in Redis survive what a real Redis does: a crash and restart from its
append-only file, connections it drops, a hang that queues commands. A slot is held while its
request runs and freed when the request ends, never held on for a request that is over."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid

import pytest
import redis

from devkit.redis import RedisServer
from gateway.errors import RateLimited
from gateway.limits import QuotaStoreUnavailable
from gateway.limits.redis import RedisLimiter, keys, redis_client
from tests.utils.limits import admission

CONCURRENT = 8


def _limiter(server: RedisServer, **options) -> RedisLimiter:
    return RedisLimiter(redis_client(server.url, timeout_s=0.25), breaker_s=0.2, **options)


async def _admit_within(limiter: RedisLimiter, make, seconds: float):
    """The first ticket the limiter grants within `seconds` (None if none), and the last refusal."""
    deadline, refusal = time.monotonic() + seconds, None
    while time.monotonic() < deadline:
        try:
            return await limiter.admit(make()), refusal
        except (RateLimited, QuotaStoreUnavailable) as exc:
            refusal = exc
            await asyncio.sleep(0.1)
    return None, refusal


@pytest.fixture
def persistent_redis_server(redis_binary, tmp_path):
    server = RedisServer(redis_binary, tmp_path, appendonly=True).start()
    yield server
    server.stop()


async def test_requests_settled_while_redis_was_down_free_their_slots_after_a_restart(persistent_redis_server) -> None:
    server, tenant = persistent_redis_server, uuid.uuid4().hex
    limiter = _limiter(server)
    try:
        in_flight = [await limiter.admit(admission(tenant, concurrent=CONCURRENT)) for _ in range(CONCURRENT)]
        server.kill()  # SIGKILL: the leases are in the append-only file
        for ticket in in_flight:  # the requests end while Redis is down
            await limiter.settle(ticket, 5)
        server.start()
        restored = redis.Redis.from_url(server.url)
        assert restored.exists(keys(in_flight[0].admission)[0]), "Redis came back empty: the test proves nothing"
        restored.close()

        started = time.monotonic()
        again = []
        for _ in range(CONCURRENT):  # the tenant has all its slots back, well before any lease could expire
            ticket, refusal = await _admit_within(limiter, lambda: admission(tenant, concurrent=CONCURRENT), 10)
            assert ticket is not None, f"still refused: {refusal}"
            again.append(ticket)
        assert time.monotonic() - started < 10
    finally:
        await limiter.aclose()


@pytest.fixture
async def own_limiter(own_redis_server):
    limiter = _limiter(own_redis_server)
    yield limiter
    await limiter.aclose()


@pytest.fixture
def admin(own_redis_server):
    client = redis.Redis.from_url(own_redis_server.url)
    yield client
    client.close()


async def test_a_settle_on_a_connection_redis_dropped_still_frees_the_slot(own_limiter, admin) -> None:
    tenant = uuid.uuid4().hex
    ticket = await own_limiter.admit(admission(tenant, concurrent=1))
    # The server closes the pooled connection (a restart, a failover, an idle timeout would too).
    assert admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes") >= 1
    await own_limiter.settle(ticket, 5)
    following, refusal = await _admit_within(own_limiter, lambda: admission(tenant, concurrent=1), 5)
    assert following is not None, f"the slot stayed taken: {refusal}"


async def test_an_admission_refused_during_a_hang_takes_no_slot_when_redis_wakes(own_redis_server, own_limiter,
                                                                               admin) -> None:
    tenant = uuid.uuid4().hex
    await own_limiter.settle(await own_limiter.admit(admission(tenant, concurrent=1)), 5)  # the scripts are loaded
    refused = admission(tenant, concurrent=1)
    with own_redis_server.hung():
        with pytest.raises(QuotaStoreUnavailable):  # the caller is refused after the timeout ...
            await own_limiter.admit(refused)
        await asyncio.sleep(0.3)
    assert admin.ping()  # ... and Redis has run what was queued, that admission included

    following, refusal = await _admit_within(own_limiter, lambda: admission(tenant, concurrent=1), 5)
    assert following is not None, f"the refused request holds the slot: {refusal}"
    assert admin.zrange(keys(refused)[4], 0, -1) == [following.admission.request_id.encode()]


async def test_running_requests_keep_their_leases_and_abandoned_ones_expire(redis_server) -> None:
    tenant = uuid.uuid4().hex
    limiter = RedisLimiter(redis_client(redis_server.url, timeout_s=1.0), lease_s=1.5)
    try:
        running = await limiter.admit(admission(tenant, concurrent=2))
        abandoned = await limiter.admit(admission(tenant, concurrent=2))
        del abandoned  # dropped without a settle (a bug, or a replica that died)
        gc.collect()
        await asyncio.sleep(3.2)  # more than two leases

        replacement = await limiter.admit(admission(tenant, concurrent=2))  # the abandoned slot expired
        with pytest.raises(RateLimited) as caught:  # the running request still holds its own
            await limiter.admit(admission(tenant, concurrent=2))
        assert "concurrent" in caught.value.message

        await limiter.settle(running, 5)
        await limiter.settle(replacement, 5)
        assert (await limiter.admit(admission(tenant, concurrent=2))).accounted
    finally:
        await limiter.aclose()
