"""The same policies in a real OPA: strict check, opa test, parity with regorus, signed bundles."""

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest

from gateway.metrics import GatewayMetrics
from gateway.policy.bundle import build_bundle
from gateway.policy.evaluator import EmbeddedEvaluator
from gateway.policy.exceptions import PolicyEvaluationError
from gateway.policy.loader import TOOLS_ENTRYPOINT, rego_files
from gateway.policy.opa import DECISION_PARAMS, TOOLS_DECISION_PATH, OpaClient
from gateway.policy.service import OpaPolicy
from tests.gateway.policy.conftest import POLICY_DIR, SAMPLES
from tests.utils.opa import BundleServer, read_tarball, wait_http, write_tarball


def test_opa_check_strict(opa_bin: str) -> None:
    result = subprocess.run([opa_bin, "check", "--strict", str(POLICY_DIR)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_opa_test_passes_the_same_rego_tests(opa_bin: str) -> None:
    result = subprocess.run(
        [opa_bin, "test", str(POLICY_DIR), "--format", "json"], capture_output=True, text=True
    )
    outcomes = json.loads(result.stdout)
    failed = [f"{o['package']}.{o['name']}" for o in outcomes if o.get("fail") or o.get("error")]
    assert result.returncode == 0 and not failed, failed or result.stderr
    assert len(outcomes) >= 40


def test_parity_every_sample_identical_in_regorus_and_opa(opa_server_factory) -> None:
    modules = [str(p) for p in rego_files(POLICY_DIR, include_tests=False)]
    server = opa_server_factory([*modules, str(POLICY_DIR / "data" / "tenants.example.json"),
                                  str(POLICY_DIR / "data" / "platform_segments.example.json")])
    embedded = EmbeddedEvaluator(POLICY_DIR)
    differences = []
    with OpaClient(server.url) as opa:
        for name, sample in sorted(SAMPLES.items()):
            ours, theirs = embedded.evaluate(sample["input"]), opa.evaluate(sample["input"])
            if ours != theirs:
                differences.append(f"{name}: regorus={ours} opa={theirs}")
    assert not differences, "\n".join(differences)


def test_a_deny_rule_that_errors_refuses_in_opa_as_in_regorus(opa_server_factory, tmp_path: Path) -> None:
    """OPA's default makes a built-in's error undefined, so a deny rule whose body errors would not
    deny (the decision allows). The gateway asks with strict built-in errors: OPA answers 500 and the
    request is refused, as regorus' error refuses it."""
    policy = tmp_path / "erring.rego"
    policy.write_text('package tenantgate\n\ndeny contains "too big" if { 1 / input.zero > 0 }\n\n'
                      'decision := {"allow": count(deny) == 0}\n')
    server = opa_server_factory([str(policy)])
    erring = {"zero": "0"}
    plain = httpx.post(server.url + "/v1/data/tenantgate/decision", json={"input": erring}, timeout=5)
    assert plain.json()["result"] == {"allow": True}  # what the gateway would get without the flag
    with OpaClient(server.url) as opa:
        with pytest.raises(PolicyEvaluationError, match="HTTP 500"):
            opa.evaluate(erring)
        assert opa.evaluate({"zero": 2}) == {"allow": False}

    async def decide() -> None:
        policy = OpaPolicy(server.url)
        try:
            with pytest.raises(PolicyEvaluationError, match="HTTP 500"):
                await policy.decide(erring)
        finally:
            await policy.aclose()

    asyncio.run(decide())
    embedded = EmbeddedEvaluator(tmp_path)
    with pytest.raises(PolicyEvaluationError):
        embedded.evaluate(erring)


NORTHWIND = "c1a9e3f5-2d4b-4c6e-8f0a-b2c4d6e8f0a1"
REVOKED_OID, REVOKED_SID, CUTOFF = "0b1c2d3e-0000-4000-8000-0000000dead0", "s-revoked", 1764800000


def _conditional_access_inputs() -> Iterator[tuple[str, dict]]:
    """Northwind's restricted request (c1 needed, sign-in within the hour) with the claims Conditional
    Access reads varied one at a time, well-formed or not (the policy must agree with itself on
    shapes the gateway would have dropped, too)."""
    base = SAMPLES["allow_free_restricted_with_context"]["input"]
    variations = {
        "acrs": [["c1"], [], "c1", [1], ["c2", "c1"], None],
        "xms_cc": [["cp1"], [], "cp1", ["cp2"], None],
        "sid": [REVOKED_SID, "s-other", 7, None],
        "iat": [CUTOFF - 1, CUTOFF, "1764800000", None],
        "object_id": [REVOKED_OID],
    }
    for claim, values in variations.items():
        for value in values:
            principal = {k: v for k, v in base["principal"].items() if k != claim}
            if value is not None:
                principal[claim] = value
            yield f"{claim}={value!r}", {**base, "principal": principal}
    for classification in ("public", "restricted", "secret"):
        yield f"classification={classification}", {**base, "request": {**base["request"],
                                                                      "data_classification": classification}}


def test_parity_conditional_access_decisions_identical_in_regorus_and_opa(opa_server_factory, tmp_path) -> None:
    tenants = json.loads((POLICY_DIR / "data" / "tenants.example.json").read_text())
    tenants["tenants"][NORTHWIND]["revocations"] = {"principals": [REVOKED_OID], "sessions": [REVOKED_SID],
                                                    "issued_before": CUTOFF}
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "tenants.json").write_text(json.dumps(tenants))
    modules = [str(p) for p in rego_files(POLICY_DIR, include_tests=False)]
    server = opa_server_factory([*modules, str(data_dir / "tenants.json")])
    embedded = EmbeddedEvaluator(POLICY_DIR, data_dir)
    differences, outcomes = [], {}
    with OpaClient(server.url) as opa:
        for name, document in _conditional_access_inputs():
            ours, theirs = embedded.evaluate(document), opa.evaluate(document)
            outcomes[name] = ours["authentication"]
            if ours != theirs:
                differences.append(f"{name}: regorus={ours} opa={theirs}")
    assert not differences, "\n".join(differences)
    # And the cases say what they should, so agreement is not agreement on nothing.
    assert outcomes["acrs=['c1']"]["missing"] == [] and outcomes["acrs=[]"]["missing"] == ["c1"]
    assert outcomes["acrs='c1'"]["missing"] == ["c1"]  # a string is no list of contexts
    assert outcomes["xms_cc=['cp1']"]["challenge"] is True and outcomes["xms_cc='cp1'"]["challenge"] is False
    assert outcomes[f"sid={REVOKED_SID!r}"]["revoked"] is True and outcomes["sid=7"]["revoked"] is False
    assert outcomes[f"iat={CUTOFF - 1}"]["revoked"] is True and outcomes[f"iat={CUTOFF}"]["revoked"] is False
    assert outcomes["iat='1764800000'"]["revoked"] is False  # a string iat is compared with nothing
    assert outcomes[f"object_id={REVOKED_OID!r}"]["revoked"] is True
    assert outcomes["classification=public"]["contexts"] == []


@pytest.mark.parametrize("redact", [5, "/request/user", True, None, [], ["/request/user"]])
def test_a_tenants_redact_list_of_any_shape_gets_the_same_answer_in_regorus_and_opa(
        opa_server_factory, tmp_path: Path, redact) -> None:
    """OPA iterates a value that is not a collection as nothing, regorus refuses to: a tenant whose
    redact list is a number must not lose its redactions in one engine and fail in the other."""
    tenants = json.loads((POLICY_DIR / "data" / "tenants.example.json").read_text())
    logging = tenants["tenants"][NORTHWIND]["logging"]
    if redact is None:
        del logging["redact"]
    else:
        logging["redact"] = redact
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "tenants.json").write_text(json.dumps(tenants))
    server = opa_server_factory([*(str(p) for p in rego_files(POLICY_DIR, include_tests=False)),
                                 str(data_dir / "tenants.json")])
    document = SAMPLES["allow_free_internal_cache_narrowed"]["input"]
    call = {"principal": {**document["principal"], "scopes": ["Tools.Invoke"]}, "server": "devtools",
            "method": "tools/call", "tool": {"name": "echo", "arguments": {"text": "hi"},
                                             "digest": "sha256:" + "1" * 64, "recorded_digest": "sha256:" + "1" * 64}}
    embedded = EmbeddedEvaluator(POLICY_DIR, data_dir)
    with OpaClient(server.url) as opa:
        ours, theirs = embedded.evaluate(document), opa.evaluate(document)
    tools_answer = httpx.post(server.url + TOOLS_DECISION_PATH, params=DECISION_PARAMS, json={"input": call})
    ours_tools, theirs_tools = embedded.evaluate(call, TOOLS_ENTRYPOINT), tools_answer.json()["result"]
    assert ours == theirs
    assert ours_tools == theirs_tools
    if isinstance(redact, list) or redact is None:
        assert ours["allow"] and ("/request/user" in ours["logging"]["redact"]) == bool(redact)
        assert ours_tools["allow"] and ("/request/user" in ours_tools["logging"]["redact"]) == bool(redact)
    else:  # a list the policy cannot read: denied, not served or recorded with fewer redactions
        assert not ours["allow"] and not ours_tools["allow"]


@pytest.mark.parametrize(("platform", "own"), [(["assistant"], None), ("assistant", None), (5, None), (True, None),
                                             (None, {"kb": {"digest": "sha256:" + "3" * 64, "tokens": 8}}),
                                             (None, "kb"), (None, 7), (["assistant"], [])])
def test_a_tenants_segment_lists_of_any_shape_get_the_same_answer_in_regorus_and_opa(
        opa_server_factory, tmp_path: Path, platform, own) -> None:
    """The same engine difference for the public prefix segments: a list the policy cannot read is
    no segment in either engine (sharing less), not a 503 in one and nothing in the other."""
    tenants = json.loads((POLICY_DIR / "data" / "tenants.example.json").read_text())
    segments = {name: value for name, value in (("platform", platform), ("own", own)) if value is not None}
    tenants["tenants"][NORTHWIND]["cache_segments"] = segments
    platform_segments = json.loads((POLICY_DIR / "data" / "platform_segments.example.json").read_text())
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "tenants.json").write_text(json.dumps(tenants))
    (data_dir / "platform_segments.json").write_text(json.dumps(platform_segments))
    server = opa_server_factory([*(str(p) for p in rego_files(POLICY_DIR, include_tests=False)),
                                 str(data_dir / "tenants.json"), str(data_dir / "platform_segments.json")])
    document = SAMPLES["allow_free_internal_cache_narrowed"]["input"]  # tenant scope: segments apply
    with OpaClient(server.url) as opa:
        ours, theirs = EmbeddedEvaluator(POLICY_DIR, data_dir).evaluate(document), opa.evaluate(document)
    assert ours == theirs and ours["allow"]
    namespaces = {segment["namespace"].split(":")[1] for segment in ours["cache"]["segments"]}
    assert namespaces == ({"platform"} if platform == ["assistant"] else set()) | (
        {"tenant"} if isinstance(own, dict) else set())


@pytest.mark.parametrize("missing", ["digest", "recorded_digest", "name", "tool"])
def test_a_tools_call_missing_a_field_gets_the_same_answer_in_regorus_and_opa(opa_server_factory, missing) -> None:
    """`not f(x)` with an undefined x is undefined in OPA and true in regorus: the tools policy asks
    through helper rules, so a call the gateway never sends is still denied in both."""
    server = opa_server_factory([*(str(p) for p in rego_files(POLICY_DIR, include_tests=False)),
                                 *(str(p) for p in sorted((POLICY_DIR / "data").glob("*.json")))])
    tool = {"name": "echo", "arguments": {"text": "hi"}, "digest": "sha256:" + "1" * 64,
            "recorded_digest": "sha256:" + "1" * 64}
    call = {"principal": {"tenant_id": NORTHWIND, "object_id": "o1", "idtyp": "user", "scopes": ["Tools.Invoke"]},
            "server": "devtools", "method": "tools/call", "tool": tool}
    embedded = EmbeddedEvaluator(POLICY_DIR)

    def both(document: dict) -> tuple[dict, dict]:
        answer = httpx.post(server.url + TOOLS_DECISION_PATH, params=DECISION_PARAMS, json={"input": document})
        return embedded.evaluate(document, TOOLS_ENTRYPOINT), answer.json()["result"]

    whole = both(call)
    assert whole[0] == whole[1] and whole[0]["allow"]  # the whole call is allowed; each case lacks one field
    partial = ({**call, "tool": {k: v for k, v in tool.items() if k != missing}} if missing != "tool"
               else {k: v for k, v in call.items() if k != "tool"})
    ours, theirs = both(partial)
    assert ours == theirs and not ours["allow"]


def test_opa_policy_knows_which_tenants_the_data_enables(opa_server_factory) -> None:
    """Operators must come from an enabled tenant: the OPA backend reads `enabled` from OPA's data."""
    modules = [str(p) for p in rego_files(POLICY_DIR, include_tests=False)]
    server = opa_server_factory([*modules, str(POLICY_DIR / "data" / "tenants.example.json"),
                                  str(POLICY_DIR / "data" / "platform_segments.example.json")])
    tenants = json.loads((POLICY_DIR / "data" / "tenants.example.json").read_text())["tenants"]

    async def enabled() -> tuple[bool | None, dict[str, bool | None]]:
        policy = OpaPolicy(server.url)
        before = policy.tenant_enabled(next(iter(tenants)))
        try:
            await policy.start()
            unknown = "eeeeeeee-0000-4000-8000-00000000000e"
            return before, {tid: policy.tenant_enabled(tid) for tid in [*tenants, unknown]}
        finally:
            await policy.aclose()

    before, seen = asyncio.run(enabled())
    assert before is None  # OPA has not answered yet: unknown, which refuses
    assert seen == {**{tid: tenant["enabled"] is True for tid, tenant in tenants.items()},
                    "eeeeeeee-0000-4000-8000-00000000000e": False}
    assert False in seen.values() and True in seen.values()  # the example data has both


@pytest.fixture
def bundle_server(tmp_path: Path) -> Iterator[BundleServer]:
    server = BundleServer(tmp_path / "tenantgate.tar.gz")
    yield server
    server.close()


def _opa_config(tmp_path: Path, service_url: str, public_pem: bytes, algorithm: str) -> Path:
    config = {
        "services": {"bundles": {"url": service_url}},
        "bundles": {
            "tenantgate": {
                "service": "bundles",
                "resource": "bundles/tenantgate.tar.gz",
                "polling": {"min_delay_seconds": 1, "max_delay_seconds": 2},
                "signing": {"keyid": "tenantgate"},
            }
        },
        "keys": {"tenantgate": {"algorithm": algorithm, "key": public_pem.decode()}},
        "decision_logs": {"console": True},
    }
    path = tmp_path / "opa-config.json"
    path.write_text(json.dumps(config))  # JSON is YAML, which OPA's --config-file reads
    return path


@pytest.mark.parametrize("algorithm", ["RS256", "ES256"])
def test_opa_activates_signed_bundle_and_answers_decisions(
    algorithm: str, opa_server_factory, bundle_server: BundleServer, tmp_path: Path, request
) -> None:
    private_pem, public_pem = request.getfixturevalue("rsa_key_pem" if algorithm == "RS256" else "ec_key_pem")
    revision = build_bundle(bundle_server.path, private_pem, policy_dir=POLICY_DIR)
    config = _opa_config(tmp_path, bundle_server.url, public_pem, algorithm)
    server = opa_server_factory(["--config-file", str(config)])
    assert wait_http(server.url + "/health?bundles", timeout=20), server.log_text()

    status = httpx.get(server.url + "/v1/data/system/bundles").json()["result"]
    assert status["tenantgate"]["manifest"]["revision"] == revision
    roots = {"tenantgate", "tenants", "platform_segments", "system/log"}
    assert set(status["tenantgate"]["manifest"]["roots"]) == roots

    embedded = EmbeddedEvaluator(POLICY_DIR)
    assert revision == embedded.revision
    with OpaClient(server.url) as opa:
        for name in ("allow_enterprise_delegated_clamped", "deny_region_not_allowed"):
            assert opa.decide(SAMPLES[name]["input"]).model_dump() == SAMPLES[name]["expected"]


def test_the_bundle_revision_opa_decides_with_is_the_policy_info_metric(
    opa_server_factory, bundle_server: BundleServer, rsa_key_pem, tmp_path: Path
) -> None:
    private_pem, public_pem = rsa_key_pem
    revision = build_bundle(bundle_server.path, private_pem, policy_dir=POLICY_DIR)
    server = opa_server_factory(["--config-file", str(_opa_config(tmp_path, bundle_server.url, public_pem, "RS256"))])
    assert wait_http(server.url + "/health?bundles", timeout=20), server.log_text()

    async def scrapes() -> tuple[str, str]:
        policy, metrics = OpaPolicy(server.url), GatewayMetrics()
        metrics.watch_policy(policy)
        try:
            before = generate_latest(metrics.registry).decode()
            await policy.decide(SAMPLES["allow_enterprise_delegated_clamped"]["input"])
            return before, generate_latest(metrics.registry).decode()
        finally:
            await policy.aclose()

    before, after = asyncio.run(scrapes())
    assert "tenantgate_policy_info" not in before  # nothing decided yet: no revision to claim
    assert f'tenantgate_policy_info{{revision="opa:tenantgate@{revision}"}} 1.0' in after
    assert "tenantgate_policy_reload_failures" not in after  # OPA's sidecar reloads bundles, not the gateway
    assert "tenantgate_policy_decisions_total{" not in before
    assert 'tenantgate_policy_decisions_total{cache="off",kind="request"} 1.0' in after  # OPA's, never cached


def test_opa_refuses_a_tampered_bundle(
    opa_server_factory, bundle_server: BundleServer, rsa_key_pem, tmp_path: Path
) -> None:
    private_pem, public_pem = rsa_key_pem
    build_bundle(bundle_server.path, private_pem, policy_dir=POLICY_DIR)
    files = read_tarball(bundle_server.path)
    files["tenantgate/decision.rego"] = files["tenantgate/decision.rego"].replace(
        b"decision := _allowed if count(_deny_reasons) == 0", b"decision := _allowed"
    )
    write_tarball(bundle_server.path, files)
    server = opa_server_factory(["--config-file", str(_opa_config(tmp_path, bundle_server.url, public_pem, "RS256"))])

    deadline = time.monotonic() + 15
    while "digest mismatch" not in server.log_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "tenantgate/decision.rego: digest mismatch" in server.log_text()
    assert httpx.get(server.url + "/health?bundles").status_code != 200
    body = httpx.post(
        server.url + "/v1/data/tenantgate/decision", json={"input": SAMPLES["deny_unknown_tenant"]["input"]}
    ).json()
    assert "result" not in body


def test_opa_refuses_a_bundle_signed_with_another_key(
    opa_server_factory, bundle_server: BundleServer, rsa_key_pem, ec_key_pem, tmp_path: Path
) -> None:
    build_bundle(bundle_server.path, ec_key_pem[0], policy_dir=POLICY_DIR)
    config = _opa_config(tmp_path, bundle_server.url, rsa_key_pem[1], "RS256")
    server = opa_server_factory(["--config-file", str(config)])
    deadline = time.monotonic() + 15
    while "failed to verify" not in server.log_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "failed to verify" in server.log_text()
    assert httpx.get(server.url + "/health?bundles").status_code != 200


def test_decision_logs_are_masked(
    opa_server_factory, bundle_server: BundleServer, rsa_key_pem, tmp_path: Path
) -> None:
    private_pem, public_pem = rsa_key_pem
    build_bundle(bundle_server.path, private_pem, policy_dir=POLICY_DIR)
    server = opa_server_factory(["--config-file", str(_opa_config(tmp_path, bundle_server.url, public_pem, "RS256"))])
    assert wait_http(server.url + "/health?bundles", timeout=20), server.log_text()
    sample = json.loads(json.dumps(SAMPLES["allow_standard_app_token"]["input"]))
    sample["request"]["messages"] = [{"role": "user", "content": "the secret plan is tangerine"}]
    sample["request"]["headers"] = {"authorization": "Bearer eyJhbGciOiJub25lIn0.sentinel-token"}
    with OpaClient(server.url) as opa:
        assert opa.evaluate(sample)["allow"] is True

    deadline = time.monotonic() + 10
    while '"decision_id"' not in server.log_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    events = [
        json.loads(line)
        for line in server.log_text().splitlines()
        if line.startswith("{") and '"decision_id"' in line
    ]
    assert events, server.log_text()
    event = events[-1]
    assert "messages" not in event["input"]["request"]
    assert event["input"]["request"]["headers"]["authorization"] == "[redacted]"
    assert "tangerine" not in server.log_text() and "sentinel-token" not in server.log_text()
    assert "/input/request/messages" in json.dumps(event.get("erased", []))
