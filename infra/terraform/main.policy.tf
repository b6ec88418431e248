# ---------------------------------------------------------------------------------------------
# Azure Policy: guardrails on the subscription tenantgate lives in (give it its own, as a
# landing zone does): allowed locations, no public network access, diagnostic settings
# required, and the tags chargeback needs. Built-in definitions, referenced by their stable IDs.
# ---------------------------------------------------------------------------------------------

locals {
  required_tags = ["tenantId", "costCenter", "environment", "owner"]

  allowed_locations = distinct(concat([var.location], [for stamp in var.stamps : stamp.location]))

  diagnostic_resource_types = [
    "Microsoft.ContainerService/managedClusters",
    "Microsoft.KeyVault/vaults",
    "Microsoft.Cache/redisEnterprise",
    "Microsoft.ContainerRegistry/registries",
    "Microsoft.Network/azureFirewalls",
    "Microsoft.Network/publicIPAddresses",
    "Microsoft.Network/virtualNetworks",
    "Microsoft.Network/networkSecurityGroups",
    "Microsoft.Cdn/profiles",
    "Microsoft.OperationalInsights/workspaces",
  ]

  policy_definitions = {
    allowed_locations            = "/providers/Microsoft.Authorization/policyDefinitions/e56962a6-4747-49cd-b67b-bf8b01975c4c"
    require_tag                  = "/providers/Microsoft.Authorization/policyDefinitions/871b6d14-10aa-478d-b590-94f262ecfa99"
    key_vault_no_public_access   = "/providers/Microsoft.Authorization/policyDefinitions/405c5871-3e91-4644-8a63-58e19d68ff5b"
    aks_private_cluster          = "/providers/Microsoft.Authorization/policyDefinitions/040732e8-d947-40b8-95d6-854c95024bf8"
    diagnostic_settings_required = "/providers/Microsoft.Authorization/policyDefinitions/7f89b1eb-583c-429a-8828-af049802c1d9"
  }
}

resource "azurerm_subscription_policy_assignment" "allowed_locations" {
  name                 = "${var.name}-allowed-locations"
  display_name         = "tenantgate: allowed locations"
  subscription_id      = data.azurerm_subscription.current.id
  policy_definition_id = local.policy_definitions.allowed_locations
  parameters = jsonencode({
    listOfAllowedLocations = { value = local.allowed_locations }
  })
}

resource "azurerm_subscription_policy_assignment" "require_tag" {
  for_each = toset(local.required_tags)

  name                 = "${var.name}-require-tag-${lower(each.value)}"
  display_name         = "tenantgate: require tag ${each.value}"
  subscription_id      = data.azurerm_subscription.current.id
  policy_definition_id = local.policy_definitions.require_tag
  parameters = jsonencode({
    tagName = { value = each.value }
  })
}

resource "azurerm_subscription_policy_assignment" "key_vault_no_public_access" {
  name                 = "${var.name}-kv-no-public-access"
  display_name         = "tenantgate: Key Vault without public network access"
  subscription_id      = data.azurerm_subscription.current.id
  policy_definition_id = local.policy_definitions.key_vault_no_public_access
  parameters = jsonencode({
    effect = { value = "Deny" }
  })
}

# Only with a private API server: the authorized-ranges option is a public endpoint by design.
resource "azurerm_subscription_policy_assignment" "aks_private_cluster" {
  count = local.private_cluster ? 1 : 0

  name                 = "${var.name}-aks-private-cluster"
  display_name         = "tenantgate: AKS API server is private"
  subscription_id      = data.azurerm_subscription.current.id
  policy_definition_id = local.policy_definitions.aks_private_cluster
  parameters = jsonencode({
    effect = { value = "Deny" }
  })
}

resource "azurerm_subscription_policy_assignment" "diagnostic_settings_required" {
  name                 = "${var.name}-diagnostics-required"
  display_name         = "tenantgate: diagnostic settings required"
  subscription_id      = data.azurerm_subscription.current.id
  policy_definition_id = local.policy_definitions.diagnostic_settings_required
  parameters = jsonencode({
    listOfResourceTypes = { value = local.diagnostic_resource_types }
  })
}
