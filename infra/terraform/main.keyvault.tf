# ---------------------------------------------------------------------------------------------
# Key Vault (one per stamp): Azure RBAC, purge protection, soft delete, no public access,
# reached over a private endpoint (main.endpoints.tf). Holds the gateway's namespace secret
# (read by the Secrets Store CSI driver with the gateway's workload identity).
# ---------------------------------------------------------------------------------------------

resource "azurerm_key_vault" "this" {
  #checkov:skip=CKV2_AZURE_32:each vault has its private endpoint (local.private_endpoints.key_vault, main.endpoints.tf, same stamp key; tests/infra/test_parity.py checks it), but checkov 3.3.30 links the for_each references of every endpoint to the first stamp's vault only
  for_each = var.stamps

  name                          = "kv-${var.name}-${each.key}"
  location                      = each.value.location
  resource_group_name           = azurerm_resource_group.stamp[each.key].name
  tenant_id                     = data.azurerm_client_config.current.tenant_id
  sku_name                      = "premium"
  rbac_authorization_enabled    = true
  purge_protection_enabled      = true
  soft_delete_retention_days    = 90
  public_network_access_enabled = false
  tags                          = var.tags

  network_acls {
    default_action = "Deny"
    bypass         = "None"
  }
}
