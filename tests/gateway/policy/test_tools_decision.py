"""The tools decision (data.tenantgate.tools.decision): its schema, the embedded evaluation, and the
same decisions from a real OPA, for MCP tools/list and tools/call inputs on the example tenants."""

import asyncio
import copy
import json

import httpx
import pytest

from gateway.policy import DecisionSchemaError
from gateway.policy.evaluator import EmbeddedEvaluator
from gateway.policy.exceptions import PolicyEvaluationError
from gateway.policy.loader import ARGUMENTS_ENTRYPOINT, TOOLS_ENTRYPOINT, rego_files
from gateway.policy.opa import ARGUMENTS_PATH, TOOLS_DECISION_PATH
from gateway.policy.schema import parse_tools_decision, validate_tools_decision
from gateway.policy.service import EmbeddedPolicy, OpaPolicy
from tests.gateway.policy.conftest import POLICY_DIR

NORTHWIND = "c1a9e3f5-2d4b-4c6e-8f0a-b2c4d6e8f0a1"
FABRIKAM = "8d4e2b10-7c6f-4a91-b3d5-e6f708192a3b"
D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
USER = {"tenant_id": NORTHWIND, "object_id": "00000000-0000-4000-8000-000000000001", "app_id": "a",
        "idtyp": "user", "scopes": ["Tools.Invoke"], "roles": []}


def call(name: str, arguments: dict, digest: str = D1, recorded: str = D1, **principal) -> dict:
    return {"principal": USER | principal, "server": "devtools", "method": "tools/call",
            "tool": {"name": name, "digest": digest, "recorded_digest": recorded, "arguments": arguments}}


def listing(**principal) -> dict:
    return {"principal": USER | principal, "server": "devtools", "method": "tools/list",
            "tools": [{"name": n, "digest": D1, "recorded_digest": D1}
                      for n in ("echo", "word_count", "delete_repository", "not_in_policy")]}


INPUTS = {
    "list": listing(),
    "list_other_tenant": listing(tenant_id=FABRIKAM),
    "list_without_scope": listing(scopes=["Inference.Invoke"]),
    "call_echo": call("echo", {"text": "hello"}),
    "call_echo_too_long": call("echo", {"text": "x" * 2001}),
    "call_echo_unknown_argument": call("echo", {"text": "hi", "path": "/etc"}),
    "call_echo_changed": call("echo", {"text": "hi"}, digest=D2),
    "call_delete": call("delete_repository", {"name": "tenantgate"}),
    "call_word_count": call("word_count", {"text": "a b"}),
    "call_unknown_server": call("echo", {"text": "hi"}) | {"server": "elsewhere"},
}


@pytest.fixture(scope="module")
def embedded() -> EmbeddedEvaluator:
    return EmbeddedEvaluator(POLICY_DIR)


def test_allow_northwind_lists_the_harmless_tools_and_not_the_destructive_one(embedded) -> None:
    decision = embedded.decide_tools(INPUTS["list"])
    assert decision.allow and decision.listed == ["echo", "word_count"]


def test_allow_call_carries_the_tools_budget(embedded) -> None:
    decision = embedded.decide_tools(INPUTS["call_echo"])
    assert decision.allow
    assert (decision.tool.calls_per_minute, decision.tool.concurrency, decision.tool.max_result_bytes) == (60, 2, 16384)
    assert decision.logging.content == "none" and "/arguments" in decision.logging.redact


@pytest.mark.parametrize(("name", "reason"), [
    ("call_delete", "the tool is not allowed for this tenant"),
    ("call_echo_changed", "the tool's definition is not the one this tenant's policy accepts"),
    ("call_echo_too_long", "the argument text is not allowed by this tenant's policy"),
    ("call_echo_unknown_argument", "the argument path is not allowed by this tenant's policy"),
    ("call_unknown_server", "this MCP server is not available to the tenant"),
    ("list_other_tenant", "this MCP server is not available to the tenant"),
    ("list_without_scope", "the delegated token lacks the Tools.Invoke scope"),
])
def test_deny_with_its_reason(embedded, name: str, reason: str) -> None:
    decision = embedded.decide_tools(INPUTS[name])
    assert not decision.allow and decision.reasons == [reason] and decision.listed == []
    assert decision.tool.calls_per_minute == 0


def test_without_an_arguments_package_no_call_is_allowed_but_listings_still_are(policy_copy) -> None:
    (policy_copy / "tools" / "arguments.rego").unlink()
    (policy_copy / "tools" / "arguments_test.rego").unlink()
    evaluator = EmbeddedEvaluator(policy_copy)
    with pytest.raises(PolicyEvaluationError):  # regorus: not a valid rule path; fail closed, a 503
        evaluator.decide_tools(INPUTS["call_echo"])
    assert evaluator.decide_tools(INPUTS["list"]).allow
    assert not evaluator.decide_tools(INPUTS["call_delete"]).allow  # denied before the arguments are asked


def test_schema_refuses_a_deny_without_reasons_or_that_lists_tools() -> None:
    good = EmbeddedEvaluator(POLICY_DIR).evaluate(INPUTS["call_delete"], TOOLS_ENTRYPOINT)
    validate_tools_decision(good)
    with pytest.raises(DecisionSchemaError):
        validate_tools_decision(good | {"reasons": []})
    with pytest.raises(DecisionSchemaError):
        validate_tools_decision(good | {"listed": ["echo"]})
    with pytest.raises(DecisionSchemaError):
        parse_tools_decision(json.dumps(good | {"surprise": 1}))
    bad_budget = copy.deepcopy(good)
    bad_budget["tool"]["calls_per_minute"] = -1
    with pytest.raises(DecisionSchemaError):
        validate_tools_decision(bad_budget)


def test_embedded_policy_service_decides_tools_with_its_revision() -> None:
    policy = EmbeddedPolicy(POLICY_DIR)
    judgement = asyncio.run(policy.decide_tools(INPUTS["call_echo"]))
    assert judgement.decision.allow and judgement.revision == policy.revision


def test_parity_tools_decisions_identical_in_regorus_and_opa(opa_server_factory, embedded) -> None:
    modules = [str(p) for p in rego_files(POLICY_DIR, include_tests=False)]
    server = opa_server_factory([*modules, str(POLICY_DIR / "data" / "tenants.example.json"),
                                  str(POLICY_DIR / "data" / "platform_segments.example.json")])
    differences = []
    with httpx.Client(base_url=server.url, timeout=5) as client:
        for name, document in sorted(INPUTS.items()):
            for entrypoint, path in ((TOOLS_ENTRYPOINT, TOOLS_DECISION_PATH), (ARGUMENTS_ENTRYPOINT, ARGUMENTS_PATH)):
                ours = embedded.evaluate(document, entrypoint)
                theirs = client.post(path, json={"input": document}).json()["result"]
                if ours != theirs:
                    differences.append(f"{name}, {entrypoint}: regorus={ours} opa={theirs}")
    assert not differences, "\n".join(differences)

    async def through_the_services() -> list[str]:
        opa, local = OpaPolicy(server.url), EmbeddedPolicy(POLICY_DIR, cache_size=64)
        try:
            return [name for name, document in sorted(INPUTS.items())
                    if (await opa.decide_tools(document)).decision != (await local.decide_tools(document)).decision]
        finally:
            await opa.aclose()

    assert asyncio.run(through_the_services()) == []  # both judge the arguments after the decision alike
