"""`tenantgate cache audit gateway`'s target through the real gateway over HTTP, as two tenants
with a bearer token each: the demo engine behind it, the policy deciding each tenant's scope.

Alpha and Theta get cache scope tenant: no leak, the control significant. Gamma's public data
gets scope shared; two principals of Gamma (two tokens, as two callers) share it: a leak. Alpha
0.001, so the no-leak test fails by chance in at most 0.1% of runs."""

from __future__ import annotations

from gateway.cache import AuditBudget, OpenAITarget, Verdict, run_audit, text_prefixes
from tests.gateway.api.conftest import ALPHA, GAMMA, THETA

# About 100 demo tokens: a miss prefills them all, a hit the suffix only.
PREFIX_WORDS = 64
BUDGET = AuditBudget(trials=14, max_requests=80, max_seconds=150)


async def _audit(gateway, bearer: dict[str, str], **options):
    target = OpenAITarget(gateway.base_url + "/v1", "demo", bearer=bearer, timeout_s=60, **options)
    try:
        return await run_audit(target, text_prefixes(PREFIX_WORDS), budget=BUDGET, alpha=0.001)
    finally:
        await target.aclose()


async def test_two_tenants_with_tenant_scope_do_not_leak(gateway) -> None:
    result = await _audit(gateway, {"a": gateway.token(ALPHA), "b": gateway.token(THETA)})
    assert result.control.p_value < result.alpha, result.as_dict()
    assert result.verdict is Verdict.NO_LEAK, result.as_dict()


async def test_shared_scope_leaks_between_two_callers(gateway) -> None:
    bearer = {"a": gateway.token(GAMMA, object_id="0000aaaa-0000-4000-8000-000000000001"),
              "b": gateway.token(GAMMA, object_id="0000bbbb-0000-4000-8000-000000000002")}
    result = await _audit(gateway, bearer, headers={"X-Data-Classification": "public"})
    assert result.control.p_value < result.alpha, result.as_dict()
    assert result.verdict is Verdict.LEAK, result.as_dict()
