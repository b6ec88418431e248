"""Terraform and Bicep deploy the same landing zone: the same components with the same security
settings, read from the source by python-hcl2 and by pycep-parser (checkov's Bicep parser)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.infra.conftest import INFRA, Tools, extract_settings


@pytest.fixture(scope="module")
def terraform_settings(tools: Tools) -> dict:
    return extract_settings(tools, "terraform", INFRA / "terraform")


@pytest.fixture(scope="module")
def bicep_settings(tools: Tools) -> dict:
    return extract_settings(tools, "bicep", INFRA / "bicep")


def _differences(left: object, right: object, path: str = "") -> list[str]:
    if isinstance(left, dict) and isinstance(right, dict):
        found = []
        for key in sorted(set(left) | set(right)):
            found += _differences(left.get(key), right.get(key), f"{path}.{key}" if path else key)
        return found
    return [] if left == right else [f"{path}: terraform={left!r} bicep={right!r}"]


def test_bicep_and_terraform_define_the_same_security_settings(terraform_settings: dict, bicep_settings: dict) -> None:
    differences = _differences(terraform_settings, bicep_settings)
    assert not differences, "Terraform and Bicep differ:\n  " + "\n  ".join(differences)


def test_no_setting_went_unread(terraform_settings: dict, bicep_settings: dict) -> None:
    # A null means an extractor lost track of an attribute; equal nulls would hide it.
    def nulls(node: object, path: str = "") -> list[str]:
        if isinstance(node, dict):
            return [found for key, value in node.items() for found in nulls(value, f"{path}.{key}")]
        return [path] if node is None else []

    assert not nulls(terraform_settings), nulls(terraform_settings)
    assert not nulls(bicep_settings), nulls(bicep_settings)


def test_landing_zone_settings_are_the_secure_ones(terraform_settings: dict) -> None:
    # Parity alone would pass two equally weak templates; these are the values a reviewer signs.
    settings = terraform_settings
    assert settings["key_vault"] == {
        "rbac_authorization": True,
        "purge_protection": True,
        "soft_delete_retention_days": 90,
        "public_network_access": False,
        "network_default_action": "Deny",
        "network_bypass": "None",
        "sku": "premium",
        "private_endpoint_per_vault": True,
    }
    redis = settings["redis"]
    assert redis["access_keys_authentication"] is False
    assert redis["entra_access_policy_assignments"] >= 1
    assert redis["tls_only"] is True
    assert redis["public_network_access"] is False

    aks = settings["aks"]
    for setting in (
        "local_accounts_disabled",
        "entra_azure_rbac",
        "workload_identity",
        "oidc_issuer",
        "azure_policy",
        "private_cluster_by_default",
        "defender",
        "container_insights_with_entra",
        "managed_prometheus",
        "secret_store_rotation",
    ):
        assert aks[setting] is True, setting
    assert aks["private_cluster_public_fqdn"] is False
    assert aks["network_policy"] == "cilium"
    assert aks["outbound_type"] == "userDefinedRouting"
    assert aks["gpu_pool"]["taints"] == ["nvidia.com/gpu=present:NoSchedule"]
    assert aks["gpu_pool"]["mig_profile_from_input"] is True
    assert aks["system_pool"]["critical_addons_only"] is True
    assert aks["system_pool"]["host_encryption"] is aks["gpu_pool"]["host_encryption"] is True
    # The ephemeral OS disk lives on the temp disk: 64 GiB on the default Standard_NC24ads_A100_v4
    # (AKS's default of 128 GiB would not fit). The system pool's D4ds_v5 has 150 GiB.
    assert aks["gpu_pool"]["os_disk_type"] == "Ephemeral"
    assert aks["gpu_pool"]["os_disk_size_gb"] == "64"

    assert settings["waf"]["mode"] == "Prevention"
    assert settings["waf"]["enabled"] is True
    assert {rule[0] for rule in settings["waf"]["managed_rule_sets"]} == {"Microsoft_DefaultRuleSet",
                                                                          "Microsoft_BotManagerRuleSet"}
    assert settings["front_door"]["sku"] == "Premium_AzureFrontDoor"
    assert settings["front_door"]["origin_over_private_link"] is True

    assert settings["firewall"]["threat_intel_mode"] == "Deny"
    assert settings["firewall"]["default_route_next_hop"] == "VirtualAppliance"
    assert settings["bundle_storage"]["shared_key_access"] is False
    assert settings["bundle_storage"]["public_network_access"] is False
    # What checkov's CKV2_AZURE_33 can no longer follow (main.bundles.tf says why it is skipped).
    assert settings["bundle_storage"]["private_endpoint_per_spoke"] is True
    assert sorted(settings["private_endpoint_groups"]) == [
        "azuremonitor", "blob", "grafana", "redisEnterprise", "registry", "vault", "vault",
    ]  # fmt: skip

    assert settings["required_tags"] == ["costCenter", "environment", "owner", "tenantId"]
    assert set(settings["policy_assignments"]) == set(settings["policy_definition_ids"])
    assert len(settings["policy_assignments"]) == 5  # locations, tags, Key Vault, AKS private, diagnostics

    kinds = {entry[0] for entry in settings["diagnostic_settings"]}
    assert kinds == {
        "aks", "key_vault", "redis", "firewall", "public_ip", "virtual_network",
        "network_security_group", "front_door", "log_analytics", "storage_blob", "container_registry",
    }  # fmt: skip
    assert settings["workload_identity"]["subject"] == "system:serviceaccount:{}:{}"
    # Nodes resolve the private API server through the linked zones; a route needs an origin.
    assert settings["conditions_and_order"] == {
        "private_dns_links_before_aks": True,
        "front_door_route_only_with_origins": True,
    }

    assert settings["kubernetes_policies"]["assignments"] == 3  # pod security baseline, images, internal LBs
    assert settings["kubernetes_policies"]["effect_default"] == "deny"
    assert len(settings["deny_policy_definition_ids"]) == 4  # Storage and Redis: public access, local auth
    assert settings["defender_plans"] == ["Containers"]
    # Rules sending to the workspaces sit in the workspaces' region, whatever the stamp's.
    assert all(in_workspace_region for _, in_workspace_region in settings["data_collection_rules"])
    assert "privatelink.blob.core.windows.net" in settings["stamp_private_dns_zones"]


def test_nodes_pull_only_from_the_stamps_private_registry(terraform_settings: dict) -> None:
    assert terraform_settings["container_registry"] == {
        "sku": "Premium",
        "admin_user": False,
        "anonymous_pull": False,
        "public_network_access": False,
        "trusted_services_bypass": "AzureServices",
        "zone_redundancy": True,
        "dedicated_data_endpoints": True,
        "export_policy": False,
        "retention_days": 7,
    }
    assert "privatelink.azurecr.io" in terraform_settings["private_dns_zones"]
    assert "AcrPull" in terraform_settings["role_assignments"]  # for the kubelet identity
    assert terraform_settings["aks"]["gpu_pool"]["gpu_driver"] == "Install"


def test_ingress_is_declared_with_its_key_vault_role(terraform_settings: dict) -> None:
    # Declared, so a re-apply keeps the add-on and the Private Link Service Front Door uses.
    aks = terraform_settings["aks"]
    assert (aks["web_app_routing"], aks["web_app_routing_nginx"]) == (True, "AnnotationControlled")
    # The add-on's identity reads the certificate, beside the gateway's own secret read.
    assert terraform_settings["role_assignments"].count("Key Vault Secrets User") == 2


def test_waf_exempts_only_the_prompt_fields(terraform_settings: dict) -> None:
    assert terraform_settings["waf"]["body_exclusions"] == [
        ["Microsoft_DefaultRuleSet", "RequestBodyJsonArgNames", "StartsWith", "messages"],
        ["Microsoft_DefaultRuleSet", "RequestBodyJsonArgNames", "StartsWith", "prompt"],
    ]


def _drifted_keys(tools: Tools, tmp_path: Path, terraform_settings: dict,
                  edits: tuple[tuple[str, str, str], ...]) -> list[str]:
    """The settings that differ from the Terraform once `edits` (file, old, new) change a copy of
    the Bicep."""
    drifted = tmp_path / "infra" / "bicep"
    shutil.copytree(INFRA / "bicep", drifted)
    # The alert rules come from the chart's files (loadYamlContent('../../helm/...')).
    (tmp_path / "infra" / "helm").symlink_to(INFRA / "helm")
    for name, old, new in edits:
        path = drifted / "modules" / name
        text = path.read_text(encoding="utf-8")
        assert old in text
        path.write_text(text.replace(old, new), encoding="utf-8")
    differences = _differences(terraform_settings, extract_settings(tools, "bicep", drifted))
    return sorted(line.split(":")[0] for line in differences)


def test_parity_catches_a_drifted_setting(tools: Tools, tmp_path: Path, terraform_settings: dict) -> None:
    edits = (
        ("front-door.bicep", "mode: 'Prevention'", "mode: 'Detection'"),
        ("key-vault.bicep", "enablePurgeProtection: true", "enablePurgeProtection: false"),
        ("redis.bicep", "accessKeysAuthentication: 'Disabled'", "accessKeysAuthentication: 'Enabled'"),
    )
    assert _drifted_keys(tools, tmp_path, terraform_settings, edits) == [
        "key_vault.purge_protection",
        "redis.access_keys_authentication",
        "waf.mode",
    ]


def test_parity_catches_a_lost_condition_or_order(tools: Tools, tmp_path: Path, terraform_settings: dict) -> None:
    # main's Bicep before issue 14: the route was unconditional, and the zones were linked in
    # main.bicep after the whole stamp, AKS included.
    edits = (
        ("front-door.bicep", "= if (contains(stampHasIngress, true)) {", "= {"),
        ("stamp.bicep", "    apiServerZoneContributor\n    privateDnsLinks\n", "    apiServerZoneContributor\n"),
    )
    assert _drifted_keys(tools, tmp_path, terraform_settings, edits) == [
        "conditions_and_order.front_door_route_only_with_origins",
        "conditions_and_order.private_dns_links_before_aks",
    ]


def test_parity_catches_a_private_endpoint_gone_astray(tools: Tools, tmp_path: Path, terraform_settings: dict) -> None:
    # The endpoints are one loop in stamp.bicep: an entry pointed at the wrong service, and one
    # connected to the wrong group, are each caught.
    edits = (
        ("stamp.bicep", "  bundles: bundleStorageAccountId\n", "  bundles: grafanaId\n"),
        ("stamp.bicep", "groupId: 'redisEnterprise'", "groupId: 'redis'"),
    )
    assert _drifted_keys(tools, tmp_path, terraform_settings, edits) == [
        "bundle_storage.private_endpoint_per_spoke",
        "private_endpoint_groups",
    ]
