"""Gateway metrics, in the app's own registry, served on a separate listener (never the API port).

The gen_ai_* metrics are the OpenTelemetry GenAI semantic conventions' (docs/gen-ai/gen-ai-metrics.md),
named as OpenTelemetry's Prometheus translation names them: dots become underscores, the unit
`s` becomes a `_seconds` suffix, an annotation unit such as `{token}` adds nothing, and so do the
attribute keys (`gen_ai.operation.name` is the label `gen_ai_operation_name`). Their buckets are the
conventions' explicit bucket boundaries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, InfoMetricFamily

if TYPE_CHECKING:
    from gateway.policy.service import PolicyEngine

# gen_ai.operation.name for each route that runs a model (the conventions' well-known values).
OPERATIONS = {"chat.completions": "chat", "completions": "text_completion", "embeddings": "embeddings",
              "responses": "chat"}  # the Responses API is a chat: its operation in the conventions
# gen_ai.provider.name: the conventions' value is the instrumentation's best knowledge of who serves
# the API; whatever deployment runs it, the API and its usage figures are tenantgate's.
PROVIDER = "tenantgate"
_GEN_AI = ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_response_model"]
# The conventions' ExplicitBucketBoundaries, metric by metric.
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
REQUEST_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TIME_PER_OUTPUT_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                               7.5, 10.0)


class Bound:
    """A labelled metric's children, bound once per label set: a request looks its child up in a dict
    instead of through labels(), which checks and converts the values and takes a lock every time.
    Label sets stay as bounded as the metric's own (each is a child of the metric anyway)."""

    __slots__ = ("_children", "_metric")

    def __init__(self, metric) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], object] = {}

    def __call__(self, *values: str):
        child = self._children.get(values)
        if child is None:  # two threads may both bind it: labels() hands both the same child
            child = self._children[values] = self._metric.labels(*values)
        return child


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
        self.audit_unavailable = Counter(
            "tenantgate_audit_unavailable", "Requests refused with 503 audit_unavailable before any work, while "
            "an audit sink could not write.", registry=self.registry)
        self.deployment_failures = Counter(
            "tenantgate_deployment_failures", "Requests a deployment target failed (unreachable, timed out or 5xx), "
            "by target and whether output had been sent (before: the request moved to the next target).",
            ["target", "when"], registry=self.registry)
        self.deployment_requests = Counter(
            "tenantgate_deployment_requests", "Requests that a deployment target answered.",
            ["target"], registry=self.registry)
        self.deployment_usage_excess = Counter(
            "tenantgate_deployment_usage_excess_tokens", "Tokens a deployment target reported beyond what the "
            "request could have used (prompt: the ids sent or the body's bytes; completion: max_tokens x n), "
            "not charged, by target and token type.", ["target", "type"], registry=self.registry)
        # No tenant label on a histogram: it would cost every tenant 17 series per label set (8 KB of
        # /metrics a tenant). Histograms are per route and model; the per-tenant figure is a counter.
        self.tokens = Histogram(
            "gen_ai_client_token_usage", "Number of input and output tokens used, per request, by type.",
            [*_GEN_AI, "gen_ai_token_type"], buckets=TOKEN_BUCKETS, registry=self.registry)
        self.tenant_tokens = Counter(
            "tenantgate_tenant_tokens", "Input and output tokens used, by tenant (a keyed digest, never the "
            "tenant id) and type.", ["tenant", "gen_ai_token_type"], registry=self.registry)
        self.server_duration = Histogram(
            "gen_ai_server_request_duration", "Generative AI server request duration: from the hand-over to a "
            "deployment to the last byte of the answer; error_type set when it ended in an error.",
            [*_GEN_AI, "error_type"], unit="seconds", buckets=REQUEST_DURATION_BUCKETS, registry=self.registry)
        self.time_to_first_token = Histogram(
            "gen_ai_server_time_to_first_token", "Time to generate first token for successful responses (from "
            "the hand-over to a deployment).", _GEN_AI, unit="seconds", buckets=TIME_TO_FIRST_TOKEN_BUCKETS,
            registry=self.registry)
        self.time_per_output_token = Histogram(
            "gen_ai_server_time_per_output_token", "Time per output token generated after the first token for "
            "successful responses.", _GEN_AI, unit="seconds", buckets=TIME_PER_OUTPUT_TOKEN_BUCKETS,
            registry=self.registry)
        self.request_duration = Histogram(
            "tenantgate_gateway_request_duration", "Whole requests as the gateway served them (authentication, "
            "policy, quota, the deployment, audit), by route and outcome.", ["route", "outcome"], unit="seconds",
            buckets=(0.001, 0.0025, 0.005, *REQUEST_DURATION_BUCKETS), registry=self.registry)  # refusals take ms
        # The children every request touches, bound once per label set.
        self.request_count = Bound(self.requests)
        self.request_time = Bound(self.request_duration)
        self.policy_time = Bound(self.policy_latency)
        self._tokens, self._tenant_tokens = Bound(self.tokens), Bound(self.tenant_tokens)
        self._server_duration, self._first_token = Bound(self.server_duration), Bound(self.time_to_first_token)
        self._per_output_token = Bound(self.time_per_output_token)
        self.deployment_answered = Bound(self.deployment_requests)

    def served(self, route: str, model: str, tenant: str, *, input_tokens: int, output_tokens: int,
               duration_s: float, first_token_s: float | None, error_type: str | None) -> None:
        """The GenAI metrics of one request a deployment was asked to run. The time to first token
        and per output token are the conventions' "for successful responses" only."""
        attributes = (OPERATIONS.get(route, route), PROVIDER, model, model)  # the response names the served model
        self._tokens(*attributes, "input").observe(input_tokens)
        self._tenant_tokens(tenant, "input").inc(input_tokens)
        if route != "embeddings":
            self._tokens(*attributes, "output").observe(output_tokens)
            self._tenant_tokens(tenant, "output").inc(output_tokens)
        self._server_duration(*attributes, error_type or "").observe(duration_s)
        if error_type is not None or first_token_s is None:
            return
        self._first_token(*attributes).observe(first_token_s)
        if output_tokens > 1:
            self._per_output_token(*attributes).observe((duration_s - first_token_s) / (output_tokens - 1))

    def watch_audit(self, trail, redis_sink=None) -> None:
        """Gauges read at scrape time: write errors of any sink, whether the trail takes records, what
        it holds in memory and refused, and the Redis Stream sink's queue."""
        Gauge("tenantgate_audit_sink_errors", "Audit entries a sink failed to write or flush.",
              registry=self.registry).set_function(lambda: trail.sink_errors)
        Gauge("tenantgate_audit_accepting", "1 while every audit sink can take records; 0 while one cannot (a "
              "full disk, a full Redis queue) and new requests are refused with 503 audit_unavailable.",
              registry=self.registry).set_function(lambda: 1 if trail.accepting else 0)
        Gauge("tenantgate_audit_held_entries", "Audit entries kept in memory until their sink's store takes "
              "them (written in order once it does).", registry=self.registry).set_function(lambda: trail.held)
        Gauge("tenantgate_audit_records_refused", "Audit records no sink could keep: each request was answered "
              "503 audit_unavailable instead of its success (never acknowledged without its record).",
              registry=self.registry).set_function(lambda: trail.refused)
        if redis_sink is not None:
            Gauge("tenantgate_audit_stream_pending", "Audit entries waiting for the Redis Stream.",
                  registry=self.registry).set_function(lambda: redis_sink.pending)
            Gauge("tenantgate_audit_stream_dropped", "Audit entries still queued for the Redis Stream when the "
                  "gateway stopped (lost from that copy).",
                  registry=self.registry).set_function(lambda: redis_sink.dropped)

    def watch_policy(self, policy: PolicyEngine) -> None:
        """Read at scrape time: the revision serving (the embedded policy's, or the bundles' that OPA
        last decided with), the decisions made (and what the decision cache did for them) and the reloads
        refused (the embedded policy reloads; OPA's sidecar does its own)."""
        self.registry.register(_PolicyCollector(policy))


class _PolicyCollector:
    def __init__(self, policy: PolicyEngine) -> None:
        self._policy = policy

    def collect(self):
        if self._policy.revision is not None:
            yield InfoMetricFamily("tenantgate_policy", "The policy revision that decides requests (its content "
                                   "digest, or OPA's bundle revisions).", value={"revision": self._policy.revision})
        decisions = CounterMetricFamily(
            "tenantgate_policy_decisions", "Policy decisions made, by kind (request, tools) and by what the "
            "decision cache did: hit (served from it), miss (evaluated, then kept), off (evaluated: the cache is "
            "off, the revision cannot be cached, or OPA decides).", labels=["kind", "cache"])
        for (kind, cache), count in sorted(self._policy.decision_counts().items()):
            decisions.add_metric([kind, cache], count)
        yield decisions
        if self._policy.reload_failures is None:
            return
        yield CounterMetricFamily("tenantgate_policy_reload_failures", "Policy reloads refused (a file that does "
                                  "not parse, or a sample that gets no valid decision); the last good revision "
                                  "keeps serving.", value=self._policy.reload_failures)
