"""The Helm chart's MCP servers: the servers file in a ConfigMap as the deployments file is (the
gateway parses it), mounted and named in the gateway's environment, and egress from the gateway
pods only to the declared servers."""

from __future__ import annotations

import json

import pytest
import yaml

from gateway.mcp import McpConfigError
from gateway.mcp.config import parse_servers
from tests.infra.conftest import CHART, KUBERNETES_VERSION, REPO, Tools, require_go_binary, run

MCP_VALUES = REPO / "tests" / "infra" / "values" / "mcp.yaml"


@pytest.fixture(scope="module")
def helm() -> str:
    """helm alone (these tests need none of the other infra tools)."""
    return str(require_go_binary("helm"))


def render(helm: str, *extra: str):
    return run([helm, "template", "tg", CHART, "--namespace", "tenantgate", "--kube-version", KUBERNETES_VERSION,
                *extra])


@pytest.fixture(scope="module")
def objects(helm: str) -> list[dict]:
    result = render(helm, "--values", str(MCP_VALUES))
    assert result.returncode == 0, result.stderr
    return [o for o in yaml.safe_load_all(result.stdout) if o]


def _named(objects: list[dict], kind: str, suffix: str) -> dict:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    return found


def test_the_servers_file_is_what_the_gateway_reads(objects: list[dict]) -> None:
    document = _named(objects, "ConfigMap", "-mcp-servers")["data"]["mcp-servers.json"]
    servers = parse_servers(document).servers
    assert [(s.name, s.url) for s in servers] == [
        ("github", "http://github-mcp.tools.svc.cluster.local:8080/mcp"), ("search", "https://search.example.com/mcp")]
    assert servers[1].api_key_file is not None and str(servers[1].api_key_file) == "/mnt/secrets-store/search-mcp-key"
    pod = _named(objects, "Deployment", "-gateway")["spec"]["template"]
    gateway = pod["spec"]["containers"][0]
    env = {item["name"]: item.get("value") for item in gateway["env"]}
    mount = next(m for m in gateway["volumeMounts"] if m["name"] == "mcp-servers")
    assert env["TENANTGATE_MCP_SERVERS_FILE"] == mount["mountPath"] + "/mcp-servers.json"
    assert "checksum/mcp-servers" in pod["metadata"]["annotations"]  # a changed file restarts the gateways


def test_gateway_egress_reaches_only_the_declared_servers(objects: list[dict]) -> None:
    policy = _named(objects, "NetworkPolicy", "-gateway-mcp-egress")["spec"]
    assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "gateway"
    assert policy["egress"] == [
        {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tools"}},
                 "podSelector": {"matchLabels": {"app": "github-mcp"}}}],
         "ports": [{"port": 8080, "protocol": "TCP"}]},
        {"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}], "ports": [{"port": 443, "protocol": "TCP"}]},
    ]


def test_manifests_validate_strict(tools: Tools, objects: list[dict], tmp_path) -> None:
    path = tmp_path / "mcp.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    result = run([tools.kubernetes_validate, "--strict", "--kubernetes-version", KUBERNETES_VERSION, path])
    assert result.returncode == 0, result.stdout + result.stderr


def test_without_servers_nothing_is_rendered(helm: str) -> None:
    result = render(helm)
    assert result.returncode == 0 and "mcp-servers" not in result.stdout and "MCP_SERVERS" not in result.stdout


@pytest.mark.parametrize(("server", "message"), [
    ({"name": "s", "url": "http://s/mcp", "api_key_file": "/etc/key"}, "api_key_file /etc/key is not mounted"),
    ({"name": "S!", "url": "http://s/mcp"}, "/mcpServers/0/name"),
    ({"name": "s", "url": "http://s/mcp", "egress": {"port": 80}}, "/mcpServers/0/egress"),
])
def test_chart_refuses_bad_servers(helm: str, server: dict, message: str) -> None:
    result = render(helm, "--set-json", f"mcpServers=[{json.dumps(server)}]")
    assert result.returncode != 0 and message in result.stderr


def test_the_gateway_refuses_what_the_chart_cannot_check() -> None:
    with pytest.raises(McpConfigError, match="at most one credential"):
        parse_servers(json.dumps({"servers": [{"name": "s", "url": "http://s", "api_key_env": "K",
                                               "entra_scope": "api://s/.default"}]}))
