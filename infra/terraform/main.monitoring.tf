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
# workspace. One entry per kind of resource: its instances (by stamp key, or `platform` for one
# made once) and, where it differs from diagnostic_defaults, what it sends. The Bicep sets the
# same on each resource (tests/infra/test_parity.py compares them).
# ---------------------------------------------------------------------------------------------

locals {
  # Every log category group and every metric, to the shared AzureDiagnostics table.
  diagnostic_defaults = {
    log_groups = ["allLogs"]
    metrics    = ["AllMetrics"]
    dedicated  = false
  }

  diagnostic_targets = {
    log_analytics = {
      ids = { platform = azurerm_log_analytics_workspace.this.id }
    }
    aks = {
      ids       = { for key, cluster in azurerm_kubernetes_cluster.this : key => cluster.id }
      dedicated = true
    }
    key_vault = {
      ids = { for key, vault in azurerm_key_vault.this : key => vault.id }
    }
    registry = {
      ids = { for key, registry in azurerm_container_registry.this : key => registry.id }
    }
    # Azure Managed Redis has metrics only, no log categories.
    redis = {
      ids        = { for key, cache in azurerm_managed_redis.this : key => cache.id }
      log_groups = []
    }
    firewall = {
      ids       = { for key, firewall in azurerm_firewall.this : key => firewall.id }
      dedicated = true
    }
    firewall_public_ip = {
      ids = { for key, address in azurerm_public_ip.firewall : key => address.id }
    }
    hub_vnet = {
      ids = { for key, network in azurerm_virtual_network.hub : key => network.id }
    }
    spoke_vnet = {
      ids = { for key, network in azurerm_virtual_network.spoke : key => network.id }
    }
    # Network security groups have logs only, no metrics.
    spoke_nsg = {
      ids     = { for key, group in azurerm_network_security_group.spoke : key => group.id }
      metrics = []
    }
    front_door = {
      ids = { platform = azurerm_cdn_frontdoor_profile.this.id }
    }
    # The bundle account's blob service (main.bundles.tf): its read logs and its transactions.
    bundles = {
      ids     = { platform = "${azurerm_storage_account.bundles.id}/blobServices/default" }
      metrics = ["Transaction"]
    }
    # The opt-in customer-managed key's vault (main.cmk.tf), when there is one.
    cmk = {
      ids = { for vault in azurerm_key_vault.cmk : "platform" => vault.id }
    }
  }
}

module "diagnostic_setting" {
  source   = "./modules/diagnostic-setting"
  for_each = local.diagnostic_targets

  target_resource_ids        = each.value.ids
  log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id
  log_category_groups        = lookup(each.value, "log_groups", local.diagnostic_defaults.log_groups)
  metric_categories          = lookup(each.value, "metrics", local.diagnostic_defaults.metrics)
  dedicated_tables           = lookup(each.value, "dedicated", local.diagnostic_defaults.dedicated)
}
