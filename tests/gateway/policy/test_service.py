"""The embedded policy service across reloads: a revision that parses but cannot decide is
refused and the last good one keeps serving, both show in the metrics, and reloading does
not leak a regorus engine each time."""

from __future__ import annotations

import copy
import gc
import json
import time
import uuid
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client import generate_latest

from devkit.server import serving
from gateway.app import create_app
from gateway.inference import NullBackend
from gateway.metrics import GatewayMetrics
from gateway.policy.exceptions import PolicyError
from gateway.policy.service import EmbeddedPolicy, OpaPolicy, PolicyEngine
from tests.gateway.api.conftest import ALPHA, AUDIENCE, DATA_DIR, gateway_settings
from tests.gateway.policy.conftest import SAMPLES
from tests.utils.issuer import FABRIKAM

SAMPLE = SAMPLES["allow_standard_app_token"]["input"]

# Parses, and conflicts with `_requested := object.get(...)` for every request (its max_tokens, or null, is not -1).
RULE_CONFLICT = "\n_requested := -1 if input.request.route\n"


def _add_rule_conflict(policy_dir: Path) -> None:
    limits = policy_dir / "limits" / "limits.rego"
    limits.write_text(limits.read_text() + RULE_CONFLICT)


def _break_decision_schema(policy_dir: Path) -> None:
    limits = policy_dir / "limits" / "limits.rego"
    limits.write_text(limits.read_text().replace('"kv_blocks": tenant_limits.kv_blocks,', '"kv_blocks": "lots",'))


@pytest.mark.parametrize("edit", [_add_rule_conflict, _break_decision_schema])
async def test_a_reload_that_cannot_decide_is_refused_and_the_last_good_revision_serves(policy_copy, edit) -> None:
    policy = EmbeddedPolicy(policy_copy)
    good = await policy.decide(SAMPLE)
    edit(policy_copy)

    assert await policy.reload_if_changed() is False
    assert policy.reload_failures == 1
    assert policy.revision == good.revision
    assert await policy.decide(SAMPLE) == good


def test_a_policy_whose_samples_get_no_decision_does_not_start(policy_copy) -> None:
    _add_rule_conflict(policy_copy)
    with pytest.raises(PolicyError, match="sample .* gets no valid decision: .*rule conflicts"):
        EmbeddedPolicy(policy_copy)


async def test_the_active_revision_and_refused_reloads_are_metrics(policy_copy) -> None:
    policy = EmbeddedPolicy(policy_copy)
    metrics = GatewayMetrics()
    metrics.watch_policy(policy)
    first = policy.revision

    def scrape() -> str:
        return generate_latest(metrics.registry).decode()

    assert f'tenantgate_policy_info{{revision="{first}"}} 1.0' in scrape()
    assert "tenantgate_policy_reload_failures_total 0.0" in scrape()

    _add_rule_conflict(policy_copy)
    await policy.reload_if_changed()
    assert f'tenantgate_policy_info{{revision="{first}"}} 1.0' in scrape()
    assert "tenantgate_policy_reload_failures_total 1.0" in scrape()

    limits = policy_copy / "limits" / "limits.rego"
    limits.write_text(limits.read_text().replace(RULE_CONFLICT, "\n"))
    assert await policy.reload_if_changed() is True
    text = scrape()
    assert policy.revision != first and f'tenantgate_policy_info{{revision="{policy.revision}"}} 1.0' in text
    assert first not in text


async def test_decisions_are_counted_by_what_the_cache_did_across_reloads(policy_copy) -> None:
    policy = EmbeddedPolicy(policy_copy, cache_size=64)
    metrics = GatewayMetrics()
    metrics.watch_policy(policy)

    def counted() -> dict[str, float]:
        text = generate_latest(metrics.registry).decode()
        return {cache: float(line.rsplit(" ", 1)[1]) for cache in ("hit", "miss", "off")
                for line in text.splitlines()
                if line.startswith(f'tenantgate_policy_decisions_total{{cache="{cache}",kind="request"}}')}

    assert counted() == {}
    await policy.decide(SAMPLE)
    warmer = copy.deepcopy(SAMPLE)
    warmer["request"]["temperature"] = 1.7  # a field the policy does not read
    await policy.decide(warmer)
    longer = copy.deepcopy(SAMPLE)
    longer["request"]["prompt_tokens"] += 1  # nor the prompt's length, which real traffic varies
    await policy.decide(longer)
    fewer = copy.deepcopy(SAMPLE)
    fewer["request"]["max_tokens"] = 7  # one it reads
    await policy.decide(fewer)
    assert counted() == {"hit": 2, "miss": 2}

    limits = policy_copy / "limits" / "limits.rego"
    limits.write_text(limits.read_text() + "\n# a new revision\n")
    assert await policy.reload_if_changed() is True
    await policy.decide(SAMPLE)  # the new revision's first: a miss, added to the counts before it
    assert counted() == {"hit": 2, "miss": 3}
    assert policy.decision_counts() == {("request", "hit"): 2, ("request", "miss"): 3}


async def test_without_a_cache_every_decision_is_counted_as_evaluated(policy_copy) -> None:
    limits = policy_copy / "limits" / "limits.rego"  # a conflict for one model alone: the samples still decide
    limits.write_text(limits.read_text() + '\n_requested := -1 if input.request.model == "conflicted"\n')
    policy = EmbeddedPolicy(policy_copy)
    for _ in range(3):
        await policy.decide(SAMPLE)
    with pytest.raises(PolicyError, match="conflict"):
        await policy.decide({**SAMPLE, "request": {**SAMPLE["request"], "model": "conflicted"}})
    assert policy.decision_counts() == {("request", "off"): 3}  # the one that failed is not a decision


async def test_both_policy_backends_have_every_member_the_protocol_declares(policy_copy) -> None:
    # The gateway reads them directly (metrics, health): a backend missing one would fail at scrape time.
    declared = {name for name in vars(PolicyEngine) if not name.startswith("_")}
    assert {"revision", "reload_failures"} <= declared
    opa = OpaPolicy("http://127.0.0.1:9")  # never asked: the members are read, not called
    try:
        for backend in (EmbeddedPolicy(policy_copy), opa):
            assert all(hasattr(backend, name) for name in declared), type(backend).__name__
        assert opa.revision is None and opa.reload_failures is None  # OPA's sidecar reloads its own bundles
    finally:
        await opa.aclose()


def test_a_gateway_keeps_serving_through_a_reload_that_cannot_decide(local_issuer, policy_copy) -> None:
    settings = gateway_settings(local_issuer, engine="null", policy_dir=policy_copy, policy_data_dir=DATA_DIR,
                                policy_reload_interval_s=0.1)
    app = create_app(settings, backend=NullBackend(model_name="demo"))
    metrics_url = f"http://127.0.0.1:{settings.metrics_port}/metrics"
    with serving(app) as base, openai.OpenAI(base_url=base + "/v1", max_retries=0, timeout=30,
                                             api_key=local_issuer.mint(ALPHA, audience=AUDIENCE)) as client:
        def chat():
            return client.chat.completions.create(model="demo", max_tokens=2,
                                                  messages=[{"role": "user", "content": "count to three"}])

        assert chat().usage.completion_tokens == 2
        revision = app.state.gateway.policy.revision
        _add_rule_conflict(policy_copy)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until the watcher has judged the edit, one way or the other
            if (app.state.gateway.policy.revision != revision
                    or "tenantgate_policy_reload_failures_total 1.0" in httpx.get(metrics_url).text):
                break
            time.sleep(0.05)

        assert chat().usage.completion_tokens == 2  # not a 503
        assert app.state.gateway.policy.revision == revision
        assert f'tenantgate_policy_info{{revision="{revision}"}} 1.0' in httpx.get(metrics_url).text


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


RELOADS, WARM_UP = 60, 10


async def test_reloads_of_a_large_data_file_do_not_leak_engines(policy_copy) -> None:
    tenants_file = policy_copy / "data" / "tenants.example.json"
    data = json.loads(tenants_file.read_text())
    template = data["tenants"][FABRIKAM]
    for _ in range(2000):
        data["tenants"][str(uuid.uuid4())] = copy.deepcopy(template)
    tenants_file.write_text(json.dumps(data))
    policy = EmbeddedPolicy(policy_copy)
    await policy.decide(SAMPLE)

    started, warm = time.monotonic(), None
    for i in range(RELOADS):
        data["tenants"][FABRIKAM]["limits"]["priority"] = 1 + i % 2
        tenants_file.write_text(json.dumps(data) + " " * (i % 3))  # the size changes too, whatever the mtime does
        assert await policy.reload_if_changed()
        assert (await policy.decide(SAMPLE)).decision.limits.priority == 1 + i % 2  # the loop builds its engine
        if i + 1 == WARM_UP:
            gc.collect()
            warm = _rss_mb()
    gc.collect()
    growth = _rss_mb() - warm
    # Each leaked engine holds the whole data document (~5 MB here): 50 reloads leak ~250 MB.
    assert growth < 32, f"RSS grew {growth:.0f} MB over {RELOADS - WARM_UP} reloads"
    assert policy.reload_failures == 0
    assert time.monotonic() - started < 60


def test_the_registered_tenants_are_the_policy_datas() -> None:
    policy = EmbeddedPolicy(Path(__file__).parents[3] / "policies", DATA_DIR)
    registered = json.loads((DATA_DIR / "tenants.json").read_text())["tenants"]
    assert policy.tenant_ids() == frozenset(registered) and ALPHA in policy.tenant_ids()
    assert all(policy.tenant_known(tenant) for tenant in policy.tenant_ids())
    assert {tenant for tenant in registered if policy.tenant_enabled(tenant)} == {
        tenant for tenant, data in registered.items() if data["enabled"] is True} != frozenset(registered)
    assert policy.tenant_enabled("eeeeeeee-0000-4000-8000-00000000000e") is False
