# ---------------------------------------------------------------------------------------------
# Monitoring: one Log Analytics workspace (logs, Container Insights, Defender) and one Azure
# Monitor workspace (managed Prometheus) for all stamps, so operators see every region at once.
# ---------------------------------------------------------------------------------------------

resource "azurerm_log_analytics_workspace" "this" {
  name                         = "log-${var.name}"
  location                     = azurerm_resource_group.this.location
  resource_group_name          = azurerm_resource_group.this.name
  sku                          = "PerGB2018"
  retention_in_days            = var.log_retention_days
  local_authentication_enabled = false
  tags                         = var.tags
}

resource "azurerm_monitor_workspace" "this" {
  name                          = "amw-${var.name}"
  location                      = azurerm_resource_group.this.location
  resource_group_name           = azurerm_resource_group.this.name
  public_network_access_enabled = false
  tags                          = var.tags
}

# Managed Prometheus: each cluster's metrics flow through a data collection endpoint and rule.
resource "azurerm_monitor_data_collection_endpoint" "prometheus" {
  for_each = var.stamps

  name                = "dce-${var.name}-${each.key}"
  location            = each.value.location
  resource_group_name = azurerm_resource_group.stamp[each.key].name
  kind                = "Linux"
  # The metrics agents reach it through the hub firewall (*.ingest.monitor.azure.com); an Azure
  # Monitor Private Link Scope would make this private too (docs/deploy.md).
  public_network_access_enabled = true
  tags                          = var.tags
}

resource "azurerm_monitor_data_collection_rule" "prometheus" {
  for_each = var.stamps

  name                        = "dcr-${var.name}-${each.key}-prometheus"
  location                    = each.value.location
  resource_group_name         = azurerm_resource_group.stamp[each.key].name
  data_collection_endpoint_id = azurerm_monitor_data_collection_endpoint.prometheus[each.key].id
  kind                        = "Linux"
  tags                        = var.tags

  destinations {
    monitor_account {
      monitor_account_id = azurerm_monitor_workspace.this.id
      name               = "MonitoringAccount"
    }
  }

  data_flow {
    streams      = ["Microsoft-PrometheusMetrics"]
    destinations = ["MonitoringAccount"]
  }

  data_sources {
    prometheus_forwarder {
      name    = "PrometheusDataSource"
      streams = ["Microsoft-PrometheusMetrics"]
    }
  }
}

resource "azurerm_monitor_data_collection_rule_association" "prometheus" {
  for_each = var.stamps

  name                    = "dcra-${var.name}-${each.key}-prometheus"
  target_resource_id      = azurerm_kubernetes_cluster.this[each.key].id
  data_collection_rule_id = azurerm_monitor_data_collection_rule.prometheus[each.key].id
}

# ---------------------------------------------------------------------------------------------
# Diagnostic settings: every resource here that has them sends its logs and metrics to the
# workspace. One block per kind of resource so each reads on its own (and static checks can
# follow the target reference).
# ---------------------------------------------------------------------------------------------

resource "azurerm_monitor_diagnostic_setting" "log_analytics" {
  name                       = "to-log-analytics"
  target_resource_id         = azurerm_log_analytics_workspace.this.id
  log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id

  enabled_log {
    category_group = "allLogs"
  }
  enabled_metric {
    category = "AllMetrics"
  }
}

resource "azurerm_monitor_diagnostic_setting" "aks" {
  for_each = var.stamps

  name                           = "to-log-analytics"
  target_resource_id             = azurerm_kubernetes_cluster.this[each.key].id
  log_analytics_workspace_id     = azurerm_log_analytics_workspace.this.id
  log_analytics_destination_type = "Dedicated"

  enabled_log {
    category_group = "allLogs"
  }
  enabled_metric {
    category = "AllMetrics"
  }
}

resource "azurerm_monitor_diagnostic_setting" "key_vault" {
  for_each = var.stamps

  name                       = "to-log-analytics"
  target_resource_id         = azurerm_key_vault.this[each.key].id
  log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id

  enabled_log {
    category_group = "allLogs"
  }
  enabled_metric {
    category = "AllMetrics"
  }
}

resource "azurerm_monitor_diagnostic_setting" "registry" {
  for_each = var.stamps

  name                       = "to-log-analytics"
  target_resource_id         = azurerm_container_registry.this[each.key].id
  log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id

  enabled_log {
    category_group = "allLogs"
  }
  enabled_metric {
    category = "AllMetrics"
  }
}

resource "azurerm_monitor_diagnostic_setting" "redis" {
  for_each = var.stamps

  name                       = "to-log-analytics"
  target_resource_id         = azurerm_managed_redis.this[each.key].id
  log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id

  enabled_metric {
    category = "AllMetrics"
  }
}

resource "azurerm_monitor_diagnostic_setting" "firewall" {
  for_each = var.stamps

  name                           = "to-log-analytics"
  target_resource_id             = azurerm_firewall.this[each.key].id
  log_analytics_workspace_id     = azurerm_log_analytics_workspace.this.id
  log_analytics_destination_type = "Dedicated"

  enabled_log {
    category_group = "allLogs"
  }
  enabled_metric {
    category = "AllMetrics"
  }
}

resource "azurerm_monitor_diagnostic_setting" "firewall_public_ip" {
  for_each = var.stamps

  name                       = "to-log-analytics"
  target_resource_id         = azurerm_public_ip.firewall[each.key].id
  log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id

  enabled_log {
    category_group = "allLogs"
  }
  enabled_metric {
    category = "AllMetrics"
  }
}

resource "azurerm_monitor_diagnostic_setting" "hub_vnet" {
  for_each = var.stamps

  name                       = "to-log-analytics"
  target_resource_id         = azurerm_virtual_network.hub[each.key].id
  log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id

  enabled_log {
    category_group = "allLogs"
  }
  enabled_metric {
    category = "AllMetrics"
  }
}

resource "azurerm_monitor_diagnostic_setting" "spoke_vnet" {
  for_each = var.stamps

  name                       = "to-log-analytics"
  target_resource_id         = azurerm_virtual_network.spoke[each.key].id
  log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id

  enabled_log {
    category_group = "allLogs"
  }
  enabled_metric {
    category = "AllMetrics"
  }
}

resource "azurerm_monitor_diagnostic_setting" "spoke_nsg" {
  for_each = var.stamps

  name                       = "to-log-analytics"
  target_resource_id         = azurerm_network_security_group.spoke[each.key].id
  log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id

  # Network security groups have logs only, no metrics.
  enabled_log {
    category_group = "allLogs"
  }
}

resource "azurerm_monitor_diagnostic_setting" "front_door" {
  name                       = "to-log-analytics"
  target_resource_id         = azurerm_cdn_frontdoor_profile.this.id
  log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id

  enabled_log {
    category_group = "allLogs"
  }
  enabled_metric {
    category = "AllMetrics"
  }
}
