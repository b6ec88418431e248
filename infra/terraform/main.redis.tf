# ---------------------------------------------------------------------------------------------
# Azure Managed Redis (one per stamp) for quotas and shared counters: TLS only, access keys
# disabled so Entra ID is the only way in, no public access, reached over a private endpoint
# (main.endpoints.tf). The cache is disposable: each region keeps its own budgets (see
# docs/deploy.md, failover).
# ---------------------------------------------------------------------------------------------

resource "azurerm_managed_redis" "this" {
  for_each = var.stamps

  name                      = "redis-${var.name}-${each.key}"
  location                  = each.value.location
  resource_group_name       = azurerm_resource_group.stamp[each.key].name
  sku_name                  = "Balanced_B1"
  high_availability_enabled = true
  public_network_access     = "Disabled"
  tags                      = var.tags

  default_database {
    access_keys_authentication_enabled = false
    client_protocol                    = "Encrypted"
    # One endpoint for clients; the limiter's keys are hash-tagged, so OSS cluster mode works too.
    clustering_policy = "EnterpriseCluster"
    # Quota counters must never be evicted silently.
    eviction_policy = "NoEviction"
  }
}

# Entra ID authentication: the gateway's identity gets the default data access policy.
resource "azurerm_managed_redis_access_policy_assignment" "gateway" {
  for_each = var.stamps

  managed_redis_id = azurerm_managed_redis.this[each.key].id
  object_id        = azurerm_user_assigned_identity.gateway[each.key].principal_id
}
