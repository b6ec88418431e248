"""CKV_TG_4: Redis has access keys disabled, so Entra ID is the only way in; CKV_TG_5: Redis is
reached over TLS only and not from public networks.

checkov has no checks for Azure Managed Redis, and none for access keys on Azure Cache for Redis.
Both kinds are covered so a switch between them cannot drop the guarantee.
"""

from __future__ import annotations

from typing import Any

from _values import dig, first, is_false, is_true
from checkov.arm.base_resource_check import BaseResourceCheck as ArmResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult
from checkov.terraform.checks.resource.base_resource_check import BaseResourceCheck as TerraformResourceCheck

KEYS_ID = "CKV_TG_4"
KEYS_NAME = "Ensure Redis has access keys disabled and Entra ID authentication on"
TLS_ID = "CKV_TG_5"
TLS_NAME = "Ensure Redis accepts TLS only and no public network access"


def _result(ok: bool) -> CheckResult:
    return CheckResult.PASSED if ok else CheckResult.FAILED


class TerraformRedisEntraOnly(TerraformResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name=KEYS_NAME,
            id=KEYS_ID,
            categories=[CheckCategories.IAM],
            supported_resources=["azurerm_managed_redis", "azurerm_redis_cache"],
        )

    def scan_resource_conf(self, conf: dict[str, list[Any]]) -> CheckResult:
        if self.entity_type == "azurerm_managed_redis":
            # Managed Redis always accepts Entra ID tokens; with keys off they are the only way in.
            return _result(is_false(dig(conf, "default_database", "access_keys_authentication_enabled")))
        return _result(
            is_false(first(conf.get("access_keys_authentication_enabled")))
            and is_true(dig(conf, "redis_configuration", "active_directory_authentication_enabled"))
        )


class ArmRedisEntraOnly(ArmResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name=KEYS_NAME,
            id=KEYS_ID,
            categories=[CheckCategories.IAM],
            supported_resources=["Microsoft.Cache/redisEnterprise/databases", "Microsoft.Cache/redis"],
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        if self.entity_type == "Microsoft.Cache/redisEnterprise/databases":
            return _result(dig(conf, "properties", "accessKeysAuthentication") == "Disabled")
        return _result(
            is_true(dig(conf, "properties", "disableAccessKeyAuthentication"))
            and is_true(dig(conf, "properties", "redisConfiguration", "aad-enabled"))
        )


class TerraformRedisTlsPrivate(TerraformResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name=TLS_NAME,
            id=TLS_ID,
            categories=[CheckCategories.NETWORKING],
            supported_resources=["azurerm_managed_redis", "azurerm_redis_cache"],
        )

    def scan_resource_conf(self, conf: dict[str, list[Any]]) -> CheckResult:
        if self.entity_type == "azurerm_managed_redis":
            return _result(
                dig(conf, "default_database", "client_protocol") == "Encrypted"
                and first(conf.get("public_network_access")) == "Disabled"
            )
        return _result(
            is_false(first(conf.get("non_ssl_port_enabled", [False])))
            and first(conf.get("minimum_tls_version")) == "1.2"
            and is_false(first(conf.get("public_network_access_enabled")))
        )


class ArmRedisTlsPrivate(ArmResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name=TLS_NAME,
            id=TLS_ID,
            categories=[CheckCategories.NETWORKING],
            supported_resources=[
                "Microsoft.Cache/redisEnterprise",
                "Microsoft.Cache/redisEnterprise/databases",
                "Microsoft.Cache/redis",
            ],
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        if self.entity_type == "Microsoft.Cache/redisEnterprise":
            return _result(
                dig(conf, "properties", "minimumTlsVersion") == "1.2"
                and dig(conf, "properties", "publicNetworkAccess") == "Disabled"
            )
        if self.entity_type == "Microsoft.Cache/redisEnterprise/databases":
            return _result(dig(conf, "properties", "clientProtocol") == "Encrypted")
        return _result(
            not is_true(dig(conf, "properties", "enableNonSslPort"))
            and dig(conf, "properties", "minimumTlsVersion") == "1.2"
            and dig(conf, "properties", "publicNetworkAccess") == "Disabled"
        )


terraform_entra_only = TerraformRedisEntraOnly()
arm_entra_only = ArmRedisEntraOnly()
terraform_tls_private = TerraformRedisTlsPrivate()
arm_tls_private = ArmRedisTlsPrivate()
