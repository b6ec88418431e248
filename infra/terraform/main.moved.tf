# ---------------------------------------------------------------------------------------------
# Addresses that changed when the diagnostic settings and private endpoints became one entry per
# kind (local.diagnostic_targets, local.private_endpoints): a landing zone applied before keeps
# its settings and endpoints, moved in state, instead of destroying and recreating them.
# A per-stamp resource moves whole, so its stamp keys carry over whatever they are; one made once
# becomes the `platform` instance. Keep these until every deployment has applied once since.
# ---------------------------------------------------------------------------------------------

moved {
  from = azurerm_monitor_diagnostic_setting.log_analytics
  to   = module.diagnostic_setting["log_analytics"].azurerm_monitor_diagnostic_setting.this["platform"]
}

moved {
  from = azurerm_monitor_diagnostic_setting.aks
  to   = module.diagnostic_setting["aks"].azurerm_monitor_diagnostic_setting.this
}

moved {
  from = azurerm_monitor_diagnostic_setting.key_vault
  to   = module.diagnostic_setting["key_vault"].azurerm_monitor_diagnostic_setting.this
}

moved {
  from = azurerm_monitor_diagnostic_setting.registry
  to   = module.diagnostic_setting["registry"].azurerm_monitor_diagnostic_setting.this
}

moved {
  from = azurerm_monitor_diagnostic_setting.redis
  to   = module.diagnostic_setting["redis"].azurerm_monitor_diagnostic_setting.this
}

moved {
  from = azurerm_monitor_diagnostic_setting.firewall
  to   = module.diagnostic_setting["firewall"].azurerm_monitor_diagnostic_setting.this
}

moved {
  from = azurerm_monitor_diagnostic_setting.firewall_public_ip
  to   = module.diagnostic_setting["firewall_public_ip"].azurerm_monitor_diagnostic_setting.this
}

moved {
  from = azurerm_monitor_diagnostic_setting.hub_vnet
  to   = module.diagnostic_setting["hub_vnet"].azurerm_monitor_diagnostic_setting.this
}

moved {
  from = azurerm_monitor_diagnostic_setting.spoke_vnet
  to   = module.diagnostic_setting["spoke_vnet"].azurerm_monitor_diagnostic_setting.this
}

moved {
  from = azurerm_monitor_diagnostic_setting.spoke_nsg
  to   = module.diagnostic_setting["spoke_nsg"].azurerm_monitor_diagnostic_setting.this
}

moved {
  from = azurerm_monitor_diagnostic_setting.front_door
  to   = module.diagnostic_setting["front_door"].azurerm_monitor_diagnostic_setting.this["platform"]
}

moved {
  from = azurerm_monitor_diagnostic_setting.bundles
  to   = module.diagnostic_setting["bundles"].azurerm_monitor_diagnostic_setting.this["platform"]
}

moved {
  from = azurerm_monitor_diagnostic_setting.cmk[0]
  to   = module.diagnostic_setting["cmk"].azurerm_monitor_diagnostic_setting.this["platform"]
}

moved {
  from = azurerm_private_endpoint.key_vault
  to   = module.private_endpoint["key_vault"].azurerm_private_endpoint.this
}

moved {
  from = azurerm_private_endpoint.redis
  to   = module.private_endpoint["redis"].azurerm_private_endpoint.this
}

moved {
  from = azurerm_private_endpoint.registry
  to   = module.private_endpoint["registry"].azurerm_private_endpoint.this
}

moved {
  from = azurerm_private_endpoint.bundles
  to   = module.private_endpoint["bundles"].azurerm_private_endpoint.this
}

moved {
  from = azurerm_private_endpoint.grafana
  to   = module.private_endpoint["grafana"].azurerm_private_endpoint.this
}
