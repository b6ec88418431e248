"""checkov over the Terraform, the Bicep, the rendered manifests and the Dockerfile: zero failed
checks, nothing it could not parse, every skip reviewed and reasoned, and the project's own
checks both running and able to fail."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.infra.conftest import CUSTOM_CHECKS as CUSTOM_CHECKS_DIR
from tests.infra.conftest import INFRA, RENDER_MODES, TERRAFORM_EXAMPLES, Tools, checkov, extract_settings

# Every skip, by framework: check ID -> the kinds of resource where it is skipped. A new skip fails
# this test until it is reviewed here; each one also carries its reason inline
# (test_every_skip_carries_a_reason).
REVIEWED_SKIPS = {
    "terraform": {
        "CKV_AZURE_117": "azurerm_kubernetes_cluster",  # ephemeral, host-encrypted OS disks; no volumes
        "CKV_AZURE_33": "azurerm_storage_account",  # no queues; classic queue logging needs shared keys
        "CKV2_AZURE_1": "azurerm_storage_account",  # signed policy code, not tenant data
        "CKV2_AZURE_21": "azurerm_storage_container",  # blob logs via diagnostic settings instead
        "CKV_AZURE_216": "azurerm_firewall",  # threat intel Deny lives on the firewall policy
        "CKV_AZURE_182": "azurerm_virtual_network",  # one DNS server on purpose: the firewall's proxy
        "CKV_AZURE_183": "azurerm_virtual_network",  # same
        "CKV2_AZURE_32": "azurerm_key_vault",  # checkov links for_each endpoints to one vault only
        "CKV2_AZURE_33": "azurerm_storage_account",  # checkov does not expand the endpoints' module for_each
        "CKV_AZURE_164": "azurerm_container_registry",  # Docker Content Trust is deprecated by the service
        "CKV_AZURE_165": "azurerm_container_registry",  # one registry per stamp, no geo-replication
        "CKV_AZURE_166": "azurerm_container_registry",  # quarantine would block every pull
        "CKV_AZURE_40": "azurerm_key_vault_key",  # opt-in CMK: rotation policy expires each version
    },
    "bicep": {
        "CKV_AZURE_8": "Microsoft.ContainerService/managedClusters",  # dashboard add-on no longer exists
        "CKV_AZURE_172": "Microsoft.ContainerService/managedClusters",  # rotation on; string vs bool
        "CKV_AZURE_43": "Microsoft.Storage/storageAccounts",  # name built from a validated parameter
        "CKV_AZURE_216": "Microsoft.Network/azureFirewalls",  # threat intel Deny on the policy
        "CKV_AZURE_182": "Microsoft.Network/virtualNetworks",  # the firewall's DNS proxy
        "CKV_AZURE_166": "Microsoft.ContainerRegistry/registries",  # quarantine would block every pull
        "CKV_AZURE_87": "Microsoft.Security/pricings",  # the Containers plan, read as Key Vault's
        "CKV_AZURE_40": "Microsoft.KeyVault/vaults/keys",  # opt-in CMK: rotation policy expires each version
    },
    "kubernetes": {
        "CKV_K8S_35": "Deployment",  # settings are env vars; the value comes from Key Vault via CSI
        "CKV_K8S_43": ("Deployment", "StatefulSet", "CronJob"),  # digests are set at install (image.digest)
    },
    "dockerfile": {},
}

CUSTOM_CHECKS = {
    "terraform": {
        "CKV_TG_1": "azurerm_cdn_frontdoor_firewall_policy",
        "CKV_TG_2": "azurerm_kubernetes_cluster",
        "CKV_TG_3": "azurerm_kubernetes_cluster",
        "CKV_TG_4": "azurerm_managed_redis",
        "CKV_TG_5": "azurerm_managed_redis",
        "CKV_TG_6": "azurerm_key_vault",
    },
    "bicep": {
        "CKV_TG_1": "Microsoft.Network/FrontDoorWebApplicationFirewallPolicies",
        "CKV_TG_2": "Microsoft.ContainerService/managedClusters",
        "CKV_TG_3": "Microsoft.ContainerService/managedClusters",
        "CKV_TG_4": "Microsoft.Cache/redisEnterprise/databases",
        "CKV_TG_5": "Microsoft.Cache/redisEnterprise",
        "CKV_TG_6": "Microsoft.KeyVault/vaults",
    },
}


def _checks(reports: list[dict], outcome: str) -> list[dict]:
    return [check for report in reports for check in report.get("results", {}).get(outcome, [])]


def _describe(checks: list[dict]) -> str:
    return "\n".join(f"  {c['check_id']} {c['resource']} ({c['file_path']}): {c['check_name']}" for c in checks)


def _assert_no_failed_checks(reports: list[dict]) -> None:
    failed = _checks(reports, "failed_checks")
    assert not failed, "checkov failed checks:\n" + _describe(failed)


def _assert_everything_parsed(reports: list[dict]) -> None:
    # checkov reports a file it cannot parse as a parsing error and otherwise passes it silently.
    for report in reports:
        errors = report.get("results", {}).get("parsing_errors", [])
        assert not errors, f"checkov could not parse: {errors}"
        assert report["summary"]["parsing_errors"] == 0
        assert report["summary"]["resource_count"] > 0, "checkov found nothing to check"


@pytest.mark.parametrize("example", [example.name for example in TERRAFORM_EXAMPLES])
def test_checkov_terraform_example_has_no_failed_checks(example: str,
                                                        terraform_example_reports: dict[str, list[dict]]) -> None:
    reports = terraform_example_reports[example]
    assert len(reports) == 1, f"one scan of {example}, one report"
    _assert_everything_parsed(reports)
    _assert_no_failed_checks(reports)


def _addresses(reports: list[dict]) -> set[str]:
    outcomes = ("passed_checks", "failed_checks", "skipped_checks")
    return {check["resource"] for outcome in outcomes for check in _checks(reports, outcome)}


def test_checkov_saw_every_stamp_of_every_example(tools: Tools,
                                                  terraform_example_reports: dict[str, list[dict]]) -> None:
    # Two --directory arguments once made checkov scan single-region twice and two-region never,
    # with every check passing. Each example's stamps, read from its source, must be in its report.
    layout = extract_settings(tools, "examples", INFRA / "terraform")
    assert sorted(terraform_example_reports) == sorted(layout["examples"])
    checked = {
        re.sub(r'\["[^"]*"\]$', "", address).removeprefix("module.tenantgate.")
        for reports in terraform_example_reports.values()
        for address in _addresses(reports)
    }
    # The resources that checkov has checks for (a route table, say, has none).
    per_stamp = sorted(set(layout["per_stamp_resources"]) & checked)
    single = sorted(set(layout["single_resources"]) & checked)
    assert {"azurerm_kubernetes_cluster.this", "azurerm_key_vault.this", "azurerm_managed_redis.this"} <= set(per_stamp)
    assert {"azurerm_storage_account.bundles", "azurerm_cdn_frontdoor_firewall_policy.this"} <= set(single)
    for example, stamps in layout["examples"].items():
        seen = _addresses(terraform_example_reports[example])
        expected = [f'module.tenantgate.{resource}["{stamp}"]' for stamp in stamps for resource in per_stamp]
        expected += [f"module.tenantgate.{resource}" for resource in single]
        missing = [address for address in expected if address not in seen]
        assert not missing, f"checkov's scan of {example} never saw: {missing}"


def test_checkov_bicep_has_no_failed_checks(bicep_reports: list[dict]) -> None:
    _assert_everything_parsed(bicep_reports)
    _assert_no_failed_checks(bicep_reports)


@pytest.mark.parametrize("mode", list(RENDER_MODES))
def test_checkov_rendered_manifests_have_no_failed_checks(
    mode: str, manifest_mode_reports: dict[str, list[dict]], rendered_manifests: dict[str, Path]
) -> None:
    reports = manifest_mode_reports[mode]
    _assert_everything_parsed(reports)
    _assert_no_failed_checks(reports)
    # Every workload the rendering holds was checked, by address (kind.namespace.name).
    documents = [document for document in yaml.safe_load_all(rendered_manifests[mode].read_text(encoding="utf-8"))
                 if document]
    workloads = {
        f"{document['kind']}.tenantgate.{document['metadata']['name']}"
        for document in documents
        if document["kind"] in ("Deployment", "StatefulSet", "Ingress", "ServiceAccount")
    }
    assert workloads, f"nothing to check in the {mode} rendering"
    missing = sorted(workloads - _addresses(reports))
    assert not missing, f"checkov's scan of the {mode} rendering never saw: {missing}"


def test_checkov_dockerfile_has_no_failed_checks(dockerfile_reports: list[dict]) -> None:
    _assert_everything_parsed(dockerfile_reports)
    _assert_no_failed_checks(dockerfile_reports)


def test_checkov_bicep_parsed_every_file(bicep_reports: list[dict]) -> None:
    _assert_everything_parsed(bicep_reports)
    resource_files = set()
    for check in _checks(bicep_reports, "passed_checks") + _checks(bicep_reports, "skipped_checks"):
        resource_files.add(Path(check["file_path"]).name)
    for name in ("aks.bicep", "key-vault.bicep", "redis.bicep", "front-door.bicep", "network.bicep", "bundles.bicep",
                 "registry.bicep"):
        assert name in resource_files, f"checkov checked nothing in {name}"


@pytest.mark.parametrize("framework", ["terraform", "bicep", "kubernetes"])
def test_every_skip_carries_a_reason(framework: str, request: pytest.FixtureRequest) -> None:
    fixture = {"terraform": "terraform_reports", "bicep": "bicep_reports", "kubernetes": "manifest_reports"}
    skipped = _checks(request.getfixturevalue(fixture[framework]), "skipped_checks")
    for check in skipped:
        reason = (check["check_result"].get("suppress_comment") or "").strip()
        assert len(reason.split()) >= 5, f"{check['check_id']} on {check['resource']} is skipped without a reason"


def _kinds(reviewed: str | tuple[str, ...] | None) -> tuple[str, ...]:
    return (reviewed,) if isinstance(reviewed, str) else reviewed or ()


@pytest.mark.parametrize("framework", ["terraform", "bicep", "kubernetes"])
def test_skips_are_the_reviewed_ones(framework: str, request: pytest.FixtureRequest) -> None:
    fixture = {"terraform": "terraform_reports", "bicep": "bicep_reports", "kubernetes": "manifest_reports"}
    skipped = _checks(request.getfixturevalue(fixture[framework]), "skipped_checks")
    reviewed = REVIEWED_SKIPS[framework]
    unreviewed = sorted(
        f"{check['check_id']} on {check['resource']}"
        for check in skipped
        if not any(kind in check["resource"] for kind in _kinds(reviewed.get(check["check_id"])))
    )
    assert not unreviewed, f"skips not reviewed in REVIEWED_SKIPS: {unreviewed}"
    unused = sorted(set(reviewed) - {check["check_id"] for check in skipped})
    assert not unused, f"reviewed skips no longer in the code (remove them): {unused}"


def test_custom_checks_are_all_listed() -> None:
    # A check file added without an entry here would run unseen, or not load, unnoticed.
    defined = {
        match
        for path in CUSTOM_CHECKS_DIR.glob("*.py")
        for match in re.findall(r'^\w*ID = "(CKV_TG_\d+)"', path.read_text(encoding="utf-8"), re.MULTILINE)
    }
    assert defined == set(CUSTOM_CHECKS["terraform"]) == set(CUSTOM_CHECKS["bicep"])


@pytest.mark.parametrize("framework", ["terraform", "bicep"])
def test_custom_checks_ran_and_passed(framework: str, request: pytest.FixtureRequest) -> None:
    reports = request.getfixturevalue(f"{framework}_reports")
    passed = {(check["check_id"], check["resource"]) for check in _checks(reports, "passed_checks")}
    for check_id, resource_type in CUSTOM_CHECKS[framework].items():
        assert any(cid == check_id and resource_type in resource for cid, resource in passed), (
            f"{check_id} did not pass on any {resource_type}"
        )


INSECURE_TERRAFORM = """
resource "azurerm_cdn_frontdoor_firewall_policy" "detect" {
  name                = "wafdetect"
  resource_group_name = "rg"
  sku_name            = "Premium_AzureFrontDoor"
  mode                = "Detection"
  managed_rule {
    type    = "Microsoft_DefaultRuleSet"
    version = "2.1"
    action  = "Block"
  }
}

resource "azurerm_kubernetes_cluster" "no_workload_identity" {
  name                   = "aks"
  location               = "westeurope"
  resource_group_name    = "rg"
  dns_prefix             = "aks"
  oidc_issuer_enabled    = true
  local_account_disabled = false
  default_node_pool {
    name    = "system"
    vm_size = "Standard_D4ds_v5"
  }
}

resource "azurerm_managed_redis" "keys" {
  name                  = "redis"
  location              = "westeurope"
  resource_group_name   = "rg"
  sku_name              = "Balanced_B1"
  public_network_access = "Enabled"
  default_database {
    access_keys_authentication_enabled = true
    client_protocol                    = "Plaintext"
  }
}

resource "azurerm_key_vault" "policies" {
  name                       = "kv"
  location                   = "westeurope"
  resource_group_name        = "rg"
  tenant_id                  = "00000000-0000-0000-0000-000000000000"
  sku_name                   = "standard"
  rbac_authorization_enabled = false
}
"""

INSECURE_BICEP = """
resource waf 'Microsoft.Network/FrontDoorWebApplicationFirewallPolicies@2024-02-01' = {
  name: 'wafdetect'
  location: 'global'
  properties: {
    policySettings: {
      enabledState: 'Enabled'
      mode: 'Detection'
    }
  }
}

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  name: 'kv'
  location: 'westeurope'
  properties: {
    tenantId: subscription().tenantId
    sku: {
      family: 'A'
      name: 'standard'
    }
    enableRbacAuthorization: false
  }
}

resource cache 'Microsoft.Cache/redisEnterprise@2025-07-01' = {
  name: 'redis'
  location: 'westeurope'
  sku: {
    name: 'Balanced_B1'
  }
  properties: {
    publicNetworkAccess: 'Enabled'
  }
}

resource database 'Microsoft.Cache/redisEnterprise/databases@2025-07-01' = {
  parent: cache
  name: 'default'
  properties: {
    accessKeysAuthentication: 'Enabled'
    clientProtocol: 'Plaintext'
  }
}

resource cluster 'Microsoft.ContainerService/managedClusters@2024-09-01' = {
  name: 'aks'
  location: 'westeurope'
  properties: {
    dnsPrefix: 'aks'
    disableLocalAccounts: false
    oidcIssuerProfile: {
      enabled: true
    }
  }
}
"""

# Syntax checkov's Bicep parser does not read (a lambda): it must surface as a parsing error.
UNPARSABLE_BICEP = """
param stamps array
var locations = map(stamps, stamp => stamp.location)
"""


def test_custom_checks_fail_insecure_settings(tools: Tools, tmp_path: Path) -> None:
    (tmp_path / "terraform").mkdir()
    (tmp_path / "terraform" / "main.tf").write_text(INSECURE_TERRAFORM, encoding="utf-8")
    (tmp_path / "bicep").mkdir()
    (tmp_path / "bicep" / "main.bicep").write_text(INSECURE_BICEP, encoding="utf-8")

    for framework, expected in (
        ("terraform", {"CKV_TG_1", "CKV_TG_2", "CKV_TG_3", "CKV_TG_4", "CKV_TG_5", "CKV_TG_6"}),
        ("bicep", {"CKV_TG_1", "CKV_TG_2", "CKV_TG_3", "CKV_TG_4", "CKV_TG_5", "CKV_TG_6"}),
    ):
        reports = checkov(tools, framework, tmp_path / framework)
        failed = {check["check_id"] for check in _checks(reports, "failed_checks")
                  if check["check_id"].startswith("CKV_TG_")}
        assert failed == expected, (f"{framework}: custom checks that failed {sorted(failed)}, "
                                    f"expected {sorted(expected)}")


def test_unparsable_bicep_is_reported_not_passed(tools: Tools, tmp_path: Path) -> None:
    shutil.copy(INFRA / "bicep" / "modules" / "key-vault.bicep", tmp_path / "key-vault.bicep")
    (tmp_path / "broken.bicep").write_text(UNPARSABLE_BICEP, encoding="utf-8")
    reports = checkov(tools, "bicep", tmp_path)
    errors = [error for report in reports for error in report.get("results", {}).get("parsing_errors", [])]
    assert any(error.endswith("broken.bicep") for error in errors), errors
    with pytest.raises(AssertionError, match="could not parse"):
        _assert_everything_parsed(reports)
