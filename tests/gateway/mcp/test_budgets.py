"""A tool's budget on both of the gateway's limiters: the calls per minute the decision names and
the calls in flight, each tool of each tenant under a key of its own."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from gateway.audit import AuditRecorder
from gateway.auth.principal import Principal
from gateway.limits import InProcessLimiter
from gateway.limits.redis import RedisLimiter, redis_client
from gateway.mcp.exceptions import RATE_LIMITED, JsonRpcError
from gateway.mcp.service import McpMetrics, McpService
from gateway.policy.schema import ToolBudget, ToolsDecision, ToolsLogging

ALICE = Principal(tenant_id="aaaaaaaa-0000-4000-8000-00000000000a", object_id="00000000-0000-4000-8000-000000000001",
                  app_id="00000000-0000-4000-8000-000000000002", scopes=("Tools.Invoke",), roles=(), idtyp="user",
                  token_version="2.0")
OTHER_TENANT = Principal(tenant_id="bbbbbbbb-0000-4000-8000-00000000000b", object_id=ALICE.object_id,
                         app_id=ALICE.app_id, scopes=ALICE.scopes, roles=(), idtyp="user", token_version="2.0")


def _decision(calls_per_minute: int, concurrency: int) -> ToolsDecision:
    return ToolsDecision(allow=True, reasons=[], listed=[], logging=ToolsLogging(content="none", redact=[]),
                         tool=ToolBudget(calls_per_minute=calls_per_minute, concurrency=concurrency,
                                         max_result_bytes=1024, cache=False))


def _service(limiter) -> McpService:
    return McpService({}, policy=None, limiter=limiter, audit=AuditRecorder(None, b"k" * 32),  # type: ignore[arg-type]
                      metrics=McpMetrics(CollectorRegistry()))


async def _exercise(limiter) -> None:
    service = _service(limiter)
    per_minute = _decision(calls_per_minute=2, concurrency=8)
    for _ in range(2):
        await limiter.settle(await service._admit(ALICE, "devtools", "echo", per_minute), 0)
    with pytest.raises(JsonRpcError) as spent:
        await service._admit(ALICE, "devtools", "echo", per_minute)
    assert spent.value.code == RATE_LIMITED and spent.value.status == 429
    assert int(spent.value.headers["Retry-After"]) >= 1
    # Another tool, and the same tool for another tenant, have budgets of their own.
    await limiter.settle(await service._admit(ALICE, "devtools", "word_count", per_minute), 0)
    await limiter.settle(await service._admit(OTHER_TENANT, "devtools", "echo", per_minute), 0)

    one_at_a_time = _decision(calls_per_minute=100, concurrency=1)
    held = await service._admit(ALICE, "devtools", "slow", one_at_a_time)
    with pytest.raises(JsonRpcError) as busy:
        await service._admit(ALICE, "devtools", "slow", one_at_a_time)
    assert busy.value.status == 429
    await limiter.settle(held, 0)
    await limiter.settle(await service._admit(ALICE, "devtools", "slow", one_at_a_time), 0)

    with pytest.raises(JsonRpcError):  # a budget of 0 admits nothing
        await service._admit(ALICE, "devtools", "off", _decision(calls_per_minute=0, concurrency=4))


def test_a_tools_budget_in_process() -> None:
    asyncio.run(_exercise(InProcessLimiter()))


def test_a_tools_budget_in_redis(redis_server) -> None:
    async def run() -> None:
        limiter = RedisLimiter(redis_client(redis_server.url, timeout_s=1.0))
        try:
            await _exercise(limiter)
        finally:
            await limiter.aclose()

    asyncio.run(run())
