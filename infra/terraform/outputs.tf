output "resource_group_names" {
  description = "The platform resource group and each stamp's resource group."
  value = {
    platform = azurerm_resource_group.this.name
    stamps   = { for key, group in azurerm_resource_group.stamp : key => group.name }
  }
}

output "front_door_endpoint_host_name" {
  description = "The public host name (Front Door endpoint) that apps call."
  value       = azurerm_cdn_frontdoor_endpoint.this.host_name
}

output "bundle_container_url" {
  description = "Where `tenantgate policy bundle` output is uploaded; the OPA sidecars download from here."
  value       = "${azurerm_storage_account.bundles.primary_blob_endpoint}${azurerm_storage_container.bundles.name}"
}

output "grafana_endpoint" {
  description = "Azure Managed Grafana's URL (reached over its private endpoint in each spoke)."
  value       = azurerm_dashboard_grafana.this.endpoint
}

output "stamps" {
  description = "Per stamp, what the Helm chart needs: cluster name, OIDC issuer, the gateway identity's client ID, Key Vault name, Redis host name, registry login server."
  value = {
    for key, _ in var.stamps : key => {
      aks_cluster_name         = azurerm_kubernetes_cluster.this[key].name
      oidc_issuer_url          = azurerm_kubernetes_cluster.this[key].oidc_issuer_url
      gateway_client_id        = azurerm_user_assigned_identity.gateway[key].client_id
      gateway_principal_id     = azurerm_user_assigned_identity.gateway[key].principal_id
      key_vault_name           = azurerm_key_vault.this[key].name
      redis_host_name          = azurerm_managed_redis.this[key].hostname
      registry_login_server    = azurerm_container_registry.this[key].login_server
      ingress_subnet_name      = azurerm_subnet.ingress[key].name
      node_resource_group_name = azurerm_kubernetes_cluster.this[key].node_resource_group
    }
  }
}

output "tenant_id" {
  description = "The Entra ID tenant of the deployment (for the gateway's workload identity and OPA's token requests)."
  value       = data.azurerm_client_config.current.tenant_id
}
