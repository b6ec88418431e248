variable "target_resource_ids" {
  type        = map(string)
  description = "The resources that get a diagnostic setting, by instance key (the stamp key, or `platform` for a resource made once)."
  nullable    = false
}

variable "log_analytics_workspace_id" {
  type        = string
  description = "The Log Analytics workspace every setting sends to."
  nullable    = false
}

variable "log_category_groups" {
  type        = list(string)
  description = "Log category groups to send (`allLogs`); empty for a resource that has no logs."
  nullable    = false
}

variable "metric_categories" {
  type        = list(string)
  description = "Metric categories to send (`AllMetrics`, or the resource's own); empty for a resource that has no metrics."
  nullable    = false
}

variable "dedicated_tables" {
  type        = bool
  description = "Send logs to resource-specific tables (destination type `Dedicated`) instead of AzureDiagnostics."
  default     = false
  nullable    = false
}
