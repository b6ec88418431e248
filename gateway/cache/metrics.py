"""The audit's result as Prometheus gauges, for a run that ends (a CronJob, a one-off): written to a
file for node exporter's textfile collector, or pushed to a Pushgateway, grouped by deployment so
each deployment's last result stays until its next run replaces it. The shipped alert rules
(TenantgateCacheLeak, TenantgateCacheAuditInconclusive) read them."""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, push_to_gateway, write_to_textfile

from gateway.cache.audit import AuditResult, Verdict

JOB = "tenantgate-cache-audit"


def audit_registry(deployment: str, result: AuditResult, now: float | None = None) -> CollectorRegistry:
    registry = CollectorRegistry()
    labels = ["deployment"]
    Gauge("tenantgate_cache_audit_leak", "1 when the last cache audit found a deployment's prefix cache crossing "
          "namespaces (cross-namespace probes timed as hits), else 0.", labels, registry=registry
          ).labels(deployment).set(1 if result.verdict is Verdict.LEAK else 0)
    Gauge("tenantgate_cache_audit_inconclusive", "1 when the last cache audit's positive control was not "
          "significant (it could not see hits), else 0.", labels, registry=registry
          ).labels(deployment).set(1 if result.verdict is Verdict.INCONCLUSIVE else 0)
    Gauge("tenantgate_cache_audit_alpha", "The significance level the last cache audit used.", labels,
          registry=registry).labels(deployment).set(result.alpha)
    per_probe = labels + ["probe"]
    p_value = Gauge("tenantgate_cache_audit_p_value", "KS p-value of the last cache audit's probes against "
                    "misses: probe cross (another namespace; small means a leak) or control (the same namespace; "
                    "must be small).", per_probe, registry=registry)
    statistic = Gauge("tenantgate_cache_audit_ks_statistic", "KS statistic D of the last cache audit's probes "
                      "against misses.", per_probe, registry=registry)
    samples = Gauge("tenantgate_cache_audit_samples", "Probes of each kind the last cache audit compared (as many "
                    "misses).", per_probe, registry=registry)
    for probe, comparison in (("cross", result.cross), ("control", result.control)):
        p_value.labels(deployment, probe).set(comparison.p_value)
        statistic.labels(deployment, probe).set(comparison.statistic)
        samples.labels(deployment, probe).set(comparison.n_probe)
    Gauge("tenantgate_cache_audit_last_run_timestamp_seconds", "When the last cache audit of the deployment "
          "ended (Unix time).", labels, registry=registry).labels(deployment).set(time.time() if now is None else now)
    return registry


def write_textfile(path: Path, registry: CollectorRegistry) -> None:
    write_to_textfile(str(path), registry)  # a temporary file renamed into place


def push(url: str, deployment: str, registry: CollectorRegistry) -> None:
    push_to_gateway(url, job=JOB, grouping_key={"deployment": deployment}, registry=registry, timeout=30)
