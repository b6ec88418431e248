"""`tenantgate cache audit replica` against a real `tenantgate engine serve` process: the audit
signs an envelope per namespace as the gateway would, and the replica keeps two tenants' namespaces
apart (exit 0, the control significant), and one shared namespace is a leak (exit 1). Alpha 0.001:
a replica that holds namespaces fails the first case by chance in at most 0.1% of runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devkit.server import gateway_env, tenantgate_serve
from gateway.cache.cli import EXIT_LEAK, EXIT_NO_LEAK
from gateway.main import main
from tests.utils.signing import write_key_pair

ENGINE_FLAGS = ("--model", "demo", "--dtype", "float32", "--device", "cpu", "--kv-cache-memory", str(32 << 20),
                "--max-num-seqs", "4")


@pytest.fixture(scope="module")
def replica(demo_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("envelope-keys")
    write_key_pair(root / "public", root / "private", "gateway")
    with tenantgate_serve(tmp_path_factory.mktemp("engine-serve"), gateway_env(), *ENGINE_FLAGS,
                          "--envelope-public-keys", str(root / "public"), command=("engine", "serve")) as process:
        yield process.base_url, root / "private" / "gateway.pem"


@pytest.mark.parametrize(("scope", "status", "verdict"), [("tenant", EXIT_NO_LEAK, "no_leak"),
                                                           ("shared", EXIT_LEAK, "leak")])
def test_replica_audit(replica: tuple[str, Path], scope: str, status: int, verdict: str, capsys) -> None:
    url, key = replica
    code = main(["cache", "audit", "replica", "--url", url, "--envelope-signing-key", str(key), "--scope", scope,
                 "--trials", "12", "--prefix-tokens", "96", "--alpha", "0.001", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["control"]["p_value"] < result["alpha"], result
    assert (code, result["verdict"]) == (status, verdict), result
