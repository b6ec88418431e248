"""Execution envelopes for engine tests, built the way the gateway builds them."""

from __future__ import annotations

from engine.envelope import CacheScope, ExecutionEnvelope, Isolation, keyed_digest

SECRET = b"test-deployment-secret"


def envelope(
    tenant: str = "tenant-a",
    scope: str = "tenant",
    isolation: str = "shared",
    deterministic: bool = False,
    quota: int = 1 << 30,
    priority: int = 0,
    principal: str = "user-1",
) -> ExecutionEnvelope:
    names = {"tenant": f"tenant:{tenant}", "principal": f"principal:{tenant}:{principal}", "shared": "shared"}
    return ExecutionEnvelope(
        cache_namespace=keyed_digest(SECRET, names[scope]) if scope != "none" else None,
        cache_scope=CacheScope(scope),
        isolation=Isolation(isolation),
        isolation_key=keyed_digest(SECRET, f"tenant:{tenant}"),
        deterministic=deterministic,
        kv_block_quota=quota,
        priority=priority,
    )


ENV = envelope()
