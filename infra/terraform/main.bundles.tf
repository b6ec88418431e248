# ---------------------------------------------------------------------------------------------
# Signed policy bundles: one storage account for all stamps (geo-zone-redundant, read-access
# secondary), Entra ID only (no shared keys, no SAS use), no public access; every spoke reaches
# it over its own private endpoint, resolved through the stamp's own blob zone. The OPA sidecars download with the gateway's workload
# identity and verify the bundle signature before activating it.
# ---------------------------------------------------------------------------------------------

resource "azurerm_storage_account" "bundles" {
  #checkov:skip=CKV_AZURE_33:no queues in this account; classic queue logging needs shared keys, which are disabled
  #checkov:skip=CKV2_AZURE_33:every spoke has its private endpoint to this account (local.private_endpoints.bundles, main.endpoints.tf; tests/infra/test_parity.py checks it), but checkov 3.3.30 does not expand a module for_each whose values are references, so it never links that endpoint here
  #checkov:skip=CKV2_AZURE_1:holds signed policy bundles (code, not tenant data); Microsoft-managed keys plus infrastructure encryption by default, a customer-managed key is opt-in (customer_managed_key_enabled, main.cmk.tf)
  name                              = "st${var.name}bundles"
  location                          = azurerm_resource_group.this.location
  resource_group_name               = azurerm_resource_group.this.name
  account_kind                      = "StorageV2"
  account_tier                      = "Standard"
  account_replication_type          = "RAGZRS"
  min_tls_version                   = "TLS1_2"
  https_traffic_only_enabled        = true
  shared_access_key_enabled         = false
  default_to_oauth_authentication   = true
  public_network_access_enabled     = false
  allow_nested_items_to_be_public   = false
  cross_tenant_replication_enabled  = false
  infrastructure_encryption_enabled = true
  local_user_enabled                = false
  sftp_enabled                      = false
  tags                              = var.tags

  network_rules {
    default_action = "Deny"
    bypass         = ["AzureServices"]
  }

  blob_properties {
    versioning_enabled = true

    delete_retention_policy {
      days = 30
    }
    container_delete_retention_policy {
      days = 30
    }
  }

  sas_policy {
    expiration_period = "00.01:00:00"
    expiration_action = "Block"
  }

  # Opt-in: the account's own key (main.cmk.tf).
  dynamic "identity" {
    for_each = local.cmk ? [1] : []
    content {
      type         = "UserAssigned"
      identity_ids = [azurerm_user_assigned_identity.bundles[0].id]
    }
  }
  dynamic "customer_managed_key" {
    for_each = local.cmk ? [1] : []
    content {
      key_vault_key_id          = azurerm_key_vault_key.bundles[0].versionless_id
      user_assigned_identity_id = azurerm_user_assigned_identity.bundles[0].id
    }
  }

  depends_on = [azurerm_role_assignment.bundles_cmk]

  # Every stamp's OPA loads its policy from here: a plan that would delete or replace the
  # account fails instead (remove this block to tear the landing zone down).
  lifecycle {
    prevent_destroy = true
  }
}

resource "azurerm_storage_container" "bundles" {
  #checkov:skip=CKV2_AZURE_21:blob read logs go to Log Analytics through the diagnostic setting on blobServices/default (local.diagnostic_targets.bundles, main.monitoring.tf), not the classic storage insights this check looks for
  name                  = "bundles"
  storage_account_id    = azurerm_storage_account.bundles.id
  container_access_type = "private"

  lifecycle {
    prevent_destroy = true
  }
}
