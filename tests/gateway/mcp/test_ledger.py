"""Recorded digests in Redis: a replica (or a restart) that first lists a server after it changed a
tool finds the digest the first replica recorded, so the changed tool stays withheld there too."""

from __future__ import annotations

import asyncio

import pytest

from devkit.mcp_server import serving_example
from gateway.limits.redis import redis_client
from gateway.mcp.catalogue import LEDGER_KEY, Catalogue, MemoryLedger, RedisLedger
from gateway.mcp.config import McpServer
from gateway.mcp.exceptions import JsonRpcError
from gateway.mcp.upstream import Upstream


async def _tools(url: str, ledger, records: list) -> dict:
    upstream = Upstream(McpServer(name="ledger-test", url=url))
    try:
        return await Catalogue(upstream, records.append, ttl_s=0, ledger=ledger).tools()
    finally:
        await upstream.aclose()


def test_a_replica_that_starts_after_a_change_finds_the_first_record(redis_server) -> None:
    async def run(url: str, change) -> tuple[dict, dict, list]:
        client = redis_client(redis_server.url, timeout_s=1.0)
        try:
            await client.delete(LEDGER_KEY + "ledger-test")
            first_replica = await _tools(url, RedisLedger(client), [])
            change()
            records: list = []
            second_replica = await _tools(url, RedisLedger(client), records)  # never saw the first definition
            return first_replica, second_replica, records
        finally:
            await client.aclose()

    with serving_example() as upstream:
        first, second, records = asyncio.run(run(upstream.url, lambda: upstream.change_echo("Now it also mails.")))
    assert first["echo"].digest == first["echo"].recorded_digest
    assert second["echo"].digest != first["echo"].digest
    assert second["echo"].recorded_digest == first["echo"].digest  # the policy withholds it until pinned
    changed = [r for r in records if r["tool"] == "echo"]
    assert changed == [{"route": "mcp.tool", "event": "changed", "server": "ledger-test", "tool": "echo",
                        "tool_digest": second["echo"].digest, "previous_digest": first["echo"].digest}]
    assert second["word_count"].digest == second["word_count"].recorded_digest


def test_without_redis_each_process_records_its_own() -> None:
    with serving_example() as upstream:
        first = asyncio.run(_tools(upstream.url, MemoryLedger(), []))
        upstream.change_echo("Now it also mails.")
        second = asyncio.run(_tools(upstream.url, MemoryLedger(), []))
    # What a restart without Redis looks like: the new definition is taken as the first (docs/mcp.md: pin).
    assert second["echo"].recorded_digest == second["echo"].digest != first["echo"].digest


def test_a_ledger_that_cannot_answer_fails_closed() -> None:
    async def run() -> None:
        client = redis_client("redis://127.0.0.1:1/0", timeout_s=0.2)
        try:
            await RedisLedger(client).recorded("s", "t", "sha256:x")
        finally:
            await client.aclose()

    with pytest.raises(JsonRpcError) as refused:
        asyncio.run(run())
    assert refused.value.status == 503
