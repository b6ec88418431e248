# ---------------------------------------------------------------------------------------------
# The gateway's workload identity (one per stamp): a user-assigned identity federated with the
# gateway's Kubernetes service account; it reads the namespace secret from Key Vault, signs in
# to Redis and downloads the signed policy bundle. No secret for any of it exists anywhere.
# ---------------------------------------------------------------------------------------------

resource "azurerm_user_assigned_identity" "gateway" {
  for_each = var.stamps

  name                = "id-${var.name}-${each.key}-gateway"
  location            = each.value.location
  resource_group_name = azurerm_resource_group.stamp[each.key].name
  tags                = var.tags
}

resource "azurerm_federated_identity_credential" "gateway" {
  for_each = var.stamps

  name                = "aks-${each.key}-gateway"
  resource_group_name = azurerm_resource_group.stamp[each.key].name
  parent_id           = azurerm_user_assigned_identity.gateway[each.key].id
  audience            = ["api://AzureADTokenExchange"]
  issuer              = azurerm_kubernetes_cluster.this[each.key].oidc_issuer_url
  subject             = local.gateway_subject
}

resource "azurerm_role_assignment" "gateway_key_vault" {
  for_each = var.stamps

  scope                = azurerm_key_vault.this[each.key].id
  role_definition_name = "Key Vault Secrets User"
  principal_id         = azurerm_user_assigned_identity.gateway[each.key].principal_id
}

resource "azurerm_role_assignment" "gateway_bundles" {
  for_each = var.stamps

  scope                = azurerm_storage_account.bundles.id
  role_definition_name = "Storage Blob Data Reader"
  principal_id         = azurerm_user_assigned_identity.gateway[each.key].principal_id
}
