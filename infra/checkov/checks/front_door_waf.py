"""CKV_TG_1: the Front Door WAF policy is enabled, in Prevention mode, with managed rule sets.

checkov checks that a WAF exists, not that it blocks: a policy left in Detection mode only logs.
"""

from __future__ import annotations

from typing import Any

from _values import blocks, dig, first, is_false
from checkov.arm.base_resource_check import BaseResourceCheck as ArmResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult
from checkov.terraform.checks.resource.base_resource_check import BaseResourceCheck as TerraformResourceCheck

ID = "CKV_TG_1"
NAME = "Ensure the Front Door WAF policy is enabled in Prevention mode with managed rule sets"


class TerraformFrontDoorWafPrevention(TerraformResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name=NAME,
            id=ID,
            categories=[CheckCategories.APPLICATION_SECURITY],
            supported_resources=["azurerm_cdn_frontdoor_firewall_policy"],
        )

    def scan_resource_conf(self, conf: dict[str, list[Any]]) -> CheckResult:
        if is_false(first(conf.get("enabled", [True]))):
            return CheckResult.FAILED
        if first(conf.get("mode")) != "Prevention":
            return CheckResult.FAILED
        rule_sets = blocks(conf, "managed_rule")
        if not rule_sets or any(first(rule.get("action")) not in ("Block", None) for rule in rule_sets):
            return CheckResult.FAILED
        return CheckResult.PASSED


class ArmFrontDoorWafPrevention(ArmResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name=NAME,
            id=ID,
            categories=[CheckCategories.APPLICATION_SECURITY],
            supported_resources=["Microsoft.Network/FrontDoorWebApplicationFirewallPolicies"],
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        if dig(conf, "properties", "policySettings", "enabledState") != "Enabled":
            return CheckResult.FAILED
        if dig(conf, "properties", "policySettings", "mode") != "Prevention":
            return CheckResult.FAILED
        rule_sets = dig(conf, "properties", "managedRules", "managedRuleSets")
        if not isinstance(rule_sets, list) or not rule_sets:
            return CheckResult.FAILED
        if any(isinstance(rule, dict) and rule.get("ruleSetAction", "Block") != "Block" for rule in rule_sets):
            return CheckResult.FAILED
        return CheckResult.PASSED


terraform_check = TerraformFrontDoorWafPrevention()
arm_check = ArmFrontDoorWafPrevention()
