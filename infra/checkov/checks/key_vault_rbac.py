"""CKV_TG_6: Key Vault authorizes data access with Azure RBAC, not access policies.

Access policies grant whole-vault permissions outside Azure RBAC's audit trail and PIM; checkov
checks purge protection and network access but not the permission model.
"""

from __future__ import annotations

from typing import Any

from _values import dig, first, is_true
from checkov.arm.base_resource_check import BaseResourceCheck as ArmResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult
from checkov.terraform.checks.resource.base_resource_check import BaseResourceCheck as TerraformResourceCheck

ID = "CKV_TG_6"
NAME = "Ensure Key Vault uses Azure RBAC authorization"


class TerraformKeyVaultRbac(TerraformResourceCheck):
    def __init__(self) -> None:
        super().__init__(name=NAME, id=ID, categories=[CheckCategories.IAM], supported_resources=["azurerm_key_vault"])

    def scan_resource_conf(self, conf: dict[str, list[Any]]) -> CheckResult:
        # `enable_rbac_authorization` is the pre-4.42 name of the same setting.
        enabled = first(conf.get("rbac_authorization_enabled", conf.get("enable_rbac_authorization")))
        if is_true(enabled) and not conf.get("access_policy"):
            return CheckResult.PASSED
        return CheckResult.FAILED


class ArmKeyVaultRbac(ArmResourceCheck):
    def __init__(self) -> None:
        super().__init__(name=NAME, id=ID, categories=[CheckCategories.IAM],
                         supported_resources=["Microsoft.KeyVault/vaults"])

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        if (is_true(dig(conf, "properties", "enableRbacAuthorization"))
                and not dig(conf, "properties", "accessPolicies")):
            return CheckResult.PASSED
        return CheckResult.FAILED


terraform_check = TerraformKeyVaultRbac()
arm_check = ArmKeyVaultRbac()
