"""`tenantgate cache audit`: unusable arguments exit 2 with a clear line, and the exit code tells a
leak (1) from no leak (0) and from an inconclusive run (3); the output holds numbers only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devkit.server import free_port
from gateway.cache.cli import EXIT_INCONCLUSIVE, EXIT_LEAK, EXIT_USAGE
from gateway.main import main


def _exit(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own refusals
        return int(exc.code or 0)


@pytest.mark.parametrize(("argv", "says"), [
    (["embedded", "--trials", "1"], "--trials: must be a whole number, 2 or more"),
    (["embedded", "--alpha", "1.5"], "--alpha: must be a number between 0 and 1"),
    (["embedded", "--max-seconds", "0"], "--max-seconds: must be a positive number of seconds"),
    (["embedded", "--deployment", "vllm prod"], "--deployment: must be 1 to 64 letters"),
    (["embedded", "--max-requests", "3"], "max_requests must be at least 4"),
    (["upstream", "--url", "http://127.0.0.1:1/v1"], "the following arguments are required: --model"),
    (["upstream", "--url", "http://x/v1", "--model", "m", "--extra-body", "[1]"], "--extra-body: must be a JSON"),
    (["bogus"], "invalid choice: 'bogus'"),
])
def test_unusable_arguments_exit_2_and_say_why(argv: list[str], says: str, capsys) -> None:
    assert _exit(["cache", "audit", *argv]) == EXIT_USAGE
    assert says in capsys.readouterr().err


def test_gateway_target_without_tokens_names_where_they_come_from(monkeypatch, capsys) -> None:
    monkeypatch.delenv("TENANTGATE_AUDIT_TOKEN_A", raising=False)
    assert _exit(["cache", "audit", "gateway", "--url", "http://127.0.0.1:1/v1", "--model", "m"]) == EXIT_USAGE
    assert "give --token-a-file or set TENANTGATE_AUDIT_TOKEN_A" in capsys.readouterr().err


def test_replica_target_without_a_signing_key_says_so(monkeypatch, tmp_path: Path, capsys) -> None:
    monkeypatch.delenv("TENANTGATE_ENVELOPE_SIGNING_KEY", raising=False)
    assert _exit(["cache", "audit", "replica", "--url", "http://127.0.0.1:1"]) == EXIT_USAGE
    assert "give --envelope-signing-key" in capsys.readouterr().err
    not_a_key = tmp_path / "key.pem"
    not_a_key.write_text("-----BEGIN PRIVATE KEY-----\nsecret\n-----END PRIVATE KEY-----\n")
    assert _exit(["cache", "audit", "replica", "--url", "http://127.0.0.1:1",
                  "--envelope-signing-key", str(not_a_key)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "not an Ed25519 private key" in err and "secret" not in err


def test_an_unreachable_deployment_exits_2_without_echoing_the_request(monkeypatch, capsys) -> None:
    monkeypatch.setenv("TENANTGATE_AUDIT_TOKEN_A", "token-of-a")
    monkeypatch.setenv("TENANTGATE_AUDIT_TOKEN_B", "token-of-b")
    url = f"http://127.0.0.1:{free_port()}/v1"
    assert _exit(["cache", "audit", "gateway", "--url", url, "--model", "m", "--deployment", "gw"]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert "deployment gw: the deployment failed a probe: ConnectError" in captured.err
    assert "token-of" not in captured.err + captured.out


def test_too_few_trials_is_inconclusive(demo_model_dir: Path, capsys) -> None:
    # Two trials cannot make any KS test significant at 0.01 (the smallest p with 2 vs 2 is 1/3).
    status = _exit(["cache", "audit", "embedded", "--model", str(demo_model_dir), "--threads", "1",
                    "--trials", "2", "--warmup", "0", "--prefix-tokens", "32"])
    out = capsys.readouterr().out
    assert status == EXIT_INCONCLUSIVE, out
    assert out.startswith("cache audit of embedded: INCONCLUSIVE: the positive control was not significant")


def test_a_shared_scope_exits_1_with_numbers_and_gauges(demo_model_dir: Path, tmp_path: Path, capsys) -> None:
    textfile = tmp_path / "cache_audit.prom"
    status = _exit(["cache", "audit", "embedded", "--model", str(demo_model_dir), "--threads", "1",
                    "--scope", "shared", "--trials", "8", "--prefix-tokens", "64", "--json",
                    "--deployment", "embedded-shared", "--textfile", str(textfile)])
    result = json.loads(capsys.readouterr().out)
    assert status == EXIT_LEAK, result
    assert result["deployment"] == "embedded-shared" and result["verdict"] == "leak"
    assert result["control"]["p_value"] < 0.01 and result["cross"]["p_value"] < 0.01
    assert result["cross"]["n_probe"] == result["cross"]["n_baseline"] == 8
    assert result["requests"] == 36  # 8 trials and a warm-up, 4 requests each
    gauges = textfile.read_text()
    assert 'tenantgate_cache_audit_leak{deployment="embedded-shared"} 1.0' in gauges
    assert 'tenantgate_cache_audit_inconclusive{deployment="embedded-shared"} 0.0' in gauges
    assert 'tenantgate_cache_audit_samples{deployment="embedded-shared",probe="cross"} 8.0' in gauges
