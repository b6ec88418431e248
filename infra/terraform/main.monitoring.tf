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

# Data collection, per cluster: managed Prometheus and Container Insights each have a data
# collection rule, and both ingest through a data collection endpoint. Rules and ingestion
# endpoints live in the workspaces' region (var.location), whichever region the cluster is in:
# managed Prometheus needs its DCE and DCR in the Azure Monitor workspace's region, and a rule
# that sends to Log Analytics sits in the workspace's region. The agents fetch their rules
# through a configuration endpoint in the cluster's own region (the only one an agent may use
# for that). All endpoints are private, reached through the Azure Monitor Private Link Scope.
resource "azurerm_monitor_data_collection_endpoint" "ingestion" {
  for_each = var.stamps

  name                          = "dce-${var.name}-${each.key}-ingest"
  location                      = azurerm_resource_group.this.location
  resource_group_name           = azurerm_resource_group.stamp[each.key].name
  kind                          = "Linux"
  public_network_access_enabled = false
  tags                          = var.tags
}

resource "azurerm_monitor_data_collection_endpoint" "config" {
  for_each = var.stamps

  name                          = "dce-${var.name}-${each.key}-config"
  location                      = each.value.location
  resource_group_name           = azurerm_resource_group.stamp[each.key].name
  kind                          = "Linux"
  public_network_access_enabled = false
  tags                          = var.tags
}

resource "azurerm_monitor_data_collection_rule" "prometheus" {
  for_each = var.stamps

  name                        = "dcr-${var.name}-${each.key}-prometheus"
  location                    = azurerm_resource_group.this.location
  resource_group_name         = azurerm_resource_group.stamp[each.key].name
  data_collection_endpoint_id = azurerm_monitor_data_collection_endpoint.ingestion[each.key].id
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

# Container Insights: the add-on (oms_agent) collects what this rule says, into Log Analytics.
resource "azurerm_monitor_data_collection_rule" "container_insights" {
  for_each = var.stamps

  name                        = "dcr-${var.name}-${each.key}-container-insights"
  location                    = azurerm_resource_group.this.location
  resource_group_name         = azurerm_resource_group.stamp[each.key].name
  data_collection_endpoint_id = azurerm_monitor_data_collection_endpoint.ingestion[each.key].id
  kind                        = "Linux"
  tags                        = var.tags

  destinations {
    log_analytics {
      workspace_resource_id = azurerm_log_analytics_workspace.this.id
      name                  = "ciworkspace"
    }
  }

  data_flow {
    streams      = ["Microsoft-ContainerInsights-Group-Default"]
    destinations = ["ciworkspace"]
  }

  data_sources {
    extension {
      name           = "ContainerInsightsExtension"
      extension_name = "ContainerInsights"
      streams        = ["Microsoft-ContainerInsights-Group-Default"]
      extension_json = jsonencode({
        dataCollectionSettings = {
          interval               = "1m"
          namespaceFilteringMode = "Off"
          enableContainerLogV2   = true
        }
      })
    }
  }
}

resource "azurerm_monitor_data_collection_rule_association" "prometheus" {
  for_each = var.stamps

  name                    = "dcra-${var.name}-${each.key}-prometheus"
  target_resource_id      = azurerm_kubernetes_cluster.this[each.key].id
  data_collection_rule_id = azurerm_monitor_data_collection_rule.prometheus[each.key].id
}

resource "azurerm_monitor_data_collection_rule_association" "container_insights" {
  for_each = var.stamps

  name                    = "ContainerInsightsExtension"
  target_resource_id      = azurerm_kubernetes_cluster.this[each.key].id
  data_collection_rule_id = azurerm_monitor_data_collection_rule.container_insights[each.key].id
}

# The one endpoint association a cluster has: where its agents fetch their rules.
resource "azurerm_monitor_data_collection_rule_association" "config" {
  for_each = var.stamps

  name                        = "configurationAccessEndpoint"
  target_resource_id          = azurerm_kubernetes_cluster.this[each.key].id
  data_collection_endpoint_id = azurerm_monitor_data_collection_endpoint.config[each.key].id
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
