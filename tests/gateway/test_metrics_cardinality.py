"""/metrics grows by a bounded few series per tenant (issue 24, item 14).

A `tenant` label on a histogram costs every tenant 2 token types x (14 buckets + +Inf + sum + count
+ created) lines per route and model: about 8 KB a tenant, 16 MB and a 2.6 s scrape at 2,000
tenants. Histograms are per route, model and deployment; the per-tenant figure is one counter,
tenantgate_tenant_tokens_total{tenant, gen_ai_token_type}: 4 lines a tenant (2 samples and their
_created), under 100 bytes each with a 12-character digest.
"""

from __future__ import annotations

import hashlib

from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from gateway.metrics import GatewayMetrics

TENANTS = 200
# A route and a model each tenant uses: chat on one model, text completion on another, embeddings.
SERVED = (("chat.completions", "demo"), ("completions", "demo-large"), ("embeddings", "demo-embed"))
# The bound per tenant, once the fixed part (every family's header and the tenant-free series) is
# taken off: the counter's 4 lines measure 385 bytes with a 12-character digest, in either format;
# 600 leaves room for a longer tenant name (name_in_metrics: 12 characters more add 48 bytes) and a label more.
# One histogram label set per tenant alone is 17 lines, about 4,200 bytes (the histogram with the tenant
# measured 20,800 bytes a tenant here, 6,900 per route and model): a tenant label on any histogram fails it.
BYTES_PER_TENANT = 600


def _tenant(i: int) -> str:
    return hashlib.sha256(f"tenant-{i}".encode()).hexdigest()[:12]  # the keyed digest's shape


def _metrics(tenants: int) -> GatewayMetrics:
    metrics = GatewayMetrics()
    for i in range(tenants):
        for route, model in SERVED:
            metrics.served(route, model, _tenant(i), input_tokens=40 + i,
                           output_tokens=0 if route == "embeddings" else 9, duration_s=0.2, first_token_s=0.05,
                           error_type=None)
    return metrics


def test_scrape_grows_by_a_bounded_size_per_tenant() -> None:
    for render in (generate_latest, generate_openmetrics):
        one, many = len(render(_metrics(1).registry)), len(render(_metrics(TENANTS).registry))
        per_tenant = (many - one) / (TENANTS - 1)
        assert per_tenant < BYTES_PER_TENANT, (render.__module__, one, many, per_tenant)


def test_no_histogram_carries_a_tenant_label() -> None:
    families = list(_metrics(3).registry.collect())
    histograms = [family for family in families if family.type == "histogram"]
    observed = {f.name for f in histograms if f.samples}
    assert {"gen_ai_client_token_usage", "gen_ai_server_request_duration_seconds",
            "gen_ai_server_time_to_first_token_seconds", "gen_ai_server_time_per_output_token_seconds"} <= observed
    for family in histograms:
        assert not [s for s in family.samples if "tenant" in s.labels], family.name
    # Only counters are per tenant: tenantgate_tenant_tokens_total here (tenantgate_requests_total is the middleware's).
    assert {f.name for f in families if any("tenant" in s.labels for s in f.samples)} == {"tenantgate_tenant_tokens"}


def test_tenant_tokens_count_what_each_tenant_was_served() -> None:
    metrics = GatewayMetrics()
    metrics.served("chat.completions", "demo", "a" * 12, input_tokens=7, output_tokens=3, duration_s=0.1,
                   first_token_s=0.02, error_type=None)
    metrics.served("completions", "demo-large", "a" * 12, input_tokens=5, output_tokens=0, duration_s=0.1,
                   first_token_s=None, error_type="service_unavailable")  # an error still used its prompt
    metrics.served("embeddings", "demo-embed", "b" * 12, input_tokens=11, output_tokens=0, duration_s=0.1,
                   first_token_s=None, error_type=None)
    [family] = [f for f in metrics.registry.collect() if f.name == "tenantgate_tenant_tokens"]
    assert family.type == "counter"
    totals = {(s.labels["tenant"], s.labels["gen_ai_token_type"]): s.value
              for s in family.samples if s.name == "tenantgate_tenant_tokens_total"}
    # Embeddings have no output tokens: no output series for a tenant that only embedded, as in the histogram.
    assert totals == {("a" * 12, "input"): 12, ("a" * 12, "output"): 3, ("b" * 12, "input"): 11}
    # The same figures as the histogram's sums, per token type.
    sums: dict[str, float] = {}
    for sample in next(f for f in metrics.registry.collect() if f.name == "gen_ai_client_token_usage").samples:
        if sample.name == "gen_ai_client_token_usage_sum":
            sums[sample.labels["gen_ai_token_type"]] = sums.get(sample.labels["gen_ai_token_type"], 0) + sample.value
    assert sums == {"input": 23, "output": 3}
