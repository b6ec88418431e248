# ---------------------------------------------------------------------------------------------
# One service's private endpoints: one per stamp, in the stamp's endpoint subnet, each with a
# DNS zone group that registers it in its private DNS zone. The root module calls this once per
# service (local.private_endpoints, main.endpoints.tf), so each endpoint keeps the stamp key it
# had as its own resource, and main.moved.tf can move it there.
# ---------------------------------------------------------------------------------------------

resource "azurerm_private_endpoint" "this" {
  for_each = var.endpoints

  name                = each.value.name
  location            = each.value.location
  resource_group_name = each.value.resource_group_name
  subnet_id           = each.value.subnet_id
  tags                = var.tags

  private_service_connection {
    name                           = var.connection_name
    private_connection_resource_id = each.value.resource_id
    subresource_names              = [var.subresource_name]
    is_manual_connection           = false
  }

  private_dns_zone_group {
    name                 = "default"
    private_dns_zone_ids = [each.value.private_dns_zone_id]
  }
}
