"""The Helm chart: lints, renders, validates strictly against the Kubernetes schemas, and keeps
the properties the landing zone relies on (restricted pods, GPU placement, signed bundles,
deny-by-default networking, workload identity)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.infra.conftest import CHART, INFRA, KUBERNETES_VERSION, Tools, extract_settings, render_chart, run


def _objects(path: Path) -> list[dict]:
    return [document for document in yaml.safe_load_all(path.read_text(encoding="utf-8")) if document]


def _one(objects: list[dict], kind: str, name_suffix: str) -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
    assert len(matches) == 1, f"expected one {kind} *{name_suffix}, found {len(matches)}"
    return matches[0]


def _containers(objects: list[dict]) -> list[dict]:
    return [c for o in objects if o["kind"] == "Deployment" for c in o["spec"]["template"]["spec"]["containers"]]


def test_helm_lint_passes_strict(tools: Tools) -> None:
    result = run([tools.helm, "lint", CHART, "--strict", "--kube-version", KUBERNETES_VERSION])
    assert result.returncode == 0, result.stdout + result.stderr


def test_rendered_manifests_validate_strict(tools: Tools, rendered_manifests: dict[str, Path]) -> None:
    for mode, path in rendered_manifests.items():
        result = run([tools.kubernetes_validate, "--strict", "--kubernetes-version", KUBERNETES_VERSION, path])
        assert result.returncode == 0, f"{mode}:\n{result.stdout}{result.stderr}"
        # The one kind without a schema in kubernetes-validate is the CSI driver's CRD.
        warnings = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("WARN")]
        assert all("SecretProviderClass" in line for line in warnings), warnings
        passed = [line for line in result.stdout.splitlines() if line.startswith("INFO") and "passed" in line]
        assert len(passed) == len(_objects(path)) - 1, f"{mode}: not every object was validated"


def test_pods_run_with_restricted_security(rendered_manifests: dict[str, Path]) -> None:
    for mode, path in rendered_manifests.items():
        objects = _objects(path)
        for deployment in (o for o in objects if o["kind"] == "Deployment"):
            pod = deployment["spec"]["template"]["spec"]
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
    expectations = {"embedded": ("-gateway", "nvidia.com/gpu"), "remote": ("-engine", "nvidia.com/gpu"), "mig": ("-gateway", "nvidia.com/mig-1g.10gb")}
    for mode, (deployment_suffix, resource) in expectations.items():
        objects = _objects(rendered_manifests[mode])
        pod = _one(objects, "Deployment", deployment_suffix)["spec"]["template"]["spec"]
        engine = pod["containers"][0]
        assert engine["resources"]["limits"][resource] == 1, mode
        assert pod["nodeSelector"] == {"tenantgate.io/pool": "gpu"}, mode
        assert {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"} in pod["tolerations"]
    # With a remote engine the gateway asks for no GPU.
    gateway = _one(_objects(rendered_manifests["remote"]), "Deployment", "-gateway")
    assert not any(key.startswith("nvidia.com/") for key in gateway["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"])


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
    credentials = config["services"][bundle["service"]]["credentials"]["oauth2"]
    assert credentials["client_assertion_path"] == "/var/run/secrets/azure/tokens/azure-identity-token"
    gateway = next(c for c in pod["containers"] if c["name"] == "gateway")
    env = {item["name"]: item.get("value") for item in gateway["env"]}
    assert env["TENANTGATE_POLICY_BACKEND"] == "opa"
    assert env["TENANTGATE_OPA_URL"] == "http://127.0.0.1:8181"
    assert env["TENANTGATE_ENVIRONMENT"] == "production"


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
    policies = {o["metadata"]["name"].removeprefix("tg-tenantgate-"): o["spec"] for o in objects if o["kind"] == "NetworkPolicy"}
    assert policies["default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    egress = policies["gateway-egress"]["egress"]
    ports = {port["port"] for rule in egress for port in rule["ports"]}
    assert ports == {10000, 443, 8100}, "gateway -> Redis, Entra ID/bundles, engine"
    engine_from = policies["engine-ingress"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert engine_from["app.kubernetes.io/component"] == "gateway", "only the gateway reaches the engine"
    assert "engine-ingress" not in {
        o["metadata"]["name"].removeprefix("tg-tenantgate-") for o in _objects(rendered_manifests["embedded"]) if o["kind"] == "NetworkPolicy"
    }


def test_gateway_scales_and_survives_disruption(rendered_manifests: dict[str, Path]) -> None:
    objects = _objects(rendered_manifests["embedded"])
    autoscaler = _one(objects, "HorizontalPodAutoscaler", "-gateway")["spec"]
    assert autoscaler["minReplicas"] >= 2 and autoscaler["maxReplicas"] >= autoscaler["minReplicas"]
    assert _one(objects, "PodDisruptionBudget", "-gateway")["spec"]["minAvailable"] >= 1
    service = _one(objects, "Service", "-gateway")["spec"]
    assert {port["name"] for port in service["ports"]} == {"http", "metrics"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (("--set", "engine.mode=remote"), "engine.args"),
        (("--set", "engine.mode=sidecar"), "/engine/mode"),
        (("--set", "gateway.settings.environment=development"), "/gateway/settings/environment"),
        (("--set", "image.tag=latest"), "/image/tag"),
        (("--set", "gateway.settings.redisUrl=redis://plain:6379"), "/gateway/settings/redisUrl"),
    ],
)
def test_chart_refuses_unsafe_or_incomplete_values(tools: Tools, values: tuple[str, ...], message: str) -> None:
    result = render_chart(tools, *values)
    assert result.returncode != 0
    assert message in result.stderr
