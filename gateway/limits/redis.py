"""The Redis limiter: the same budgets as the in-process one, shared by every replica.

One Lua script per decision checks and updates all of a request's budgets atomically,
on Redis' clock (so replica clocks do not matter). The keys of one tenant share a hash
tag, `tg:{<tenant digest>}:…`, so the script also runs on Redis Cluster. Connection
settings are bounded (timeouts, no retry loop), and after a failure the limiter stops
asking for `breaker_s`, so an outage costs a request at most one timeout and most
requests none; it recovers on its own when Redis answers again.
"""

from __future__ import annotations

import logging
import time

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.errors import RateLimited
from gateway.limits.base import REFUSED, WINDOW_S, Admission, QuotaStoreUnavailable, Ticket, check_admissible

logger = logging.getLogger("tenantgate.limits")

# KEYS: 4 GCRA budgets (tenant r, tenant t, principal r, principal t), then the in-flight set.
# ARGV: 4 costs in ms (how far the request pushes each TAT), request id, concurrency limit,
#       lease ms. Returns {1} when admitted, {0, wait_ms, index} when refused.
ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = 60000
local tats, worst, worst_wait = {}, 0, 0
for i = 1, 4 do
  local tat = tonumber(redis.call('GET', KEYS[i]) or now)
  if tat < now then tat = now end
  tats[i] = tat + tonumber(ARGV[i])
  local wait = tats[i] - now - window
  if wait > worst_wait then worst, worst_wait = i, wait end
end
if worst > 0 then return {0, math.ceil(worst_wait), worst} end
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
if redis.call('ZCARD', KEYS[5]) >= tonumber(ARGV[6]) then return {0, 1000, 5} end
redis.call('ZADD', KEYS[5], now + tonumber(ARGV[7]), ARGV[5])
redis.call('PEXPIRE', KEYS[5], tonumber(ARGV[7]))
for i = 1, 4 do
  redis.call('SET', KEYS[i], tats[i], 'PX', math.ceil(tats[i] - now) + 1000)
end
return {1}
"""

# KEYS: tenant t, principal t, in-flight set. ARGV: ms to give back to each, request id.
SETTLE = """
for i = 1, 2 do
  local tat = tonumber(redis.call('GET', KEYS[i]))
  local refund = tonumber(ARGV[i])
  if tat and refund > 0 then
    local ttl = redis.call('PTTL', KEYS[i])
    if ttl > 0 then redis.call('SET', KEYS[i], tat - refund, 'PX', ttl) end
  end
end
redis.call('ZREM', KEYS[3], ARGV[3])
return 1
"""


def keys(a: Admission) -> list[str]:
    base = f"tg:{{{a.tenant}}}"
    return [f"{base}:r", f"{base}:t", f"{base}:p:{a.principal}:r", f"{base}:p:{a.principal}:t", f"{base}:c"]


class RedisLimiter:
    def __init__(self, client: aioredis.Redis, *, breaker_s: float = 1.0, lease_s: float = 600.0) -> None:
        self._client = client
        self._admit = client.register_script(ADMIT)
        self._settle = client.register_script(SETTLE)
        self._breaker_s = breaker_s
        self._lease_ms = int(lease_s * 1000)
        self._down_until = 0.0
        self.failures = 0

    def _unavailable(self, exc: BaseException) -> QuotaStoreUnavailable:
        self.failures += 1
        if time.monotonic() >= self._down_until:
            logger.error("quota store unreachable (%s); requests fail closed unless their policy allows fail-open",
                         type(exc).__name__)
        self._down_until = time.monotonic() + self._breaker_s
        return QuotaStoreUnavailable()

    async def admit(self, admission: Admission) -> Ticket:
        check_admissible(admission)
        if time.monotonic() < self._down_until:
            raise QuotaStoreUnavailable()
        a = admission
        minute_ms = WINDOW_S * 1000
        costs = [minute_ms / a.requests_per_minute, a.tokens * minute_ms / a.tokens_per_minute,
                 minute_ms / a.principal_requests_per_minute, a.tokens * minute_ms / a.principal_tokens_per_minute]
        try:
            result = await self._admit(keys=keys(a), args=[*costs, a.request_id, a.concurrent_requests,
                                                           self._lease_ms])
        except (RedisError, OSError) as exc:
            raise self._unavailable(exc) from None
        if int(result[0]) != 1:
            raise RateLimited(REFUSED[int(result[2]) - 1], int(result[1]) / 1000)
        return Ticket(admission)

    async def settle(self, ticket: Ticket, used_tokens: int) -> None:
        if ticket.settled or not ticket.accounted:
            return
        ticket.settled = True
        a = ticket.admission
        unused = max(0, a.tokens - used_tokens)
        minute_ms = WINDOW_S * 1000
        refunds = [unused * minute_ms / a.tokens_per_minute, unused * minute_ms / a.principal_tokens_per_minute]
        k = keys(a)
        try:
            await self._settle(keys=[k[1], k[3], k[4]], args=[*refunds, a.request_id])
        except (RedisError, OSError) as exc:
            # The reservation stays spent and the lease expires on its own: conservative, never generous.
            self._unavailable(exc)

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
        await self._client.aclose()


def redis_client(url: str, *, timeout_s: float, entra: bool = False, entra_scope: str = "https://redis.azure.com/.default"
                 ) -> aioredis.Redis:
    """A client with bounded timeouts and no retry loop. Password and TLS come from the URL
    (`rediss://:password@host:port`); with entra, the password is an Entra ID token from
    azure-identity (managed identity, workload identity or the developer's login)."""
    options = dict(socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry_on_timeout=False,
                   retry=Retry(NoBackoff(), 0), health_check_interval=30)
    if entra:
        from redis_entraid.cred_provider import create_from_default_azure_credential

        options["credential_provider"] = create_from_default_azure_credential((entra_scope,))
    return aioredis.Redis.from_url(url, **options)
