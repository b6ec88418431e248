"""CKV_TG_2: AKS has workload identity and the OIDC issuer on; CKV_TG_3: Entra ID with Azure RBAC
and no local accounts.

Workload identity is how the gateway reaches Key Vault, Redis and the bundle store without a
secret; checkov has no check for it. Its local-accounts check exists for Terraform only.
"""

from __future__ import annotations

from typing import Any

from _values import dig, first, is_true
from checkov.arm.base_resource_check import BaseResourceCheck as ArmResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult
from checkov.terraform.checks.resource.base_resource_check import BaseResourceCheck as TerraformResourceCheck

WORKLOAD_IDENTITY_ID = "CKV_TG_2"
WORKLOAD_IDENTITY_NAME = "Ensure AKS enables workload identity and the OIDC issuer"
ENTRA_RBAC_ID = "CKV_TG_3"
ENTRA_RBAC_NAME = "Ensure AKS authorizes with Entra ID and Azure RBAC and has local accounts disabled"


def _result(ok: bool) -> CheckResult:
    return CheckResult.PASSED if ok else CheckResult.FAILED


class TerraformAksWorkloadIdentity(TerraformResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name=WORKLOAD_IDENTITY_NAME,
            id=WORKLOAD_IDENTITY_ID,
            categories=[CheckCategories.IAM],
            supported_resources=["azurerm_kubernetes_cluster"],
        )

    def scan_resource_conf(self, conf: dict[str, list[Any]]) -> CheckResult:
        return _result(is_true(first(conf.get("workload_identity_enabled")))
                       and is_true(first(conf.get("oidc_issuer_enabled"))))


class ArmAksWorkloadIdentity(ArmResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name=WORKLOAD_IDENTITY_NAME,
            id=WORKLOAD_IDENTITY_ID,
            categories=[CheckCategories.IAM],
            supported_resources=["Microsoft.ContainerService/managedClusters"],
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        return _result(
            is_true(dig(conf, "properties", "securityProfile", "workloadIdentity", "enabled"))
            and is_true(dig(conf, "properties", "oidcIssuerProfile", "enabled"))
        )


class TerraformAksEntraRbac(TerraformResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name=ENTRA_RBAC_NAME,
            id=ENTRA_RBAC_ID,
            categories=[CheckCategories.IAM],
            supported_resources=["azurerm_kubernetes_cluster"],
        )

    def scan_resource_conf(self, conf: dict[str, list[Any]]) -> CheckResult:
        return _result(
            is_true(first(conf.get("local_account_disabled")))
            and is_true(dig(conf, "azure_active_directory_role_based_access_control", "azure_rbac_enabled"))
        )


class ArmAksEntraRbac(ArmResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name=ENTRA_RBAC_NAME,
            id=ENTRA_RBAC_ID,
            categories=[CheckCategories.IAM],
            supported_resources=["Microsoft.ContainerService/managedClusters"],
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        return _result(
            is_true(dig(conf, "properties", "disableLocalAccounts"))
            and is_true(dig(conf, "properties", "aadProfile", "managed"))
            and is_true(dig(conf, "properties", "aadProfile", "enableAzureRBAC"))
        )


terraform_workload_identity = TerraformAksWorkloadIdentity()
arm_workload_identity = ArmAksWorkloadIdentity()
terraform_entra_rbac = TerraformAksEntraRbac()
arm_entra_rbac = ArmAksEntraRbac()
