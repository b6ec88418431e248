# ---------------------------------------------------------------------------------------------
# One kind of resource's diagnostic settings: every instance (stamp key, or `platform`) sends
# the same log category groups and metrics to the Log Analytics workspace. The root module calls
# this once per kind (local.diagnostic_targets, main.monitoring.tf), so each instance keeps the
# key it had as its own resource, and main.moved.tf can move it there.
# ---------------------------------------------------------------------------------------------

resource "azurerm_monitor_diagnostic_setting" "this" {
  for_each = var.target_resource_ids

  name                           = "to-log-analytics"
  target_resource_id             = each.value
  log_analytics_workspace_id     = var.log_analytics_workspace_id
  log_analytics_destination_type = var.dedicated_tables ? "Dedicated" : null

  dynamic "enabled_log" {
    for_each = toset(var.log_category_groups)
    content {
      category_group = enabled_log.value
    }
  }
  dynamic "enabled_metric" {
    for_each = toset(var.metric_categories)
    content {
      category = enabled_metric.value
    }
  }
}
