"""The OpenAI Agents SDK through its Streamable HTTP MCP server class, pointed at /mcp/devtools of a
gateway that fronts devkit's example MCP server: it lists and calls what the example policy allows
Northwind, and the destructive tool is refused (issue 27's proof)."""

from __future__ import annotations

import pytest

from devkit.issuer import LocalIssuer
from tests.clients.conftest import ClientGateway, result, run_flow
from tests.gateway.mcp.conftest import NORTHWIND, running_mcp_gateway


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    with LocalIssuer(port=0) as issuer, running_mcp_gateway(issuer, tmp_path_factory.mktemp("mcp")) as gateway:
        return run_flow("openai-agents", "agents_mcp_flow", ClientGateway(gateway.base_url, issuer), tenant=NORTHWIND,
                        env={"TENANTGATE_MCP_URL": gateway.url, "TENANTGATE_MCP_TOKEN": gateway.token()})


def test_the_agents_sdk_lists_the_tools_the_policy_allows(report: dict) -> None:
    assert result(report, "lists_the_allowed_tools") == ["echo", "word_count"]


def test_the_agents_sdk_calls_the_allowed_tool(report: dict) -> None:
    assert result(report, "calls_the_allowed_tool") == {"is_error": False, "text": ["3"]}


def test_the_agents_sdk_is_refused_the_denied_tool(report: dict) -> None:
    outcome = report["is_refused_the_denied_tool"]
    refusal = outcome["error"]["message"] if "error" in outcome else " ".join(outcome["result"]["text"])
    assert "the tool is not allowed for this tenant" in refusal
