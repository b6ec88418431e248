# ---------------------------------------------------------------------------------------------
# Container registry (one per stamp, like Key Vault and Redis): Premium, Entra ID only (no admin
# user, no anonymous pull), no public access, reached over a private endpoint in the spoke. Every
# image the workloads run (gateway, OPA, the NVIDIA device plugin) is imported into it
# (docs/deploy.md), so nodes pull only from here. That is why the hub firewall has no rule for
# any outside registry: what remains is MCR for AKS's own images, which the AzureKubernetesService
# FQDN tag already allows. Imports run inside Azure (`az acr import`), not from the cluster.
# ---------------------------------------------------------------------------------------------

resource "azurerm_container_registry" "this" {
  #checkov:skip=CKV_AZURE_165:one registry per stamp on purpose: each region pulls from its own, and two private endpoints of one geo-replicated registry would overwrite each other's records in the shared privatelink.azurecr.io zone
  #checkov:skip=CKV_AZURE_164:Docker Content Trust is deprecated by the service (removed March 2028, and from azurerm 5.0); images are imported by pinned version and the chart pins digests
  #checkov:skip=CKV_AZURE_166:quarantine keeps every pushed or imported image unpullable until a scanner marks it verified, and nothing here marks images, so nodes could never pull
  for_each = var.stamps

  name                          = "acr${var.name}${each.key}"
  location                      = each.value.location
  resource_group_name           = azurerm_resource_group.stamp[each.key].name
  sku                           = "Premium"
  admin_enabled                 = false
  anonymous_pull_enabled        = false
  public_network_access_enabled = false
  # Trusted Azure services (Defender's image scanning) still reach it; nothing else does.
  network_rule_bypass_option = "AzureServices"
  # Every stamp region has availability zones already (system pool and firewall span 1-3).
  zone_redundancy_enabled = true
  data_endpoint_enabled   = true
  export_policy_enabled   = false
  # Untagged manifests (superseded imports) are purged after a week.
  retention_policy_in_days = 7
  tags                     = var.tags
}

# The kubelet identity pulls images for every node of the cluster.
resource "azurerm_role_assignment" "kubelet_acr_pull" {
  for_each = var.stamps

  scope                = azurerm_container_registry.this[each.key].id
  role_definition_name = "AcrPull"
  principal_id         = azurerm_kubernetes_cluster.this[each.key].kubelet_identity[0].object_id
}
