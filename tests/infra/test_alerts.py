"""The shipped alerts and dashboard: promtool checks and unit-tests the rules, the dashboard fits
Grafana's dashboard schema, both ask only for metrics the code exports, the landing zone pages on
the same rules, and the chart ships them (PodMonitor, PrometheusRule, dashboard ConfigMap)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from engine import PrometheusSink
from gateway.cache import AuditResult, Comparison, Verdict
from gateway.cache.metrics import audit_registry
from gateway.metrics import GatewayMetrics
from tests.infra.conftest import (
    CHART,
    INFRA,
    REPO,
    VENV_INFRA,
    Tools,
    extract_settings,
    render_chart,
    run,
)
from tests.utils.tools import missing_tool

RULES = CHART / "files" / "alerts.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
RULE_TESTS = REPO / "tests" / "infra" / "alerts_test.yaml"
# The list of what must page, by the alert that covers it.
REQUIRED_ALERTS = {
    "availability": "TenantgateAvailability",
    "p99 time to first token": "TenantgateTimeToFirstTokenHigh",
    "quota store down": "TenantgateQuotaStoreDown",
    "policy reload failing": "TenantgatePolicyReloadFailing",
    "audit sink errors": "TenantgateAuditSinkErrors",
    "KV pressure": "TenantgateKvCachePressure",
    "deny-rate spikes per tenant": "TenantgateTenantDenySpike",
    "a deployment's prefix cache crossing namespaces (issue 29)": "TenantgateCacheLeak",
}
# Labels Prometheus adds to every scraped series (the PodMonitor's target labels).
TARGET_LABELS = {"namespace", "pod", "container", "endpoint", "job", "instance"}
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "topk", "bottomk", "rate", "increase", "delta", "by", "without",
    "histogram_quantile", "min_over_time", "max_over_time", "and", "or", "unless", "offset", "on",
    "ignoring", "group_left", "group_right", "bool", "label_values",
}


def _rules() -> list[dict]:
    return yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"][0]["rules"]


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def promtool() -> Path:
    """scripts/install-infra-tools.sh puts it there: Debian's, or one built with `go install`."""
    found = VENV_INFRA / "bin" / "promtool"
    if not found.exists():
        missing_tool(f"{found} not found: run scripts/install-infra-tools.sh (make test does)")
    return found


# -- promtool ---------------------------------------------------------------------------------


def test_promtool_check_rules_passes_on_the_shipped_rules(promtool: Path) -> None:
    result = run([promtool, "check", "rules", RULES])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in result.stdout + result.stderr


def test_promtool_check_rules_fails_on_a_broken_rule(promtool: Path, tmp_path: Path) -> None:
    broken = tmp_path / "alerts.yaml"
    text = RULES.read_text(encoding="utf-8")
    assert "sum by (le) (rate(" in text
    broken.write_text(text.replace("sum by (le) (rate(", "sum by (le (rate(", 1), encoding="utf-8")
    result = run([promtool, "check", "rules", broken])
    assert result.returncode != 0
    assert ("TenantgateTimeToFirstTokenHigh" in result.stdout + result.stderr
            or "parse error" in result.stdout + result.stderr)


def test_promtool_unit_tests_pass(promtool: Path) -> None:
    result = run([promtool, "test", "rules", RULE_TESTS])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    assert tests["rule_files"] == [str(Path("..") / ".." / RULES.relative_to(REPO))]
    fired = {case["alertname"] for test in tests["tests"] for case in test["alert_rule_test"] if case["exp_alerts"]}
    quiet = {case["alertname"] for test in tests["tests"] for case in test["alert_rule_test"] if not case["exp_alerts"]}
    alerts = {rule["alert"] for rule in _rules()}
    assert fired == alerts
    # Silence is tested too: an evaluation that expects nothing (or series beside the firing ones).
    assert quiet >= alerts - {"TenantgateKvCachePressure", "TenantgateTenantDenySpike"}
    assert set(REQUIRED_ALERTS.values()) <= alerts


def test_unit_tests_fail_when_a_threshold_moves(promtool: Path, tmp_path: Path) -> None:
    # A unit test that still passed with the availability threshold at 50% would prove nothing.
    rules = tmp_path / "infra" / "helm" / "tenantgate" / "files" / "alerts.yaml"
    rules.parent.mkdir(parents=True)
    text = RULES.read_text(encoding="utf-8")
    old = "[5m:1m]) > 0.05"
    assert text.count(old) == 1
    rules.write_text(text.replace(old, "[5m:1m]) > 0.5"), encoding="utf-8")
    unit_tests = tmp_path / "tests" / "infra" / "alerts_test.yaml"
    unit_tests.parent.mkdir(parents=True)
    shutil.copy(RULE_TESTS, unit_tests)
    result = run([promtool, "test", "rules", unit_tests])
    assert result.returncode != 0
    assert "TenantgateAvailability" in result.stdout + result.stderr


def test_rules_have_no_for_and_a_known_severity() -> None:
    # The Azure rule groups cannot carry `for` (see the file's header), so no rule may rely on it.
    for rule in _rules():
        assert "for" not in rule, rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["description"], rule["alert"]


# -- metric names -----------------------------------------------------------------------------


def _exported_metrics() -> dict[str, str]:
    """Every sample name the gateway, the engine and the cache audit (pushed) export, and its family's type."""
    metrics = GatewayMetrics()
    metrics.watch_audit(SimpleNamespace(sink_errors=0, accepting=True, held=0, refused=0),
                        SimpleNamespace(pending=0, dropped=0))
    metrics.watch_policy(SimpleNamespace(revision="sha256:0", reload_failures=0,
                                         decision_counts=lambda: {("request", "hit"): 1}))
    pool = SimpleNamespace(num_free_blocks=8, num_cached_blocks=0, num_held_blocks=0)
    scheduler = SimpleNamespace(running=[], waiting=[], num_preemptions=0, block_manager=pool, num_draft_tokens=0,
                                num_accepted_tokens=0)
    PrometheusSink(metrics.registry).watch(SimpleNamespace(scheduler=scheduler, kv_usage=lambda: 0.0))
    comparison = Comparison(1.0, 1e-9, 20, 20, 0.01, 0.05)
    audit = audit_registry("vllm-a", AuditResult(Verdict.LEAK, 0.01, comparison, comparison, 20, 84, 10.0, "trials"))
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",), "info": ("_info",)}
    return {
        family.name + suffix: family.type
        for registry in (metrics.registry, audit)
        for family in registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


def _metric_names(expression: str) -> set[str]:
    """The series names a PromQL expression selects: what is left once strings, label matchers,
    ranges, grouping clauses and PromQL's own words are taken out."""
    stripped = re.sub(r'"[^"]*"', "", expression)
    stripped = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", stripped)
    stripped = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", stripped)
    names = set(re.findall(r"(?<![\w.$])[a-zA-Z_:][\w:]*", stripped))
    return names - PROMQL_WORDS


def _label_names(expression: str) -> set[str]:
    matchers = re.findall(r"\{([^}]*)\}", re.sub(r'"[^"]*"', '""', expression))
    grouped = re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expression)
    return {label.strip() for part in matchers for label in re.findall(r"(\w+)\s*[=!]", part)} | {
        label.strip() for part in grouped for label in part.split(",") if label.strip()
    }


def _dashboard_expressions() -> list[str]:
    dashboard = _dashboard()
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    # label_values(METRIC, LABEL): the metric is what it selects.
    expressions += [
        re.sub(r"^label_values\((\w+), *\w+\)$", r"\1", variable["query"]["query"])
        for variable in dashboard["templating"]["list"]
        if variable["type"] == "query"
    ]
    return expressions


def test_metric_name_extraction_finds_what_it_must() -> None:
    expression = 'sum by (le, gen_ai_token_type) (rate(foo_bucket{state=~"a|b"}[5m] offset 5m)) / on (pod) bar > 0.5'
    assert _metric_names(expression) == {"foo_bucket", "bar"}
    assert _label_names(expression) == {"le", "gen_ai_token_type", "state"}


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_rules_and_dashboard_use_only_exported_metrics(source: str) -> None:
    exported = _exported_metrics()
    expressions = [rule["expr"] for rule in _rules()] if source == "rules" else _dashboard_expressions()
    assert expressions
    unknown = sorted({name for expression in expressions for name in _metric_names(expression)} - set(exported))
    assert not unknown, f"{source} ask for metrics nobody exports: {unknown}"
    labels = {label for expression in expressions for label in _label_names(expression)}
    known_labels = {"le", "route", "status", "decision", "tenant", "code", "check", "backend", "reason", "target",
                    "when", "gen_ai_token_type", "revision", "scope", "state", "regime", "lane", "finish_reason",
                    "gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_response_model",
                    "error_type", "outcome", "deployment"}
    assert labels - known_labels <= TARGET_LABELS, sorted(labels - known_labels - TARGET_LABELS)


def test_dashboard_covers_the_gateway_and_the_engine() -> None:
    asked = {name for expression in _dashboard_expressions() for name in _metric_names(expression)}
    for metric in (
        "tenantgate_requests_total",  # requests by outcome
        "gen_ai_server_request_duration_seconds_bucket",  # latency
        "gen_ai_server_time_to_first_token_seconds_bucket",
        "gen_ai_client_token_usage_sum",
        "tenantgate_tenant_tokens_total",  # tokens by tenant: a counter (no histogram carries the tenant)
        "gen_ai_server_time_per_output_token_seconds_bucket",
        "tenantgate_gateway_request_duration_seconds_bucket",  # the whole request, by route and outcome
        "tenantgate_quota_rejections_total",
        "tenantgate_policy_info",
        "tenantgate_kv_blocks",
        "tenantgate_prefix_cache_hit_tokens_total",
        "tenantgate_prefix_cache_hit_ratio",
        "tenantgate_engine_requests_running",
        "tenantgate_engine_requests_waiting",
        "tenantgate_engine_preemptions_total",
        "tenantgate_kv_cache_usage_ratio",
        "tenantgate_audit_sink_errors",
    ):
        assert metric in asked, metric
    panels = [panel for panel in _dashboard()["panels"] if panel["type"] != "row"]
    assert len({panel["id"] for panel in _dashboard()["panels"]}) == len(_dashboard()["panels"])
    for panel in panels:
        assert panel["targets"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


# -- Grafana's dashboard schema ---------------------------------------------------------------


def _check_dashboard(tools: Tools, path: Path):
    if not (VENV_INFRA / "grafana-foundation-sdk" / "grafana_foundation_sdk").exists():
        missing_tool("grafana-foundation-sdk not in .venv-infra; run scripts/install-infra-tools.sh")
    return run([tools.python, REPO / "tests" / "infra" / "check_dashboard.py", path])


def test_dashboard_fits_grafanas_dashboard_schema(tools: Tools) -> None:
    result = _check_dashboard(tools, DASHBOARD)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_check_reports_fields_the_schema_lacks(tools: Tools, tmp_path: Path) -> None:
    dashboard = _dashboard()
    dashboard["panels"][1]["gridpos"] = dashboard["panels"][1].pop("gridPos")
    dashboard["panels"][1]["targets"][0]["exprr"] = dashboard["panels"][1]["targets"][0].pop("expr")
    broken = tmp_path / "dashboard.json"
    broken.write_text(json.dumps(dashboard), encoding="utf-8")
    result = _check_dashboard(tools, broken)
    assert result.returncode == 1, result.stdout + result.stderr
    assert sorted(result.stdout.splitlines()) == [
        ".panels[1].gridpos: not in the schema",
        ".panels[1].targets[0].exprr: not in the schema",
    ]


# -- the landing zone -------------------------------------------------------------------------


@pytest.mark.parametrize("language", ["terraform", "bicep"])
def test_landing_zone_alerts_are_the_shipped_rules(tools: Tools, language: str) -> None:
    settings = extract_settings(tools, language, INFRA / language)
    azure_severity = {"critical": 1, "warning": 2, "info": 3}
    assert settings["prometheus_alerts"] == sorted(
        [rule["alert"], rule["expr"], azure_severity[rule["labels"]["severity"]]] for rule in _rules()
    )


def test_landing_zone_grafana_gets_the_charts_dashboard(tools: Tools) -> None:
    # No Azure resource holds a dashboard in Managed Grafana: the Terraform writes the chart's file
    # through Grafana's API, only when asked (Grafana is reachable from inside the network only),
    # with the token from the environment. The Bicep cannot; docs/deploy.md gives its step.
    settings = extract_settings(tools, "grafana", INFRA / "terraform")
    assert settings.pop("dashboard_file") == str(DASHBOARD.relative_to(REPO))
    provider = {"source": "grafana/grafana", "version": ">= 3.0, < 5.0"}
    example = {"provider": provider, "url": "${module.tenantgate.grafana_endpoint}", "auth_in_configuration": False,
               "enabled": False}
    assert settings == {
        "folder": ["tenantgate", "tenantgate"],
        "dashboard_in_folder": True,
        "overwrite": True,
        "only_when_enabled": True,
        "enabled_by_default": False,
        "waits_for_private_endpoints": True,
        "provider": provider,
        "examples": {"single-region": example, "two-region": example},
    }


def test_bicep_deployments_import_the_same_dashboard_into_the_same_folder() -> None:
    steps = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    imported = re.search(r"az grafana dashboard import (.+?)(?:\n\s*\n|```)", steps, re.DOTALL)
    assert imported, "docs/deploy.md has no az grafana dashboard import step"
    command = imported.group(1).replace("\\\n", " ")
    assert f"--definition {DASHBOARD.relative_to(REPO)}" in command
    assert "--folder tenantgate" in command and "--overwrite true" in command


# -- the chart --------------------------------------------------------------------------------


def _objects(text: str) -> list[dict]:
    return [document for document in yaml.safe_load_all(text) if document]


def _of_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"].removeprefix("tg-tenantgate"): o for o in objects if o["kind"] == kind}


def test_chart_ships_no_monitoring_objects_by_default(rendered_manifests: dict[str, Path]) -> None:
    for mode in ("embedded", "remote", "production"):
        objects = _objects(rendered_manifests[mode].read_text(encoding="utf-8"))
        assert not {"PodMonitor", "PrometheusRule"} & {o["kind"] for o in objects}, mode
        assert not [o for o in objects if "grafana_dashboard" in o["metadata"]["labels"]], mode


def test_pod_monitors_scrape_the_gateway_and_engine_metrics_ports(rendered_manifests: dict[str, Path]) -> None:
    objects = _objects(rendered_manifests["monitoring"].read_text(encoding="utf-8"))
    monitors = _of_kind(objects, "PodMonitor")
    assert set(monitors) == {"-gateway", "-engine"}
    workloads = {"-gateway": _of_kind(objects, "Deployment")["-gateway"],
                 "-engine": _of_kind(objects, "StatefulSet")["-engine"]}
    policies = _of_kind(objects, "NetworkPolicy")
    scraper = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}
    for name, monitor in monitors.items():
        assert monitor["apiVersion"] == "azmonitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
        spec = monitor["spec"]
        pod = workloads[name]["spec"]["template"]
        assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(), name
        assert spec["namespaceSelector"] == {"matchNames": ["tenantgate"]}
        ports = {port["name"]: port["containerPort"] for c in pod["spec"]["containers"] for port in c.get("ports", [])}
        # The gateway's two workers (its CPU request) each serve /metrics on a port of their own.
        endpoints = spec["podMetricsEndpoints"]
        assert [e["port"] for e in endpoints] == (["metrics", "metrics-1"] if name == "-gateway" else ["engine"])
        ingress = policies[f"{name}-ingress"]["spec"]["ingress"]
        for endpoint in endpoints:
            assert endpoint["path"] == "/metrics" and endpoint["interval"] == "30s"
            assert endpoint["port"] in ports, name
            number = ports[endpoint["port"]]
            # The scraper's namespace may reach that port.
            assert any(
                scraper in rule["from"] and any(p["port"] <= number <= p.get("endPort", p["port"])
                                                and p["protocol"] == "TCP" for p in rule["ports"])
                for rule in ingress
            ), (name, endpoint["port"])


def test_embedded_mode_monitors_the_gateway_only_with_the_operators_api_by_default(tools: Tools) -> None:
    result = render_chart(tools, "--set", "monitoring.podMonitor.enabled=true")
    assert result.returncode == 0, result.stderr
    monitors = _of_kind(_objects(result.stdout), "PodMonitor")
    assert set(monitors) == {"-gateway"}
    assert monitors["-gateway"]["apiVersion"] == "monitoring.coreos.com/v1"


def test_chart_refuses_an_unknown_pod_monitor_api(tools: Tools) -> None:
    result = render_chart(tools, "--set", "monitoring.podMonitor.enabled=true",
                          "--set", "monitoring.podMonitor.apiVersion=v1")
    assert result.returncode != 0
    assert "apiVersion" in result.stderr


def test_prometheus_rule_is_the_rules_file(rendered_manifests: dict[str, Path]) -> None:
    objects = _objects(rendered_manifests["monitoring"].read_text(encoding="utf-8"))
    rule = _of_kind(objects, "PrometheusRule")[""]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == yaml.safe_load(RULES.read_text(encoding="utf-8"))


def test_dashboard_config_map_holds_the_dashboard_for_grafanas_sidecar(rendered_manifests: dict[str, Path]) -> None:
    objects = _objects(rendered_manifests["monitoring"].read_text(encoding="utf-8"))
    config_map = _of_kind(objects, "ConfigMap")["-dashboard"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "tenantgate"}
    assert json.loads(config_map["data"]["tenantgate.json"]) == _dashboard()


def test_cache_audits_are_cron_jobs_that_push_to_the_pushgateway(rendered_manifests: dict[str, Path]) -> None:
    objects = _objects(rendered_manifests["monitoring"].read_text(encoding="utf-8"))
    jobs = _of_kind(objects, "CronJob")
    assert set(jobs) == {"-cache-audit-vllm-a", "-cache-audit-llamacpp"}
    assert jobs["-cache-audit-llamacpp"]["spec"]["schedule"] == "41 * * * *"
    job = jobs["-cache-audit-vllm-a"]["spec"]
    assert job["schedule"] == "17 3 * * *" and job["concurrencyPolicy"] == "Forbid"
    assert job["jobTemplate"]["spec"]["backoffLimit"] == 0  # a leak (exit 1) is not retried
    assert job["jobTemplate"]["spec"]["activeDeadlineSeconds"] == 900 + 300
    pod = job["jobTemplate"]["spec"]["template"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "cache-audit"
    assert pod["spec"]["automountServiceAccountToken"] is False and pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    [container] = pod["spec"]["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["command"] == ["tenantgate"]
    assert container["args"] == [
        "cache", "audit", "upstream", "--url=http://vllm.inference.svc.cluster.local:8000/v1",
        "--model=qwen2.5-7b-instruct", "--namespace-field=cache_salt", "--deployment=vllm-a", "--trials=30",
        "--max-requests=400", "--max-seconds=900", "--prefix-tokens=256",
        "--pushgateway=http://prometheus-pushgateway.monitoring.svc.cluster.local:9091",
        "--api-key-file=/mnt/api-key/api-key",
    ]
    # The API key as a file from the Secret, never in the environment.
    assert {"name": "api-key", "mountPath": "/mnt/api-key", "readOnly": True} in container["volumeMounts"]
    assert {"name": "api-key", "secret": {"secretName": "vllm-api-key", "items": [
        {"key": "api-key", "path": "api-key"}]}} in pod["spec"]["volumes"]
    assert "--api-key-file" not in " ".join(jobs["-cache-audit-llamacpp"]["spec"]["jobTemplate"]["spec"]["template"][
        "spec"]["containers"][0]["args"])
    # Out of the audit pods: the two upstreams' pods and the Pushgateway's, each on its URL's port.
    egress = _of_kind(objects, "NetworkPolicy")["-cache-audit-egress"]["spec"]
    assert egress["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "cache-audit"
    assert egress["policyTypes"] == ["Egress"]
    assert [(rule["to"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
             rule["to"][0]["podSelector"]["matchLabels"], rule["ports"][0]["port"]) for rule in egress["egress"]] == [
        ("inference", {"app": "vllm"}, 8000), ("inference", {"app": "llama-server"}, 8080),
        ("monitoring", {"app.kubernetes.io/name": "prometheus-pushgateway"}, 9091),
    ]


def test_chart_runs_no_cache_audit_by_default(rendered_manifests: dict[str, Path]) -> None:
    for mode in ("embedded", "remote", "production"):
        objects = _objects(rendered_manifests[mode].read_text(encoding="utf-8"))
        assert not [o for o in objects if "cache-audit" in o["metadata"]["name"]], mode
