"""`tenantgate token`: dev tokens the running dev issuer verifies; real Azure tokens on request."""

import argparse
import json
import socket
import sys
import types

import pytest

from devkit.cli import add_parser, cmd_token
from devkit.issuer import LocalIssuer
from gateway.auth.entra import EntraVerifier
from gateway.main import build_parser
from tests.utils.issuer import CONTOSO, NORTHWIND, running_issuer, verifier_options


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tenantgate")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TENANTGATE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TENANTGATE_ENVIRONMENT", raising=False)
    monkeypatch.delenv("TENANTGATE_AUDIENCE", raising=False)
    return tmp_path


async def verify(issuer: LocalIssuer, token: str):
    verifier = EntraVerifier(**verifier_options(issuer))
    try:
        return await verifier.verify(token)
    finally:
        await verifier.aclose()


async def test_a_minted_token_verifies_against_the_dev_issuer(cache_dir, monkeypatch, capsys) -> None:
    with running_issuer(key_dir=cache_dir / "dev-issuer") as issuer:
        monkeypatch.setenv("TENANTGATE_DEV_ISSUER_URL", issuer.base_url)
        assert run_cli(["token", "--tenant", "northwind"]) == 0
        out = capsys.readouterr().out
        assert out.count("\n") == 1 and out.count(".") == 2
        principal = await verify(issuer, out.strip())
    assert (principal.tenant_id, principal.idtyp, principal.scopes) == (NORTHWIND, "user", ("Inference.Invoke",))


async def test_a_token_minted_before_the_issuer_starts_verifies_once_it_runs(cache_dir, capsys) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    argv = ["token", "--tenant", "CONTOSO health", "--role", "Inference.Invoke.All", "--version", "1", "--issuer", url]
    assert run_cli(argv) == 0
    token = capsys.readouterr().out.strip()
    with LocalIssuer(url, key_dir=cache_dir / "dev-issuer") as issuer:
        principal = await verify(issuer, token)
    assert (principal.tenant_id, principal.idtyp, principal.roles) == (CONTOSO, "app", ("Inference.Invoke.All",))
    assert principal.token_version == "1.0"


def test_production_refuses_development_tokens(cache_dir, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TENANTGATE_ENVIRONMENT", "Production")
    assert run_cli(["token", "--tenant", "northwind"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "production" in captured.err
    assert not (cache_dir / "dev-issuer").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tenant", "nobody"], "neither a tenant GUID nor a tenant name"),
        (["--tenant", "northwind", "--scope", "a", "--role", "b"], "not both"),
        (["--tenant", "northwind", "--object-id", "someone@example.com"], "GUID"),
        (["--tenant", "northwind", "--lifetime", "0"], "--lifetime"),
        ([], "--tenant is required"),
    ],
)
def test_unusable_arguments_exit_2(argv, message, cache_dir, capsys) -> None:
    assert run_cli(["token", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err


def test_an_ambiguous_tenant_prefix_exits_2(cache_dir, tmp_path, capsys) -> None:
    policy_dir = tmp_path / "policies"
    (policy_dir / "data").mkdir(parents=True)
    (policy_dir / "p.rego").write_text("package p\n")
    (policy_dir / "data" / "tenants.json").write_text(
        json.dumps({"tenants": {CONTOSO: {"name": "North One"}, NORTHWIND: {"name": "North Two"}}})
    )
    assert run_cli(["token", "--tenant", "north", "--policy-dir", str(policy_dir)]) == 2
    assert "more than one tenant" in capsys.readouterr().err
    assert run_cli(["token", "--tenant", "north two", "--policy-dir", str(policy_dir)]) == 0


def fake_azure_identity(monkeypatch, *, token: str | None = None, error: str | None = None) -> list:
    calls: list = []

    class DefaultAzureCredential:
        def __init__(self, **options):
            calls.append(("init", options))

        def get_token(self, *scopes, tenant_id=None):
            calls.append(("get_token", scopes, tenant_id))
            if error:
                raise RuntimeError(error)
            return types.SimpleNamespace(token=token)

        def close(self):
            calls.append(("close",))

    module = types.SimpleNamespace(DefaultAzureCredential=DefaultAzureCredential)
    monkeypatch.setitem(sys.modules, "azure.identity", module)
    return calls


def test_azure_prints_the_credential_token(cache_dir, monkeypatch, capsys) -> None:
    calls = fake_azure_identity(monkeypatch, token="eyJ.real.token")
    assert run_cli(["token", "--azure", "--tenant", "northwind"]) == 0
    assert capsys.readouterr().out == "eyJ.real.token\n"
    assert ("get_token", ("api://tenantgate/.default",), NORTHWIND) in calls and calls[-1] == ("close",)


def test_azure_failure_is_one_line_and_exit_1(cache_dir, monkeypatch, capsys) -> None:
    fake_azure_identity(monkeypatch, error="DefaultAzureCredential failed to retrieve a token.\nAttempted: ...")
    monkeypatch.setenv("TENANTGATE_ENVIRONMENT", "production")  # --azure is the production path
    assert run_cli(["token", "--azure", "--scope", "api://tenantgate-prod/.default"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "failed to retrieve a token" in captured.err


def test_the_token_command_is_registered_in_tenantgate() -> None:
    args = build_parser().parse_args(["token", "--tenant", "northwind"])
    assert args.func is cmd_token


async def test_sign_in_options_become_the_claims_the_gateway_reads(cache_dir, monkeypatch, capsys) -> None:
    with running_issuer(key_dir=cache_dir / "dev-issuer") as issuer:
        monkeypatch.setenv("TENANTGATE_DEV_ISSUER_URL", issuer.base_url)
        argv = ["token", "--tenant", "northwind", "--acrs", "c1", "--acrs", "c7", "--amr", "pwd", "--amr", "mfa",
                "--xms-cc", "cp1", "--auth-time", "1764800000"]
        assert run_cli(argv) == 0
        session = (await verify(issuer, capsys.readouterr().out.strip())).session
    assert (session.acrs, session.amr, session.xms_cc, session.auth_time) == (
        ("c1", "c7"), ("pwd", "mfa"), ("cp1",), 1764800000)


async def test_a_challenge_claims_value_is_honoured_as_sent(cache_dir, monkeypatch, capsys) -> None:
    """The base64 a challenge's claims= carries, pasted as it is, gives a token with what it asks."""
    challenge_claims = "eyJhY2Nlc3NfdG9rZW4iOnsiYWNycyI6eyJlc3NlbnRpYWwiOnRydWUsInZhbHVlIjoiYzEifX19"
    with running_issuer(key_dir=cache_dir / "dev-issuer") as issuer:
        monkeypatch.setenv("TENANTGATE_DEV_ISSUER_URL", issuer.base_url)
        assert run_cli(["token", "--tenant", "northwind", "--xms-cc", "cp1", "--claims", challenge_claims]) == 0
        session = (await verify(issuer, capsys.readouterr().out.strip())).session
    assert session.acrs == ("c1",) and session.xms_cc == ("cp1",)


@pytest.mark.parametrize(("argv", "message"), [
    (["--acrs", "c100"], "--acrs values must match"),
    (["--acrs", "C1"], "--acrs values must match"),
    (["--xms-cc", "cp 1"], "--xms-cc values must match"),
    (["--auth-time", "-5"], "--auth-time must be seconds since the epoch"),
    (["--claims", "{not json"], "--claims: the claims request is not JSON"),
    (["--claims", "!!!"], "--claims is neither JSON nor base64 of JSON"),
    (["--claims", '{"access_token": {"acrs": {"essential": true, "value": "mfa"}}}'],
     "--claims: the acrs request names no value the issuer knows"),
])
def test_unusable_sign_in_options_exit_2(argv, message, cache_dir, capsys) -> None:
    assert run_cli(["token", "--tenant", "northwind", *argv]) == 2
    assert message in capsys.readouterr().err
