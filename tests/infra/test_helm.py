"""The Helm chart: lints, renders, validates strictly against the Kubernetes schemas, and keeps
the properties the landing zone relies on (restricted pods, GPU placement, signed bundles,
deny-by-default networking, workload identity)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gateway.deployments.config import parse_deployments
from gateway.tracing import tracer_provider
from tests.infra.conftest import (
    CHART,
    INFRA,
    KUBERNETES_VERSION,
    RENDER_MODES,
    UPSTREAMS_VALUES,
    Tools,
    extract_settings,
    render_chart,
    run,
)

WORKLOADS = ("Deployment", "StatefulSet")
# Kinds from CRDs, for which kubernetes-validate bundles no schema: the CSI driver's, Gateway API's
# and the Prometheus Operator's (tests/infra/test_alerts.py checks those).
CUSTOM_KINDS = {"SecretProviderClass", "HTTPRoute", "PodMonitor", "PrometheusRule"}


def _objects(path: Path) -> list[dict]:
    return [document for document in yaml.safe_load_all(path.read_text(encoding="utf-8")) if document]


def _one(objects: list[dict], kind: str, name_suffix: str) -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
    assert len(matches) == 1, f"expected one {kind} *{name_suffix}, found {len(matches)}"
    return matches[0]


def _containers(objects: list[dict]) -> list[dict]:
    return [c for o in objects if o["kind"] in WORKLOADS for c in o["spec"]["template"]["spec"]["containers"]]


def _env(container: dict) -> dict[str, str | None]:
    return {item["name"]: item.get("value") for item in container.get("env", [])}


@pytest.mark.parametrize("mode", list(RENDER_MODES))
def test_helm_lint_passes_strict(tools: Tools, mode: str) -> None:
    result = run([tools.helm, "lint", CHART, "--strict", "--kube-version", KUBERNETES_VERSION, *RENDER_MODES[mode]])
    assert result.returncode == 0, result.stdout + result.stderr


def test_rendered_manifests_validate_strict(tools: Tools, rendered_manifests: dict[str, Path]) -> None:
    for mode, path in rendered_manifests.items():
        result = run([tools.kubernetes_validate, "--strict", "--kubernetes-version", KUBERNETES_VERSION, path])
        assert result.returncode == 0, f"{mode}:\n{result.stdout}{result.stderr}"
        # The only kinds without a schema in kubernetes-validate are the CRDs' (checked below).
        warnings = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("WARN")]
        assert all(any(f"kind {kind} " in line for kind in CUSTOM_KINDS) for line in warnings), warnings
        passed = [line for line in result.stdout.splitlines() if line.startswith("INFO") and "passed" in line]
        builtin = [o for o in _objects(path) if o["kind"] not in CUSTOM_KINDS]
        assert len(passed) == len(builtin), f"{mode}: not every object was validated"


def test_pods_run_with_restricted_security(rendered_manifests: dict[str, Path]) -> None:
    for mode, path in rendered_manifests.items():
        objects = _objects(path)
        for workload in (o for o in objects if o["kind"] in WORKLOADS):
            pod = workload["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True, mode
            assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", mode
            assert pod["automountServiceAccountToken"] is False, mode
        for container in _containers(objects):
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True and context["runAsUser"] >= 10000, container["name"]
            assert context["readOnlyRootFilesystem"] is True, container["name"]
            assert context["allowPrivilegeEscalation"] is False, container["name"]
            assert context["capabilities"]["drop"] == ["ALL"], container["name"]
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][bound]), (container["name"], bound)


def test_engine_runs_on_the_gpu_pool(rendered_manifests: dict[str, Path]) -> None:
    expectations = {
        "embedded": ("Deployment", "-gateway", "nvidia.com/gpu"),
        "remote": ("StatefulSet", "-engine", "nvidia.com/gpu"),
        "mig": ("Deployment", "-gateway", "nvidia.com/mig-1g.10gb"),
    }
    for mode, (kind, name_suffix, resource) in expectations.items():
        objects = _objects(rendered_manifests[mode])
        pod = _one(objects, kind, name_suffix)["spec"]["template"]["spec"]
        engine = pod["containers"][0]
        assert engine["resources"]["limits"][resource] == 1, mode
        assert pod["nodeSelector"] == {"tenantgate.io/pool": "gpu"}, mode
        assert {
            "key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule",
        } in pod["tolerations"]
    # With a remote engine the gateway asks for no GPU.
    gateway = _one(_objects(rendered_manifests["remote"]), "Deployment", "-gateway")
    limits = gateway["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert not any(key.startswith("nvidia.com/") for key in limits)


def test_landing_zone_gpu_taint_matches_the_chart_toleration(tools: Tools, rendered_manifests: dict[str, Path]) -> None:
    taints = extract_settings(tools, "terraform", INFRA / "terraform")["aks"]["gpu_pool"]["taints"]
    pod = _one(_objects(rendered_manifests["embedded"]), "Deployment", "-gateway")["spec"]["template"]["spec"]
    tolerated = {f"{t['key']}={t['value']}:{t['effect']}" for t in pod["tolerations"]}
    assert set(taints) <= tolerated


def test_opa_sidecar_loads_only_signed_bundles(rendered_manifests: dict[str, Path]) -> None:
    objects = _objects(rendered_manifests["embedded"])
    pod = _one(objects, "Deployment", "-gateway")["spec"]["template"]["spec"]
    opa = next(c for c in pod["containers"] if c["name"] == "opa")
    assert opa["image"] == "openpolicyagent/opa:1.22.3-static"
    assert opa["readinessProbe"]["httpGet"]["path"] == "/health?bundles"
    assert "--addr=127.0.0.1:8181" in opa["args"], "the decision API must stay on loopback"
    config = yaml.safe_load(_one(objects, "ConfigMap", "-opa")["data"]["config.yaml"])
    bundle = config["bundles"]["tenantgate"]
    assert bundle["signing"]["keyid"] in config["keys"]
    assert "BEGIN PUBLIC KEY" in config["keys"][bundle["signing"]["keyid"]]["key"]
    assert config["keys"][bundle["signing"]["keyid"]]["algorithm"] == "ES256", "docs/deploy.md's P-256 key"
    # Either plugin, configured at all, would post to the only service: the bundle store.
    assert not {"decision_logs", "status"} & set(config)
    credentials = config["services"][bundle["service"]]["credentials"]["oauth2"]
    assert credentials["client_assertion_path"] == "/var/run/secrets/azure/tokens/azure-identity-token"
    gateway = next(c for c in pod["containers"] if c["name"] == "gateway")
    env = {item["name"]: item.get("value") for item in gateway["env"]}
    assert env["TENANTGATE_POLICY_BACKEND"] == "opa"
    assert env["TENANTGATE_OPA_URL"] == "http://127.0.0.1:8181"
    assert env["TENANTGATE_ENVIRONMENT"] == "production"


def test_operators_come_from_the_deployments_own_tenant_unless_named(tools: Tools,
                                                                     rendered_manifests: dict[str, Path]) -> None:
    """A customer tenant's TenantGate.Operator role must not open /admin: the chart always names
    the platform tenant(s), by default the deployment's own (azure.tenantId)."""
    def operator_tenants(objects: list[dict]) -> str | None:
        return _env(_one(objects, "Deployment", "-gateway")["spec"]["template"]["spec"]["containers"][0])[
            "TENANTGATE_OPERATOR_TENANTS"]

    assert operator_tenants(_objects(rendered_manifests["production"])) == "33333333-3333-3333-3333-333333333333"
    named = "AAAAAAAA-0000-4000-8000-00000000000A,bbbbbbbb-0000-4000-8000-00000000000b"
    result = render_chart(tools, *RENDER_MODES["production"], "--set",
                          "gateway.settings.operatorTenants=" + named.replace(",", "\\,"))
    assert result.returncode == 0, result.stderr
    assert operator_tenants([d for d in yaml.safe_load_all(result.stdout) if d]) == named.lower()


def test_namespace_secret_comes_from_key_vault(rendered_manifests: dict[str, Path]) -> None:
    objects = _objects(rendered_manifests["embedded"])
    provider = _one(objects, "SecretProviderClass", "-keyvault")
    assert provider["spec"]["parameters"]["usePodIdentity"] == "false"
    synced = provider["spec"]["secretObjects"][0]["secretName"]
    gateway = _one(objects, "Deployment", "-gateway")["spec"]["template"]["spec"]["containers"][0]
    secret_env = next(item for item in gateway["env"] if item["name"] == "TENANTGATE_NAMESPACE_SECRET")
    assert secret_env["valueFrom"]["secretKeyRef"]["name"] == synced
    assert not [o for o in objects if o["kind"] == "Secret"], "the chart must not carry secrets"


def test_service_account_is_the_federated_one(tools: Tools, rendered_manifests: dict[str, Path]) -> None:
    namespace, name = extract_settings(tools, "terraform", INFRA / "terraform")["workload_identity"]["service_account"]
    objects = _objects(rendered_manifests["embedded"])
    account = _one(objects, "ServiceAccount", name)
    assert account["metadata"]["name"] == name
    assert "azure.workload.identity/client-id" in account["metadata"]["annotations"]
    pod = _one(objects, "Deployment", "-gateway")["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == name
    assert pod["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    assert namespace == "tenantgate", "docs/deploy.md installs the chart into the tenantgate namespace"


def test_network_policies_deny_by_default_and_allow_only_the_gateway_paths(rendered_manifests: dict[str, Path]) -> None:
    objects = _objects(rendered_manifests["remote"])
    policies = {
        o["metadata"]["name"].removeprefix("tg-tenantgate-"): o["spec"] for o in objects if o["kind"] == "NetworkPolicy"
    }
    assert policies["default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    egress = policies["gateway-egress"]["egress"]
    ports = {port["port"] for rule in egress for port in rule["ports"]}
    assert ports == {10000, 443, 8100}, "gateway -> Redis, Entra ID/bundles, engine"
    engine_ingress = policies["engine-ingress"]["ingress"]
    assert [rule["ports"] for rule in engine_ingress] == [[{"port": 8100, "protocol": "TCP"}]] * 2
    engine_from = engine_ingress[0]["from"][0]["podSelector"]["matchLabels"]
    assert engine_from["app.kubernetes.io/component"] == "gateway", "only the gateway reaches the engine"
    assert engine_ingress[1]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}
    ], "and metrics scrapes"
    assert "engine-egress" not in policies, "engines send nothing but DNS"
    assert "engine-ingress" not in {
        o["metadata"]["name"].removeprefix("tg-tenantgate-")
        for o in _objects(rendered_manifests["embedded"])
        if o["kind"] == "NetworkPolicy"
    }


def _gateway_egress_to(objects: list[dict], namespace: str) -> list[dict]:
    egress = _one(objects, "NetworkPolicy", "-gateway-egress")["spec"]["egress"]
    return [rule for rule in egress if any(
        peer.get("namespaceSelector", {}).get("matchLabels") == {"kubernetes.io/metadata.name": namespace}
        for peer in rule["to"])]


@pytest.mark.parametrize("mode", [mode for mode in RENDER_MODES if mode != "monitoring"])
def test_traces_are_off_by_default_and_no_collector_is_reachable(mode: str,
                                                                 rendered_manifests: dict[str, Path]) -> None:
    objects = _objects(rendered_manifests[mode])
    assert not [
        name for container in _containers(objects) for name in _env(container) if name.startswith("OTEL_")
    ], mode
    assert not _gateway_egress_to(objects, "observability"), mode
    ports = {
        port["port"] for rule in _one(objects, "NetworkPolicy", "-gateway-egress")["spec"]["egress"]
        for port in rule["ports"]
    }
    assert 4318 not in ports, mode


def test_tracing_sets_the_otel_variables_and_opens_only_the_collector(
    rendered_manifests: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = _objects(rendered_manifests["monitoring"])  # tracing on, tests/infra/values/monitoring.yaml
    gateway = _one(objects, "Deployment", "-gateway")["spec"]["template"]["spec"]["containers"][0]
    otel = {name: value for name, value in _env(gateway).items() if name.startswith("OTEL_")}
    assert otel == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.observability.svc.cluster.local:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "tenantgate",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=production,service.namespace=tenantgate",
    }
    # Engines export no spans of their own, so they get no OTEL_* and no way out.
    engine = _one(objects, "StatefulSet", "-engine")["spec"]["template"]["spec"]["containers"][0]
    assert not [name for name in _env(engine) if name.startswith("OTEL_")]
    assert _gateway_egress_to(objects, "observability") == [{
        "to": [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "opentelemetry-collector"}},
        }],
        "ports": [{"port": 4318, "protocol": "TCP"}],
    }]  # fmt: skip

    # The gateway reads what the chart rendered as the tracing it means.
    for name, value in otel.items():
        monkeypatch.setenv(name, value)
    provider = tracer_provider()
    assert provider is not None
    try:
        attributes = provider.resource.attributes
        assert (attributes["service.name"], attributes["deployment.environment.name"]) == ("tenantgate", "production")
        assert "TraceIdRatioBased{0.25}" in provider.sampler.get_description()
    finally:
        provider.shutdown()


def test_gateway_scales_and_survives_disruption(rendered_manifests: dict[str, Path]) -> None:
    objects = _objects(rendered_manifests["embedded"])
    autoscaler = _one(objects, "HorizontalPodAutoscaler", "-gateway")["spec"]
    assert autoscaler["minReplicas"] >= 2 and autoscaler["maxReplicas"] >= autoscaler["minReplicas"]
    assert _one(objects, "PodDisruptionBudget", "-gateway")["spec"]["minAvailable"] >= 1
    service = _one(objects, "Service", "-gateway")["spec"]
    assert {port["name"] for port in service["ports"]} == {"http", "metrics"}


def test_ingress_takes_its_certificate_from_key_vault_through_the_app_routing_add_on(
    rendered_manifests: dict[str, Path],
) -> None:
    objects = _objects(rendered_manifests["embedded"])
    ingress = _one(objects, "Ingress", "tg-tenantgate")
    vault = _one(objects, "SecretProviderClass", "-keyvault")["spec"]["parameters"]["keyvaultName"]
    # Unversioned, so the add-on picks up a renewed certificate.
    uri = ingress["metadata"]["annotations"]["kubernetes.azure.com/tls-cert-keyvault-uri"]
    assert uri == f"https://{vault}.vault.azure.net/certificates/tenantgate-ingress-tls"
    # The add-on writes the certificate to keyvault-<ingress name>, and only there.
    (tls,) = ingress["spec"]["tls"]
    assert tls["secretName"] == "keyvault-" + ingress["metadata"]["name"]
    assert tls["hosts"] == [rule["host"] for rule in ingress["spec"]["rules"]]


@pytest.mark.parametrize(("values", "workers"), [
    ((), 1),  # the embedded engine: one process, whatever the CPU request
    (("--set", "engine.mode=remote"), 2),  # the whole cores of the default request, "2"
    (("--set", "engine.mode=remote", "--set", "gateway.resources.requests.cpu=3500m"), 3),
    (("--set", "engine.mode=remote", "--set", "gateway.resources.requests.cpu=250m"), 1),
    (("--set", "engine.mode=remote", "--set", "gateway.workers=4"), 4),
])
def test_gateway_workers_follow_the_cpu_request_and_each_has_a_metrics_port(
        tools: Tools, values: tuple[str, ...], workers: int) -> None:
    result = render_chart(tools, *values)
    assert result.returncode == 0, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    gateway = _one(objects, "Deployment", "-gateway")["spec"]["template"]["spec"]["containers"][0]
    assert _env(gateway)["TENANTGATE_WORKERS"] == str(workers)
    assert [(p["name"], p["containerPort"]) for p in gateway["ports"] if p["name"].startswith("metrics")] == [
        ("metrics", 9100), *[(f"metrics-{i}", 9100 + i) for i in range(1, workers)]]
    policy = _one(objects, "NetworkPolicy", "-gateway-ingress")
    metrics = [port for rule in policy["spec"]["ingress"] for port in rule["ports"] if port["port"] == 9100]
    assert metrics == [{"port": 9100, "protocol": "TCP"} | ({"endPort": 9099 + workers} if workers > 1 else {})]


def test_gateway_pods_drain_before_they_stop(rendered_manifests: dict[str, Path]) -> None:
    from gateway.settings import Settings

    for mode in ("embedded", "remote"):
        pod = _one(_objects(rendered_manifests[mode]), "Deployment", "-gateway")["spec"]["template"]["spec"]
        containers = {c["name"]: c for c in pod["containers"]}
        pause = {name: c["lifecycle"]["preStop"]["sleep"]["seconds"] for name, c in containers.items()}
        drain = float(_env(containers["gateway"]).get("TENANTGATE_SHUTDOWN_TIMEOUT_S") or Settings().shutdown_timeout_s)
        # The gateway leaves the endpoints before SIGTERM; OPA answers until the gateway's drain is over.
        assert pause["gateway"] >= 5, mode
        assert pause["opa"] >= pause["gateway"] + drain, mode
        assert pod["terminationGracePeriodSeconds"] > pause["opa"], mode


def _deployments_file(objects: list[dict]) -> dict:
    """The gateway's deployments file as the gateway finds it: the env var's path, in a mounted ConfigMap."""
    pod = _one(objects, "Deployment", "-gateway")["spec"]["template"]["spec"]
    path = Path(_env(pod["containers"][0])["TENANTGATE_DEPLOYMENTS_FILE"])
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if Path(m["mountPath"]) == path.parent)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    config_map = _one(objects, "ConfigMap", volume["configMap"]["name"])
    return config_map["data"][path.name]


def _engine_replica_urls(objects: list[dict], namespace: str = "tenantgate") -> list[str]:
    engines = _one(objects, "StatefulSet", "-engine")
    headless = _one(objects, "Service", "-engine")
    assert headless["spec"]["clusterIP"] == "None" and engines["spec"]["serviceName"] == headless["metadata"]["name"]
    port = engines["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    name, service = engines["metadata"]["name"], headless["metadata"]["name"]
    return [
        f"http://{name}-{i}.{service}.{namespace}.svc.cluster.local:{port}" for i in range(engines["spec"]["replicas"])
    ]


def _csi_objects(provider: dict) -> list[dict]:
    return [yaml.safe_load(item) for item in yaml.safe_load(provider["spec"]["parameters"]["objects"])["array"]]


@pytest.mark.parametrize("mode", ["remote", "upstreams"])
def test_deployments_file_lists_each_engine_replica_by_its_stable_name(mode: str,
                                                                       rendered_manifests: dict[str, Path]) -> None:
    objects = _objects(rendered_manifests[mode])
    deployments = parse_deployments(_deployments_file(objects))
    engines = deployments.models_of_kind("tenantgate")
    assert len(engines) == 1
    assert engines[0].replicas == _engine_replica_urls(objects)
    assert len(engines[0].replicas) == (3 if mode == "upstreams" else 2)


def test_deployments_file_routes_a_model_to_its_inference_pool_and_the_values_upstreams(
    rendered_manifests: dict[str, Path],
) -> None:
    objects = _objects(rendered_manifests["upstreams"])
    values = yaml.safe_load(UPSTREAMS_VALUES.read_text(encoding="utf-8"))
    pool = values["inferencePools"][0]
    deployments = parse_deployments(_deployments_file(objects))
    assert set(deployments.models) == {values["engine"]["model"], pool["model"]}
    via_pool, fallback = deployments.models[pool["model"]]
    assert (via_pool.kind, via_pool.dialect, via_pool.url) == ("openai", "vllm", pool["url"])
    assert via_pool.upstream_model == pool["upstreamModel"] and via_pool.batch_invariant is True
    assert fallback.name == "vllm-fallback"
    assert deployments.models[values["engine"]["model"]][0].first_token_timeout_s == 30
    # Every API key file is one the gateway's Key Vault volume holds.
    gateway_pod = _one(objects, "Deployment", "-gateway")["spec"]["template"]["spec"]
    secrets_dir = next(m["mountPath"] for m in gateway_pod["containers"][0]["volumeMounts"] if m["name"] == "keyvault")
    mounted = {
        f"{secrets_dir}/{o.get('objectAlias', o['objectName'])}"
        for o in _csi_objects(_one(objects, "SecretProviderClass", "-keyvault"))
    }
    assert {str(via_pool.api_key_file), str(fallback.api_key_file)} <= mounted


def test_embedded_default_has_no_deployments_file(rendered_manifests: dict[str, Path]) -> None:
    objects = _objects(rendered_manifests["embedded"])
    gateway = _one(objects, "Deployment", "-gateway")["spec"]["template"]["spec"]["containers"][0]
    assert "TENANTGATE_DEPLOYMENTS_FILE" not in _env(gateway)
    assert not [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-deployments")]


def test_embedded_engine_with_an_inference_pool_keeps_serving_its_own_model(tools: Tools) -> None:
    pool = {"model": "llama", "poolName": "pool", "gateway": {"name": "igw"}, "url": "https://igw.example/v1"}
    result = render_chart(tools, "--set-json", f"inferencePools=[{json.dumps(pool)}]")
    assert result.returncode == 0, result.stderr
    deployments = parse_deployments(_deployments_file([o for o in yaml.safe_load_all(result.stdout) if o]))
    assert [d.kind for d in deployments.models["demo"]] == ["embedded"]
    assert deployments.models["llama"][0].url == "https://igw.example/v1"


@pytest.mark.parametrize("mode", ["remote", "upstreams"])
def test_engines_mount_only_the_envelope_public_keys(mode: str, rendered_manifests: dict[str, Path]) -> None:
    objects = _objects(rendered_manifests[mode])
    values = yaml.safe_load(UPSTREAMS_VALUES.read_text(encoding="utf-8")) if mode == "upstreams" else {}
    public_keys = values.get("azure", {}).get("envelopePublicKeySecretNames", ["tenantgate-envelope-public-key"])
    providers = {o["metadata"]["name"]: o for o in objects if o["kind"] == "SecretProviderClass"}

    pod = _one(objects, "StatefulSet", "-engine")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    engine = pod["containers"][0]
    assert not [item for item in engine["env"] if "valueFrom" in item] and "envFrom" not in engine
    csi = [v for v in pod["volumes"] if "csi" in v]
    assert {tuple(sorted(v)) for v in pod["volumes"]} <= {("emptyDir", "name"), ("csi", "name")}, (
        "no Secret or other volume"
    )
    assert len(csi) == 1
    engine_provider = providers[csi[0]["csi"]["volumeAttributes"]["secretProviderClass"]]
    assert [o["objectName"] for o in _csi_objects(engine_provider)] == public_keys
    assert "secretObjects" not in engine_provider["spec"], "the public keys stay files; nothing is synced"
    mount = next(m for m in engine["volumeMounts"] if m["name"] == csi[0]["name"])
    assert _env(engine)["TENANTGATE_ENGINE_ENVELOPE_PUBLIC_KEYS"] == mount["mountPath"]

    # The private key is in the gateway's class only, where TENANTGATE_ENVELOPE_SIGNING_KEY finds it.
    gateway_pod = _one(objects, "Deployment", "-gateway")["spec"]["template"]["spec"]
    gateway_volume = next(v for v in gateway_pod["volumes"] if "csi" in v)
    gateway_provider = providers[gateway_volume["csi"]["volumeAttributes"]["secretProviderClass"]]
    signing = next(o for o in _csi_objects(gateway_provider) if o["objectName"] == "tenantgate-envelope-signing-key")
    secrets_dir = next(m["mountPath"] for m in gateway_pod["containers"][0]["volumeMounts"] if m["name"] == "keyvault")
    signing_key = _env(gateway_pod["containers"][0])["TENANTGATE_ENVELOPE_SIGNING_KEY"]
    assert signing_key == f"{secrets_dir}/{signing['objectAlias']}"
    assert engine_provider is not gateway_provider
    assert "tenantgate-envelope-signing-key" not in json.dumps(engine_provider)


def test_engines_read_key_vault_with_their_own_identity_when_given_one(rendered_manifests: dict[str, Path]) -> None:
    objects = _objects(rendered_manifests["upstreams"])
    pod = _one(objects, "StatefulSet", "-engine")["spec"]["template"]["spec"]
    account = _one(objects, "ServiceAccount", pod["serviceAccountName"])
    assert account["metadata"]["name"] == "tenantgate-engine"
    client_id = account["metadata"]["annotations"]["azure.workload.identity/client-id"]
    assert _one(objects, "SecretProviderClass", "-engine-keys")["spec"]["parameters"]["clientID"] == client_id
    assert client_id != _one(objects, "SecretProviderClass", "-keyvault")["spec"]["parameters"]["clientID"]
    # Without one, the engines use the gateway's account (the CSI driver's reads only; no token in the pod).
    remote = _one(_objects(rendered_manifests["remote"]), "StatefulSet", "-engine")["spec"]["template"]["spec"]
    assert remote["serviceAccountName"] == "tenantgate-gateway"


def test_inference_pool_is_the_backend_of_a_route_on_the_existing_gateway(rendered_manifests: dict[str, Path]) -> None:
    objects = _objects(rendered_manifests["upstreams"])
    pool = yaml.safe_load(UPSTREAMS_VALUES.read_text(encoding="utf-8"))["inferencePools"][0]
    route = _one(objects, "HTTPRoute", pool["poolName"])
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["metadata"]["namespace"] == pool["poolNamespace"], "beside the pool: no ReferenceGrant needed"
    (parent,) = route["spec"]["parentRefs"]
    assert parent == {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": pool["gateway"]["name"],
                      "namespace": pool["poolNamespace"], "sectionName": pool["gateway"]["sectionName"]}
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": pool["poolName"]}
    ]
    (match,) = rule["matches"]
    assert match["path"] == {"type": "PathPrefix", "value": "/v1"}
    assert match["headers"] == [{"type": "Exact", "name": "X-Gateway-Model-Name", "value": pool["upstreamModel"]}]
    assert rule["timeouts"]["request"] == "600s", "the deployment's timeout_s"
    # The gateway may reach the inference Gateway's proxies on the URL's port, and nothing more there.
    egress = _one(objects, "NetworkPolicy", "-gateway-egress")["spec"]["egress"]
    to_pool = [rule for rule in egress if any(
        peer.get("namespaceSelector", {}).get("matchLabels") == {"kubernetes.io/metadata.name": pool["poolNamespace"]}
        for peer in rule["to"])]
    assert len(to_pool) == 1
    assert to_pool[0]["to"][0]["podSelector"]["matchLabels"] == pool["gateway"]["podLabels"]
    assert to_pool[0]["ports"] == [{"port": 80, "protocol": "TCP"}]
    assert not [o for o in _objects(rendered_manifests["remote"]) if o["kind"] == "HTTPRoute"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (("--set", "engine.mode=remote", "--set", "engine.replicas=0"), "/engine/replicas"),
        (
            ("--set", "engine.mode=remote", "--set", "azure.envelopePublicKeySecretNames=null"),
            "envelopePublicKeySecretNames",
        ),
        (
            ("--set-json", 'inferencePools=[{"model": "m", "poolName": "p", "url": "http://igw/v1"}]'),
            "/inferencePools/0",
        ),
        (
            ("--set-json", 'inferencePools=[{"model": "m", "poolName": "p", "gateway": {"name": "g"}, "url": "igw"}]'),
            "/inferencePools/0/url",
        ),
        (
            (
                "--set-json",
                'deployments={"m": [{"name": "v", "kind": "openai", "dialect": "vllm", "url": "http://v/v1", '
                '"api_key_file": "/etc/key"}]}',
            ),
            "api_key_file /etc/key is not mounted",
        ),
        (("--set", "engine.mode=sidecar"), "/engine/mode"),
        (("--set", "gateway.settings.environment=development"), "/gateway/settings/environment"),
        (("--set", "image.tag=latest"), "/image/tag"),
        (("--set", "gateway.settings.redisUrl=redis://plain:6379"), "/gateway/settings/redisUrl"),
        (("--set", "engine.mode=remote", "--set", "gateway.settings.redisUrl=null"), "gateway workers > 1 need"),
        (("--set", "gateway.workers=65"), "/gateway/workers"),
        (("--set", "opa.bundle.algorithm=HS256"), "/opa/bundle/algorithm"),
        (("--set", "gateway.settings.authority=http://login.example"), "/gateway/settings/authority"),
        (("--set", "gateway.settings.redisEntra=null"), "redisEntra"),
        (("--set", "gateway.settings.operatorTenants=northwind"), "/gateway/settings/operatorTenants"),
        (("--set", "ingress.keyVaultCertificateName="), "/ingress/keyVaultCertificateName"),
        # OTLP over gRPC is refused by the gateway at start-up; the chart refuses it first.
        (
            ("--set", "tracing.enabled=true", "--set", "tracing.endpoint=grpc://otel-collector:4317"),
            "/tracing/endpoint",
        ),
        (("--set", "tracing.sampler=jaeger_remote"), "/tracing/sampler"),
        (("--set", "tracing.samplerArg=ten"), "/tracing/samplerArg"),
    ],
)
def test_chart_refuses_unsafe_or_incomplete_values(tools: Tools, values: tuple[str, ...], message: str) -> None:
    result = render_chart(tools, *values)
    assert result.returncode != 0
    assert message in result.stderr
