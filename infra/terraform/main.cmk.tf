# ---------------------------------------------------------------------------------------------
# Opt-in customer-managed key for the bundle storage account (customer_managed_key_enabled): a
# Key Vault of its own, because the storage service reaches the key as a trusted service, which
# the stamps' vaults (bypass None) refuse. The account uses the versionless key, so each
# rotation is picked up without a change here.
# ---------------------------------------------------------------------------------------------

locals {
  cmk = var.customer_managed_key_enabled

  # The stamp whose spoke carries the vault's endpoint: the one in the platform region.
  cmk_endpoint_stamps = local.cmk ? { for key, stamp in var.stamps : key => stamp if stamp.location == var.location } : {}
}

resource "azurerm_user_assigned_identity" "bundles" {
  count = local.cmk ? 1 : 0

  name                = "id-${var.name}-bundles"
  location            = azurerm_resource_group.this.location
  resource_group_name = azurerm_resource_group.this.name
  tags                = var.tags
}

resource "azurerm_key_vault" "cmk" {
  count = local.cmk ? 1 : 0

  name                          = "kv-${var.name}-cmk"
  location                      = azurerm_resource_group.this.location
  resource_group_name           = azurerm_resource_group.this.name
  tenant_id                     = data.azurerm_client_config.current.tenant_id
  sku_name                      = "premium"
  rbac_authorization_enabled    = true
  purge_protection_enabled      = true
  soft_delete_retention_days    = 90
  public_network_access_enabled = false
  tags                          = var.tags

  network_acls {
    default_action = "Deny"
    bypass         = "AzureServices"
  }
}

resource "azurerm_private_endpoint" "cmk" {
  for_each = local.cmk_endpoint_stamps

  name                = "pe-${var.name}-${each.key}-kv-cmk"
  location            = each.value.location
  resource_group_name = azurerm_resource_group.stamp[each.key].name
  subnet_id           = azurerm_subnet.endpoints[each.key].id
  tags                = var.tags

  private_service_connection {
    name                           = "key-vault-cmk"
    private_connection_resource_id = azurerm_key_vault.cmk[0].id
    subresource_names              = ["vault"]
    is_manual_connection           = false
  }

  private_dns_zone_group {
    name                 = "default"
    private_dns_zone_ids = [azurerm_private_dns_zone.this["key_vault"].id]
  }
}

resource "azurerm_key_vault_key" "bundles" {
  #checkov:skip=CKV_AZURE_40:the rotation policy makes a new version every year and gives each one a two-year expiry; a fixed expiration date here would stop the account's encryption on that day
  count = local.cmk ? 1 : 0

  name         = "bundles"
  key_vault_id = azurerm_key_vault.cmk[0].id
  key_type     = "RSA-HSM"
  key_size     = 3072
  key_opts     = ["wrapKey", "unwrapKey"]

  rotation_policy {
    expire_after         = "P2Y"
    notify_before_expiry = "P30D"

    automatic {
      time_after_create = "P1Y"
    }
  }

  depends_on = [azurerm_private_endpoint.cmk]
}

resource "azurerm_role_assignment" "bundles_cmk" {
  count = local.cmk ? 1 : 0

  scope                = azurerm_key_vault.cmk[0].id
  role_definition_name = "Key Vault Crypto Service Encryption User"
  principal_id         = azurerm_user_assigned_identity.bundles[0].principal_id
}
