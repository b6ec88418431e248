"""Execution envelopes for engine tests, built by the gateway's own Decision → envelope mapping."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from engine import ExecutionEnvelope, segment_digest
from gateway.pipeline.envelope import envelope_for_decision
from gateway.policy.schema import Decision, validate_decision

SECRET = b"test-deployment-secret"
_SAMPLE = Path(__file__).parents[2] / "policies" / "samples" / "allow_standard_app_token.json"
_ALLOWED = json.loads(_SAMPLE.read_text())["allow_standard_app_token"]["expected"]


def segment(token_ids: list[int], owner: str = "platform") -> dict:
    """A public segment of the decision's cache section, as policies/cache writes one (owner: "platform",
    or "tenant:<tenant_id>" for a tenant's own)."""
    digest = segment_digest(token_ids).hex()
    return {"digest": digest, "tokens": len(token_ids), "namespace": f"segment:{owner}:{digest}"}


def decision(tenant: str = "tenant-a", scope: str = "tenant", isolation: str = "shared", deterministic: bool = False,
             quota: int = 1 << 30, priority: int = 0, principal: str = "user-1",
             segments: tuple[dict, ...] = (), speculative: bool = False) -> Decision:
    """An allowed decision with these settings (the rest as in a policy sample)."""
    names = {"tenant": f"tenant:{tenant}", "principal": f"principal:{tenant}:{principal}", "shared": "shared",
             "none": ""}
    document = copy.deepcopy(_ALLOWED)
    document["cache"] = {"scope": scope, "namespace": names[scope], "segments": list(segments)}
    document["batching"] = {"isolation": isolation, "deterministic": deterministic, "speculative": speculative}
    document["limits"] |= {"kv_blocks": quota, "priority": priority}
    return validate_decision(document)


def envelope(tenant: str = "tenant-a", scope: str = "tenant", isolation: str = "shared", deterministic: bool = False,
             quota: int = 1 << 30, priority: int = 0, principal: str = "user-1",
             segments: tuple[dict, ...] = (), speculative: bool = False) -> ExecutionEnvelope:
    return envelope_for_decision(SECRET, tenant, decision(tenant, scope, isolation, deterministic, quota, priority,
                                                          principal, segments, speculative))


ENV = envelope()
