"""Settings that decide who is an operator: named outside development, GUIDs only."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.settings import DEV_OPERATOR_TENANT, Settings

PRODUCTION = dict(environment="production", namespace_secret="a production secret of 32 bytes or more",
                  audit_signing_key="/run/secrets/audit.pem")
PLATFORM = "f0f0f0f0-0000-4000-8000-0000000000f0"


def test_production_refuses_to_start_without_naming_the_operator_tenants() -> None:
    with pytest.raises(ValidationError, match="operator_tenants must name the platform's own"):
        Settings(**PRODUCTION)
    assert Settings(**PRODUCTION, operator_tenants=[PLATFORM]).operator_tenant_ids == {PLATFORM}


def test_operator_tenants_are_read_as_a_list_of_lower_case_guids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENANTGATE_OPERATOR_TENANTS", f"{PLATFORM}, aaaaaaaa-0000-4000-8000-00000000000a")
    assert Settings().operator_tenant_ids == {PLATFORM, "aaaaaaaa-0000-4000-8000-00000000000a"}
    for bad in ("northwind", PLATFORM.upper(), f"{PLATFORM}x"):
        monkeypatch.setenv("TENANTGATE_OPERATOR_TENANTS", bad)
        with pytest.raises(ValidationError, match="operator_tenants must be tenant GUIDs"):
            Settings()


def test_development_defaults_to_the_example_datas_platform_tenant_alone() -> None:
    assert Settings().operator_tenant_ids == {DEV_OPERATOR_TENANT}
    assert Settings(operator_tenants=[PLATFORM]).operator_tenant_ids == {PLATFORM}


@pytest.mark.parametrize(("fields", "message"), [
    ({}, "needs a deployments file"),
    ({"deployments_file": "deployments.json"}, "needs TENANTGATE_REDIS_URL"),
    ({"deployments_file": "deployments.json", "redis_url": "redis://127.0.0.1:6379/0", "dev_issuer": True},
     "refused with the development issuer"),
])
def test_more_than_one_worker_needs_state_that_workers_can_share(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(workers=2, **fields)
    assert Settings(workers=1, **fields).workers == 1  # one process keeps its own state, as before


def test_workers_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENANTGATE_WORKERS", "3")
    monkeypatch.setenv("TENANTGATE_DEPLOYMENTS_FILE", "deployments.json")
    monkeypatch.setenv("TENANTGATE_REDIS_URL", "redis://127.0.0.1:6379/0")
    assert Settings().workers == 3
    monkeypatch.setenv("TENANTGATE_WORKERS", "0")
    with pytest.raises(ValidationError, match="workers"):
        Settings()
