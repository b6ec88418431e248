# ---------------------------------------------------------------------------------------------
# Private endpoints: each spoke reaches the stamp's Key Vault, Redis and registry, and the shared
# bundle storage and Grafana, over an endpoint of its own in its endpoint subnet, registered in
# a private DNS zone. One entry per service: the endpoint name's suffix, the private link group,
# and by stamp key what it connects to and the zone it is registered in. The Azure Monitor
# Private Link Scope's endpoint (five zones, main.observability.tf) and the opt-in
# customer-managed key's (one stamp, main.cmk.tf) stay beside their resources.
# ---------------------------------------------------------------------------------------------

locals {
  private_endpoints = {
    key_vault = {
      suffix      = "kv"
      connection  = "key-vault"
      subresource = "vault"
      ids         = { for key, vault in azurerm_key_vault.this : key => vault.id }
      zones       = { for key in keys(var.stamps) : key => azurerm_private_dns_zone.this["key_vault"].id }
    }
    redis = {
      suffix      = "redis"
      connection  = "redis"
      subresource = "redisEnterprise"
      ids         = { for key, cache in azurerm_managed_redis.this : key => cache.id }
      zones       = { for key in keys(var.stamps) : key => azurerm_private_dns_zone.this["redis"].id }
    }
    # The zone group writes both the login server and the regional data endpoint records.
    registry = {
      suffix      = "acr"
      connection  = "registry"
      subresource = "registry"
      ids         = { for key, registry in azurerm_container_registry.this : key => registry.id }
      zones       = { for key in keys(var.stamps) : key => azurerm_private_dns_zone.this["registry"].id }
    }
    # The stamp's own blob zone: each spoke resolves the account to its own endpoint.
    bundles = {
      suffix      = "bundles"
      connection  = "bundles"
      subresource = "blob"
      ids         = { for key in keys(var.stamps) : key => azurerm_storage_account.bundles.id }
      zones       = { for key in keys(var.stamps) : key => azurerm_private_dns_zone.stamp["${key}-blob"].id }
    }
    grafana = {
      suffix      = "grafana"
      connection  = "grafana"
      subresource = "grafana"
      ids         = { for key in keys(var.stamps) : key => azurerm_dashboard_grafana.this.id }
      zones       = { for key in keys(var.stamps) : key => azurerm_private_dns_zone.stamp["${key}-grafana"].id }
    }
  }
}

module "private_endpoint" {
  source   = "./modules/private-endpoint"
  for_each = local.private_endpoints

  connection_name  = each.value.connection
  subresource_name = each.value.subresource
  tags             = var.tags
  endpoints = {
    for key, stamp in var.stamps : key => {
      name                = "pe-${var.name}-${key}-${each.value.suffix}"
      location            = stamp.location
      resource_group_name = azurerm_resource_group.stamp[key].name
      subnet_id           = azurerm_subnet.endpoints[key].id
      resource_id         = each.value.ids[key]
      private_dns_zone_id = each.value.zones[key]
    }
  }
}
