"""Gateway metrics, in the app's own registry, served on a separate listener (never the API port)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "tenantgate_requests", "Requests by route, HTTP status, decision outcome and tenant (a keyed "
            "digest, never the tenant id).", ["route", "status", "decision", "tenant"], registry=self.registry)
        self.auth_failures = Counter(
            "tenantgate_auth_failures", "Rejected bearer tokens by reason code.", ["code"], registry=self.registry)
        self.ready = Gauge(
            "tenantgate_ready", "Readiness checks as /readyz last found them (1 ok, 0 failing); the public "
            "answer says only ready or not.", ["check"], registry=self.registry)
        self.jwks_key_sets_missing = Gauge(
            "tenantgate_jwks_key_sets_missing", "Tenant key sets (tenant, token version) tried whose keys "
            "could never be fetched. Any caller can add one for a registered tenant: alert, never readiness.",
            registry=self.registry)
        self.policy_latency = Histogram(
            "tenantgate_policy_evaluation_seconds", "Time to obtain and validate a policy decision.",
            ["backend"], registry=self.registry,
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5))
        self.rate_limited = Counter(
            "tenantgate_quota_rejections", "Quota outcomes other than a plain admit: budget (refused), "
            "store_unavailable (refused, fail closed), fail_open (served unaccounted).", ["reason"],
            registry=self.registry)
        self.deployment_failures = Counter(
            "tenantgate_deployment_failures", "Requests a deployment target failed (unreachable, timed out or 5xx), "
            "by target and whether output had been sent (before: the request moved to the next target).",
            ["target", "when"], registry=self.registry)
        self.deployment_requests = Counter(
            "tenantgate_deployment_requests", "Requests that a deployment target answered.",
            ["target"], registry=self.registry)
        self.tokens = Counter(
            "gen_ai_client_token_usage", "Tokens processed, by type (input or output) and tenant (digest).",
            ["gen_ai_token_type", "tenant"], registry=self.registry)

    def watch_audit(self, trail, redis_sink=None) -> None:
        """Gauges read at scrape time: write errors of any sink, and the Redis Stream sink's queue."""
        Gauge("tenantgate_audit_sink_errors", "Audit entries a sink failed to write (a gap in that copy).",
              registry=self.registry).set_function(lambda: trail.sink_errors)
        if redis_sink is not None:
            Gauge("tenantgate_audit_stream_pending", "Audit entries waiting for the Redis Stream.",
                  registry=self.registry).set_function(lambda: redis_sink.pending)
            Gauge("tenantgate_audit_stream_dropped", "Audit entries dropped because the Redis Stream queue was full.",
                  registry=self.registry).set_function(lambda: redis_sink.dropped)

    def watch_policy(self, policy) -> None:
        """Read at scrape time: the revision serving and the reloads refused, for a policy that
        has them (the embedded one; OPA reports its bundle revision per decision)."""
        if hasattr(policy, "revision") and hasattr(policy, "reload_failures"):
            self.registry.register(_PolicyCollector(policy))


class _PolicyCollector:
    def __init__(self, policy) -> None:
        self._policy = policy

    def collect(self):
        revision = GaugeMetricFamily("tenantgate_policy_revision", "The policy revision that decides requests "
                                     "(1, labelled with its content digest).", labels=["revision"])
        revision.add_metric([self._policy.revision], 1)
        yield revision
        yield CounterMetricFamily("tenantgate_policy_reload_failures", "Policy reloads refused (a file that does "
                                  "not parse, or a sample that gets no valid decision); the last good revision "
                                  "keeps serving.", value=self._policy.reload_failures)
