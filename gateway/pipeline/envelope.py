"""The one mapping from a policy decision to the engine's execution envelope.

Upstream dialects (gateway/deployments/dialects.py) derive their knobs from this envelope, so
the namespace digest, isolation and priority mean the same on every kind of deployment.
"""

from __future__ import annotations

from engine import CacheScope, ExecutionEnvelope, Isolation, PublicSegment, isolation_key, keyed_digest
from gateway.policy.schema import Decision


def envelope_for_decision(namespace_key: bytes, tenant_id: str, decision: Decision) -> ExecutionEnvelope:
    """Raises EnvelopeError/ValueError when the decision cannot become an envelope."""
    scope = CacheScope(decision.cache.scope)
    namespace = (None if scope is CacheScope.NONE
                 else keyed_digest(namespace_key, "namespace:" + decision.cache.namespace))
    return ExecutionEnvelope(
        cache_namespace=namespace,
        cache_scope=scope,
        isolation=Isolation(decision.batching.isolation),
        isolation_key=isolation_key(namespace_key, tenant_id),
        deterministic=decision.batching.deterministic,
        kv_block_quota=decision.limits.kv_blocks,
        priority=decision.limits.priority,
        public_segments=tuple(
            PublicSegment(digest=bytes.fromhex(s.digest), num_tokens=s.tokens,
                          namespace=keyed_digest(namespace_key, "namespace:" + s.namespace))
            for s in decision.cache.segments),
        speculative=decision.batching.speculative,
    )
