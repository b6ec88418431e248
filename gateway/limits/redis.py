"""The Redis limiter: the same budgets as the in-process one, shared by every replica.

One Lua script per decision checks and updates all of a request's budgets atomically,
on Redis' clock (so replica clocks do not matter). The keys of one tenant share a hash
tag, `tg:{<tenant digest>}:…`, so the script also runs on Redis Cluster. Connection
settings are bounded (timeouts, no retry loop, a sized pool whose callers wait a bounded
time for a connection), and after a failure the limiter stops asking for `breaker_s`, so an
outage costs a request at most one timeout and most requests none. While the breaker is open,
one admission at a time still asks (half open): the first that Redis answers closes it, so no
request is refused for longer than it takes Redis to answer once it is back. A pool that stays
busy for a caller's whole wait refuses that caller only: it is this replica's load, not evidence
that Redis is down.

A request in flight holds a lease in its tenant's set, `lease_s` long, that this replica
renews while the request runs, so the slot of a replica that died frees itself quickly.
What must reach Redis after a request has its answer (the settle, or the release of an
admission whose caller saw it fail) is retried in the background until Redis answers:
both are idempotent, and a release leaves a short tombstone so that an admission still
queued in a hung Redis takes nothing when it finally runs.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import weakref
from collections import defaultdict
from functools import partial
from typing import TYPE_CHECKING

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError, RedisError

from gateway.background import cancel_and_wait
from gateway.errors import RateLimited
from gateway.limits.base import (
    KINDS,
    REFUSED,
    WINDOW_S,
    Admission,
    QuotaStoreUnavailable,
    Ticket,
    check_admissible,
    rate_limit_headers,
)

logger = logging.getLogger("tenantgate.limits")

# KEYS: 4 GCRA budgets (tenant r, tenant t, principal r, principal t), the in-flight set, the
#       request's tombstone. ARGV: 4 costs in ms (how far the request pushes each TAT), request id,
#       concurrency limit, lease ms. Returns {1, 4 TATs after it} when admitted, {0, wait_ms, index,
#       4 TATs as they stay} when refused, each TAT in µs from now (integers, so no token is lost
#       to rounding: they make the x-ratelimit-* headers), {0, 0, 0} when the request was released
#       before this ran.
ADMIT = """
if redis.call('EXISTS', KEYS[6]) == 1 then return {0, 0, 0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = 60000
local olds, tats, worst, worst_wait = {}, {}, 0, 0
for i = 1, 4 do
  local tat = tonumber(redis.call('GET', KEYS[i]) or now)
  if tat < now then tat = now end
  olds[i] = math.floor((tat - now) * 1000)
  tats[i] = tat + tonumber(ARGV[i])
  local wait = tats[i] - now - window
  if wait > worst_wait then worst, worst_wait = i, wait end
end
if worst > 0 then return {0, math.ceil(worst_wait), worst, olds[1], olds[2], olds[3], olds[4]} end
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
if redis.call('ZCARD', KEYS[5]) >= tonumber(ARGV[6]) then
  return {0, 1000, 5, olds[1], olds[2], olds[3], olds[4]}
end
redis.call('ZADD', KEYS[5], now + tonumber(ARGV[7]), ARGV[5])
redis.call('PEXPIRE', KEYS[5], tonumber(ARGV[7]))
for i = 1, 4 do
  redis.call('SET', KEYS[i], tats[i], 'PX', math.ceil(tats[i] - now) + 1000)
end
local us = {}
for i = 1, 4 do us[i] = math.floor((tats[i] - now) * 1000) end
return {1, us[1], us[2], us[3], us[4]}
"""

# KEYS: tenant t, principal t, in-flight set. ARGV: ms to give back to each, request id.
# The refund goes with the lease, so a settle that is repeated (its first answer lost) refunds once.
SETTLE = """
if redis.call('ZREM', KEYS[3], ARGV[3]) == 0 then return 0 end
for i = 1, 2 do
  local tat = tonumber(redis.call('GET', KEYS[i]))
  local refund = tonumber(ARGV[i])
  if tat and refund > 0 then
    local ttl = redis.call('PTTL', KEYS[i])
    if ttl > 0 then redis.call('SET', KEYS[i], tat - refund, 'PX', ttl) end
  end
end
return 1
"""

# KEYS: in-flight set, the request's tombstone. ARGV: request id, tombstone ms.
# For an admission whose caller saw it fail: whether it ran or is still queued, it holds no lease.
# Its budgets stay spent if it did run (conservative).
RELEASE = """
redis.call('SET', KEYS[2], 1, 'PX', tonumber(ARGV[2]))
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
"""

# KEYS: the in-flight set. ARGV: lease ms, then the request ids whose leases this replica renews.
# XX: a lease that was released or has expired is never brought back.
RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], lease)
return 1
"""


def keys(a: Admission) -> list[str]:
    base = f"tg:{{{a.tenant}}}"
    return [f"{base}:r", f"{base}:t", f"{base}:p:{a.principal}:r", f"{base}:p:{a.principal}:t", f"{base}:c"]


def tombstone_key(a: Admission) -> str:
    return f"tg:{{{a.tenant}}}:x:{a.request_id}"


class RedisLimiter:
    def __init__(self, client: aioredis.Redis, *, breaker_s: float = 1.0, lease_s: float = 30.0,
                 retry_base_s: float = 0.05, retry_cap_s: float = 2.0) -> None:
        self._client = client
        self._admit = client.register_script(ADMIT)
        self._settle = client.register_script(SETTLE)
        self._release = client.register_script(RELEASE)
        self._renew = client.register_script(RENEW)
        self._breaker_s = breaker_s
        self._lease_s = lease_s
        self._lease_ms = int(lease_s * 1000)
        self._retry_base_s, self._retry_cap_s = retry_base_s, retry_cap_s
        self._down_until = 0.0
        self._probing = False  # an admission is asking Redis while the breaker is open
        # Tickets in flight, by request id. Weak: a ticket dropped without a settle stops being
        # renewed, and its lease runs out instead of living as long as the process.
        self._live: weakref.WeakValueDictionary[str, Ticket] = weakref.WeakValueDictionary()
        self._renewer: asyncio.Task | None = None
        self._retrying: set[asyncio.Task] = set()
        self.failures = 0
        self.abandoned = 0  # settles and releases given up on (the lease then expires on its own)

    def _unavailable(self, exc: BaseException) -> QuotaStoreUnavailable:
        self.failures += 1
        if isinstance(exc, PoolExhausted):  # this replica's own load, not Redis: the breaker stays shut
            logger.warning("quota store pool exhausted: a request waited its whole timeout for a connection")
            return QuotaStoreUnavailable()
        if time.monotonic() >= self._down_until:
            logger.error("quota store unreachable (%s); requests fail closed unless their policy allows fail-open",
                         type(exc).__name__)
        self._down_until = time.monotonic() + self._breaker_s
        return QuotaStoreUnavailable()

    async def admit(self, admission: Admission) -> Ticket:
        check_admissible(admission)
        if time.monotonic() < self._down_until:
            if self._probing:  # another admission is finding out: this one is refused at once
                raise QuotaStoreUnavailable()
            self._probing = True
            try:
                ticket = await self._admit_now(admission)
            except RateLimited:
                self._down_until = 0.0  # Redis answered, with a refusal of the budget's own
                raise
            finally:
                self._probing = False
            self._down_until = 0.0  # Redis answered: the breaker closes
            return ticket
        return await self._admit_now(admission)

    async def _admit_now(self, admission: Admission) -> Ticket:
        a = admission
        minute_ms = WINDOW_S * 1000
        costs = [minute_ms / a.requests_per_minute, a.tokens * minute_ms / a.tokens_per_minute,
                 minute_ms / a.principal_requests_per_minute, a.tokens * minute_ms / a.principal_tokens_per_minute]
        try:
            result = await self._admit(keys=[*keys(a), tombstone_key(a)],
                                       args=[*costs, a.request_id, a.concurrent_requests, self._lease_ms])
        except PoolExhausted as exc:  # no command was sent: nothing to release
            raise self._unavailable(exc) from None
        except (RedisError, OSError) as exc:
            # The script may have run, or may still run when a hung Redis wakes: the caller is
            # refused either way, so the admission must not keep a lease.
            self._retry(self._release_call(a))
            raise self._unavailable(exc) from None
        except asyncio.CancelledError:  # the caller went away mid-call: no ticket will ever settle it
            self._retry(self._release_call(a))
            raise
        if int(result[0]) != 1:
            if int(result[2]) == 0:
                raise QuotaStoreUnavailable()  # released before it ran (no caller waits for this answer)
            refused = int(result[2]) - 1
            raise RateLimited(REFUSED[refused], int(result[1]) / 1000, kind=KINDS[refused],
                              headers=_headers(a, result[3:]))
        ticket = Ticket(admission, headers_from=partial(_headers, a, result[1:]))
        self._live[a.request_id] = ticket
        if self._renewer is None:
            self._renewer = asyncio.create_task(self._renew_leases(), name="tenantgate-lease-renewer")
        return ticket

    async def settle(self, ticket: Ticket, used_tokens: int) -> None:
        if self.settle_at_once(ticket, used_tokens):
            return
        ticket.settled = True
        a = ticket.admission
        self._live.pop(a.request_id, None)
        unused = max(0, a.tokens - used_tokens)
        minute_ms = WINDOW_S * 1000
        refunds = [unused * minute_ms / a.tokens_per_minute, unused * minute_ms / a.principal_tokens_per_minute]
        k = keys(a)

        def call():
            return self._settle(keys=[k[1], k[3], k[4]], args=[*refunds, a.request_id])

        try:
            await call()
        except (RedisError, OSError) as exc:
            self._unavailable(exc)
            self._retry(call)

    def settle_at_once(self, ticket: Ticket, used_tokens: int) -> bool:
        return ticket.settled or not ticket.accounted  # anything else is a call to the store

    def _release_call(self, a: Admission):
        return lambda: self._release(keys=[keys(a)[4], tombstone_key(a)], args=[a.request_id, self._lease_ms])

    def _retry(self, call) -> None:
        task = asyncio.get_running_loop().create_task(self._until_answered(call))
        self._retrying.add(task)
        task.add_done_callback(self._retrying.discard)

    async def _until_answered(self, call) -> None:
        """Repeats an idempotent write, with jittered exponential backoff, until Redis answers or
        it no longer matters: after lease_s + a minute the lease has expired and the budgets refilled."""
        deadline = time.monotonic() + self._lease_s + WINDOW_S
        delay = self._retry_base_s
        while time.monotonic() + delay < deadline:
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, self._retry_cap_s)
            try:
                await call()
            except (RedisError, OSError):
                continue
            self._down_until = 0.0  # Redis answers again
            return
        self.abandoned += 1
        logger.warning("gave up writing a settle or release to the quota store; its lease expires on its own")

    async def _renew_leases(self) -> None:
        """Every third of a lease, pushes the leases of this replica's requests in flight forward."""
        while True:
            await asyncio.sleep(self._lease_s / 3)
            by_set: dict[str, list[str]] = defaultdict(list)
            for request_id, ticket in list(self._live.items()):
                by_set[keys(ticket.admission)[4]].append(request_id)
            for in_flight, request_ids in by_set.items():
                try:
                    await self._renew(keys=[in_flight], args=[self._lease_ms, *request_ids])
                except (RedisError, OSError) as exc:
                    self._unavailable(exc)
                    break  # the next round tries again; a lease survives two missed rounds

    def ready(self) -> bool:
        return time.monotonic() >= self._down_until

    async def ping(self) -> bool:
        try:
            await self._client.ping()
        except (RedisError, OSError) as exc:
            self._unavailable(exc)
            return False
        self._down_until = 0.0
        return True

    async def aclose(self) -> None:
        await cancel_and_wait(self._renewer, *self._retrying)
        self._renewer = None
        await self._client.aclose()


def _headers(a: Admission, tats_us) -> dict[str, str]:
    return rate_limit_headers(a, 0.0, [int(t) / 1e6 for t in tats_us])


class PoolExhausted(MaxConnectionsError):
    """Every pooled connection stayed busy for the pool's whole wait: this replica's own load,
    not evidence that Redis is down."""


if TYPE_CHECKING:  # a mixin of redis-py's connection classes (BoundedPool below)
    _Connection = aioredis.connection.AbstractConnection
else:
    _Connection = object


class _ReconnectingHealthCheck(_Connection):
    """A connection whose health check (a PING before a command, once it was idle) reconnects and
    pings once more when the first PING fails: PING is idempotent, and a connection that a
    restarted Redis dropped should cost its caller a reconnect, not a refusal. A second failure
    is real evidence, and the command's caller sees it."""

    async def check_health(self) -> None:
        if not self.health_check_interval or asyncio.get_running_loop().time() <= self.next_health_check:
            return
        try:
            await self._send_ping()
        except (RedisConnectionError, OSError) as exc:
            await self._ping_failed(exc, 1)  # redis-py's own way out: the dead socket is closed
            await self.connect()
            await self._send_ping()


class BoundedPool(aioredis.BlockingConnectionPool):
    """A sized pool whose callers wait (at most `timeout`) for a connection, first come first
    served, instead of failing at once as redis-py's default pool does past 100 connections."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        base = self.connection_class  # Connection, or SSLConnection for rediss://
        self.connection_class = type(f"Reconnecting{base.__name__}", (_ReconnectingHealthCheck, base), {})

    async def get_connection(self, *args, **kwargs):
        try:
            return await super().get_connection(*args, **kwargs)
        except RedisConnectionError as exc:
            if isinstance(exc.__cause__, asyncio.TimeoutError):
                raise PoolExhausted("no pooled connection to the quota store came free in time") from None
            raise


def redis_client(url: str, *, timeout_s: float, entra: bool = False,
                 entra_scope: str = "https://redis.azure.com/.default", max_connections: int = 256,
                 pool_timeout_s: float | None = None) -> aioredis.Redis:
    """A client with bounded timeouts and no retry loop, on a sized pool whose callers wait at
    most pool_timeout_s (default: timeout_s) for a connection. Password and TLS come from the URL
    (`rediss://:password@host:port`); with entra, the password is an Entra ID token from
    azure-identity (managed identity, workload identity or the developer's login). A pooled
    connection idle for a second is pinged before it is used, so one that a restarted Redis
    dropped is reopened instead of failing a caller's command."""
    options = dict(socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry_on_timeout=False,
                   retry=Retry(NoBackoff(), 0), health_check_interval=1, max_connections=max_connections,
                   timeout=timeout_s if pool_timeout_s is None else pool_timeout_s)
    if entra:
        from redis_entraid.cred_provider import create_from_default_azure_credential

        options["credential_provider"] = create_from_default_azure_credential((entra_scope,))
    return aioredis.Redis.from_pool(BoundedPool.from_url(url, **options))  # from_pool: aclose closes the pool too
