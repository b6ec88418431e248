import argparse
import json
from pathlib import Path

import pytest

from gateway.policy.cli import add_parser
from tests.gateway.policy.conftest import POLICY_DIR, SAMPLES


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tenantgate")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_policy_test_passes_and_ends_with_the_summary_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["policy", "test", str(POLICY_DIR)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    passed, failed = last.split(", ")
    assert int(passed.split()[0]) >= 40 and failed == "0 failed"


def test_policy_test_reports_a_failing_rule_with_file_and_line(
    policy_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    test_file = policy_copy / "authz" / "authz_test.rego"
    test_file.write_text(test_file.read_text() + '\ntest_deny_always_fails if {\n\t1 == 2\n}\n')
    line = test_file.read_text().splitlines().index("test_deny_always_fails if {") + 1
    assert run_cli(["policy", "test", str(policy_copy)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {test_file}:{line}: test_deny_always_fails" in out
    assert out.strip().splitlines()[-1].endswith(", 1 failed")


def test_policy_test_catches_a_broken_rule(policy_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    authz = policy_copy / "authz" / "authz.rego"
    authz.write_text(authz.read_text().replace('_tenant.enabled == false', '_tenant.enabled == "no"'))
    assert run_cli(["policy", "test", str(policy_copy)]) == 1
    assert "test_deny_suspended_tenant" in capsys.readouterr().out


def test_syntax_error_prints_file_line_and_exits_2(
    policy_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = policy_copy / "cache" / "cache.rego"
    lines = broken.read_text().splitlines()
    lines.insert(9, "scope := if {")
    broken.write_text("\n".join(lines) + "\n")
    for argv in (["policy", "test", str(policy_copy)], ["policy", "check", "--dir", str(policy_copy)]):
        assert run_cli(argv) == 2
        err = capsys.readouterr().err
        assert f"{broken}:10:" in err


def test_coverage_is_printed_and_min_coverage_enforced(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["policy", "test", str(POLICY_DIR), "--coverage"]) == 0
    out = capsys.readouterr().out
    assert "coverage total:" in out and "authz.rego" in out and "_test.rego" not in out
    assert run_cli(["policy", "test", str(POLICY_DIR), "--min-coverage", "100.1"]) == 1
    assert "below --min-coverage" in capsys.readouterr().out


def test_coverage_drops_when_a_branch_is_untested(policy_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = policy_copy / "cache" / "cache.rego"
    cache.write_text(cache.read_text() + '\nnotes contains "never" if {\n\tinput.never_set\n}\n')
    assert run_cli(["policy", "test", str(policy_copy), "--min-coverage", "100"]) == 1
    assert "below --min-coverage 100" in capsys.readouterr().out


def test_eval_prints_the_decision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sample = SAMPLES["allow_restricted_forces_exclusive"]
    input_file = tmp_path / "input.json"
    input_file.write_text(json.dumps(sample["input"]))
    assert run_cli(["policy", "eval", "--input", str(input_file), "--data", str(POLICY_DIR / "data")]) == 0
    assert json.loads(capsys.readouterr().out) == sample["expected"]


def test_eval_with_other_data_changes_the_decision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sample = SAMPLES["allow_standard_app_token"]
    (tmp_path / "input.json").write_text(json.dumps(sample["input"]))
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "tenants.json").write_text('{"tenants": {}}')
    assert run_cli(["policy", "eval", "--input", str(tmp_path / "input.json"), "--data", str(data_dir)]) == 0
    decision = json.loads(capsys.readouterr().out)
    assert decision["allow"] is False
    assert decision["reasons"] == ["the caller's tenant is not registered with this gateway"]


def test_check_passes_on_the_library(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["policy", "check"]) == 0
    assert f"checked {len(SAMPLES)} samples: 0 problems" in capsys.readouterr().out


def test_check_names_the_sample_and_field(policy_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = policy_copy / "samples" / "allow_standard_app_token.json"
    document = json.loads(path.read_text())
    del document["allow_standard_app_token"]["expected"]["limits"]["priority"]
    path.write_text(json.dumps(document))
    limits = policy_copy / "limits" / "limits.rego"
    limits.write_text(limits.read_text().replace('"kv_blocks": tenant_limits.kv_blocks,', '"kv_blocks": "lots",'))
    assert run_cli(["policy", "check", "--dir", str(policy_copy)]) == 1
    out = capsys.readouterr().out
    assert "sample allow_standard_app_token: expected.limits.priority: Field required" in out
    assert "sample allow_standard_app_token: decision.limits.kv_blocks:" in out


def test_fmt_check_passes_on_the_library(opa_bin: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["policy", "fmt", "--check"]) == 0


def test_fmt_check_flags_unformatted_files(
    opa_bin: str, policy_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ugly = policy_copy / "batching" / "batching.rego"
    ugly.write_text(ugly.read_text().replace("default deterministic := false", "default   deterministic:=false"))
    assert run_cli(["policy", "fmt", "--check", "--dir", str(policy_copy)]) == 1
    assert "batching.rego" in capsys.readouterr().out


def test_fmt_without_opa_says_so(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("gateway.policy.opa.find_opa", lambda: None)
    assert run_cli(["policy", "fmt", "--check"]) == 2
    assert "install-opa.sh" in capsys.readouterr().err


def test_bundle_without_opa_says_so_and_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, rsa_key_pem, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("gateway.policy.bundle.find_opa", lambda: None)
    key = tmp_path / "bundle.key"
    key.write_bytes(rsa_key_pem[0])
    assert run_cli(["policy", "bundle", "--out", str(tmp_path / "b.tar.gz"), "--signing-key", str(key)]) == 2
    err = capsys.readouterr().err
    assert "needs OPA" in err and "install-opa.sh" in err
    assert not (tmp_path / "b.tar.gz").exists()


def test_bundle_refuses_a_key_opa_would_sign_with_another_algorithm(
    opa_bin: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = tmp_path / "p384.key"
    key.write_bytes(ec.generate_private_key(ec.SECP384R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    assert run_cli(["policy", "bundle", "--out", str(tmp_path / "b.tar.gz"), "--signing-key", str(key)]) == 2
    assert "RSA (RS256) or EC P-256 (ES256)" in capsys.readouterr().err
    assert not (tmp_path / "b.tar.gz").exists()
