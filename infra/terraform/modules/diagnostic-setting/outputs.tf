output "ids" {
  description = "The diagnostic settings' IDs, by instance key."
  value       = { for key, setting in azurerm_monitor_diagnostic_setting.this : key => setting.id }
}
