"""/metrics after a mixed run, against the OpenTelemetry GenAI semantic conventions' tables.

The conventions: open-telemetry/semantic-conventions v1.41.0, docs/gen-ai/gen-ai-metrics.md (status
Development; the last release with the GenAI pages before they moved to semantic-conventions-genai).
Their names reach Prometheus by OpenTelemetry's translation (opentelemetry-specification,
compatibility/prometheus_and_openmetrics.md):
dots become underscores, the unit `s` adds `_seconds` (OpenMetrics `# UNIT ... seconds`), an
annotation unit such as `{token}` adds nothing, attribute keys become labels the same way.
"""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tests.gateway.api.conftest import ALPHA, EMBEDDING_MODEL, EPSILON, GAMMA

CHAT = [{"role": "user", "content": "Say hello."}]
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
REQUIRED, IF_AVAILABLE, RECOMMENDED = "Required", "Conditionally Required: if available", "Recommended"
ON_ERROR = "Conditionally Required: if the operation ended in an error"
_ATTRIBUTES = {"gen_ai.operation.name": REQUIRED, "gen_ai.provider.name": REQUIRED,
               "gen_ai.request.model": IF_AVAILABLE, "gen_ai.response.model": RECOMMENDED}
# The conventions' tables: instrument type, unit (UCUM), attributes and their requirement level, and
# the ExplicitBucketBoundaries each metric SHOULD be specified with. server.address is Recommended
# (and server.port required only with it): the gateway does not report its own address.
CONVENTIONS = {
    "gen_ai.client.token.usage": {
        "type": "histogram", "unit": "{token}",
        "attributes": _ATTRIBUTES | {"gen_ai.token.type": REQUIRED},
        "buckets": [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864],
    },
    "gen_ai.server.request.duration": {
        "type": "histogram", "unit": "s", "attributes": _ATTRIBUTES | {"error.type": ON_ERROR},
        "buckets": [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92],
    },
    "gen_ai.server.time_per_output_token": {
        "type": "histogram", "unit": "s", "attributes": _ATTRIBUTES,
        "buckets": [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5],
    },
    "gen_ai.server.time_to_first_token": {
        "type": "histogram", "unit": "s", "attributes": _ATTRIBUTES,
        "buckets": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0],
    },
}
UNIT_SUFFIXES = {"s": "seconds", "{token}": ""}  # annotations in braces have no Prometheus unit


def prometheus_name(name: str, unit: str) -> str:
    suffix = UNIT_SUFFIXES[unit]
    return name.replace(".", "_") + (f"_{suffix}" if suffix else "")


def label(attribute: str) -> str:
    return attribute.replace(".", "_")


def scrape(gateway) -> dict:
    text = httpx.get(gateway.metrics_url, headers={"Accept": OPENMETRICS}).text
    return {family.name: family for family in text_string_to_metric_families(text)}


def counts(family) -> dict[tuple, float]:
    """A histogram's _count per label set."""
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples if s.name.endswith("_count")}


def grown(before, after) -> list[dict]:
    """The label sets whose _count grew between two scrapes."""
    old = counts(before) if before is not None else {}
    return [dict(key) for key, value in counts(after).items() if value > old.get(key, 0)]


def wait_for(predicate, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := predicate():
            return result
        time.sleep(0.05)
    raise AssertionError("the metrics did not show it in time")


def mixed_run(gateway) -> None:
    """Two ok requests (chat, text completion), a stream, an embedding, a 401, a 403 deny, a 429
    and a stream the caller leaves mid-answer."""
    alpha = gateway.client(ALPHA)
    alpha.chat.completions.create(model="demo", messages=CHAT, max_tokens=5, temperature=0)
    alpha.completions.create(model="demo", prompt="Once upon", max_tokens=5, temperature=0)
    chunks = list(alpha.chat.completions.create(model="demo", messages=CHAT, max_tokens=5, stream=True))
    assert chunks
    alpha.embeddings.create(model=EMBEDDING_MODEL, input=["metrics"])
    refused = httpx.post(gateway.base_url + "/v1/chat/completions", headers={"Authorization": "Bearer not-a-token"},
                         json={"model": "demo", "messages": CHAT})
    assert refused.status_code == 401
    with pytest.raises(openai.PermissionDeniedError):
        gateway.client(ALPHA, scopes=("Models.Read",)).chat.completions.create(model="demo", messages=CHAT)
    limited = gateway.client(EPSILON)  # two requests a minute
    with pytest.raises(openai.RateLimitError):
        for _ in range(3):
            limited.chat.completions.create(model="demo", messages=CHAT, max_tokens=2)
    body = {"model": "demo", "messages": CHAT, "max_tokens": 512, "stream": True, "temperature": 1.0}
    headers = {"Authorization": f"Bearer {gateway.token(ALPHA)}"}
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", gateway.base_url + "/v1/chat/completions", json=body, headers=headers) as response:
            assert response.status_code == 200
            assert [line for _, line in zip(range(4), response.iter_lines()) if line.startswith("data:")]


def test_genai_metrics_follow_the_semantic_conventions_tables(gateway) -> None:
    before = scrape(gateway)
    mixed_run(gateway)

    def left_stream_counted() -> dict | None:  # the stream the caller left ends on the server's own time
        families = scrape(gateway)
        rows = grown(before.get("gen_ai_server_request_duration_seconds"),
                     families["gen_ai_server_request_duration_seconds"])
        return families if any(row["error_type"] == "client_disconnected" for row in rows) else None

    after = wait_for(left_stream_counted)

    for name, convention in CONVENTIONS.items():
        family = after[prometheus_name(name, convention["unit"])]
        assert family.type == convention["type"], name
        assert family.unit == UNIT_SUFFIXES[convention["unit"]], name
        # The conventions' attributes and nothing else: no tenant (tenantgate_tenant_tokens_total is per tenant).
        labels = {label(key) for key in convention["attributes"]}
        buckets = {}
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            assert set(sample.labels) - {"le"} == labels, (name, sample.labels)
            for key, level in convention["attributes"].items():
                value = sample.labels[label(key)]
                if level in (REQUIRED, IF_AVAILABLE):
                    assert value, (name, key)  # never empty: the model is always known here
            if sample.name.endswith("_bucket"):
                buckets.setdefault(tuple(sorted(sample.labels.items() - {("le", sample.labels["le"])})), []).append(
                    sample.labels["le"])
        assert buckets, name
        for bounds in buckets.values():
            assert [float(b) for b in bounds] == [*convention["buckets"], float("inf")], name

    ran = {metric: grown(before.get(metric), after[metric]) for metric in (
        "gen_ai_client_token_usage", "gen_ai_server_request_duration_seconds",
        "gen_ai_server_time_to_first_token_seconds", "gen_ai_server_time_per_output_token_seconds")}
    for labels in (row for rows in ran.values() for row in rows):
        assert labels["gen_ai_provider_name"] == "tenantgate"
        assert labels["gen_ai_request_model"] == labels["gen_ai_response_model"]  # the name the answer carries
    # gen_ai.operation.name: the conventions' well-known values, one per route.
    operations = {row["gen_ai_operation_name"] for row in ran["gen_ai_server_request_duration_seconds"]}
    assert operations == {"chat", "text_completion", "embeddings"}
    token_types = {(row["gen_ai_operation_name"], row["gen_ai_token_type"]) for row in ran["gen_ai_client_token_usage"]}
    assert token_types == {("chat", "input"), ("chat", "output"), ("text_completion", "input"),
                           ("text_completion", "output"), ("embeddings", "input")}
    # Tokens per tenant: a counter, by the tenant's keyed digest (the histograms carry no tenant).
    def tenant_tokens(families) -> dict[tuple, float]:
        family = families.get("tenantgate_tenant_tokens")
        return {} if family is None else {(s.labels["tenant"], s.labels["gen_ai_token_type"]): s.value
                                          for s in family.samples if s.name == "tenantgate_tenant_tokens_total"}
    old_tokens, new_tokens = tenant_tokens(before), tenant_tokens(after)
    used = {key for key, value in new_tokens.items() if value > old_tokens.get(key, 0)}
    alpha = gateway.state.audit.tenant_digest(ALPHA)[:12]
    assert {(alpha, "input"), (alpha, "output")} <= used
    assert all(tenant not in (ALPHA, EPSILON) and len(tenant) == 12 for tenant, _ in used)
    # error.type only when the operation ended in an error (the caller left): "" is Prometheus' absent label.
    errors = {row["error_type"] for row in ran["gen_ai_server_request_duration_seconds"]}
    assert errors == {"", "client_disconnected"}
    # The time to first token and per output token are for successful responses only; embeddings have none.
    for metric in ("gen_ai_server_time_to_first_token_seconds", "gen_ai_server_time_per_output_token_seconds"):
        assert {row["gen_ai_operation_name"] for row in ran[metric]} == {"chat", "text_completion"}, metric
    # Refused requests never reached a model: they are in the gateway's own histogram only.
    gateway_family = after["tenantgate_gateway_request_duration_seconds"]
    assert gateway_family.type == "histogram" and gateway_family.unit == "seconds"
    outcomes = {(row["route"], row["outcome"])
                for row in grown(before.get("tenantgate_gateway_request_duration_seconds"), gateway_family)}
    assert {("chat.completions", "ok"), ("chat.completions", "denied"), ("chat.completions", "rate_limited"),
            ("chat.completions", "unauthenticated"), ("completions", "ok"), ("embeddings", "ok")} <= outcomes


def test_policy_revision_is_an_info_metric_and_engine_gauges_are_there(gateway) -> None:
    families = scrape(gateway)
    info = families["tenantgate_policy"]
    assert info.type == "info"
    [sample] = info.samples
    assert sample.name == "tenantgate_policy_info" and sample.value == 1
    assert sample.labels == {"revision": gateway.state.policy.revision}
    assert families["tenantgate_policy_reload_failures"].type == "counter"
    before = _decisions(families)
    for _ in range(2):  # the same request twice: its decision is evaluated at most once
        gateway.client(ALPHA).chat.completions.create(model="demo", messages=CHAT, max_tokens=2, temperature=0)
    after = _decisions(scrape(gateway))
    assert after[("request", "hit")] >= before.get(("request", "hit"), 0) + 1
    assert sum(after.values()) == sum(before.values()) + 2
    assert {cache for _, cache in after} <= {"hit", "miss"}  # the gateway's cache is on: nothing "off"
    for name, kind in (("tenantgate_engine_requests_running", "gauge"), ("tenantgate_engine_requests_waiting", "gauge"),
                       ("tenantgate_engine_preemptions", "counter")):
        assert families[name].type == kind, name
    usage = families["tenantgate_kv_cache_usage_ratio"]
    assert usage.type == "gauge" and usage.unit == "ratio" and 0 <= usage.samples[0].value <= 1


def _decisions(families: dict) -> dict[tuple[str, str], float]:
    family = families["tenantgate_policy_decisions"]
    assert family.type == "counter"
    return {(sample.labels["kind"], sample.labels["cache"]): sample.value for sample in family.samples
            if sample.name == "tenantgate_policy_decisions_total"}


def test_tenant_labels_are_keyed_digests_unless_the_policy_allows_the_name(gateway) -> None:
    """Gamma's policy data says name_in_metrics: its name labels its series; Alpha's does not."""
    gateway.client(GAMMA).chat.completions.create(model="demo", messages=CHAT, max_tokens=2)
    with pytest.raises(openai.PermissionDeniedError):  # denied too: one label per tenant
        gateway.client(GAMMA, scopes=("Models.Read",)).chat.completions.create(model="demo", messages=CHAT)
    gateway.client(ALPHA).chat.completions.create(model="demo", messages=CHAT, max_tokens=2)
    families = scrape(gateway)
    requests = {(s.labels["tenant"], s.labels["decision"]) for s in families["tenantgate_requests"].samples
                if s.name == "tenantgate_requests_total"}
    tokens = {s.labels["tenant"] for s in families["tenantgate_tenant_tokens"].samples}
    assert {("Gamma Test", "allow"), ("Gamma Test", "deny")} <= requests
    assert "Gamma Test" in tokens
    alpha = gateway.state.audit.tenant_digest(ALPHA)[:12]
    assert (alpha, "allow") in requests and alpha in tokens
    assert not {tenant for tenant, _ in requests} & {ALPHA, GAMMA, "Alpha Test"}  # never an id, nor a name not allowed
