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

# ---------------------------------------------------------------------------------------------
# Deny policies on the data stores' network and local auth: the landing zone's own Storage and
# Redis already comply; these keep anything added to the subscription later to the same rules.
# Built-ins from Azure/azure-policy (built-in-policies/policyDefinitions/...); the Redis ones
# cover Azure Cache for Redis (Microsoft.Cache/Redis). Azure Managed Redis (redisEnterprise)
# has no built-in for either yet, so two custom definitions below cover it.
# ---------------------------------------------------------------------------------------------

locals {
  deny_policy_definitions = {
    # Storage/StoragePublicNetworkAccess_AuditDeny.json
    storage_no_public_access = "/providers/Microsoft.Authorization/policyDefinitions/b2982f36-99f2-4db5-8eff-283140c09693"
    # Storage/StorageAccountAllowSharedKeyAccess_Audit.json (Audit, Deny or Disabled)
    storage_no_shared_key = "/providers/Microsoft.Authorization/policyDefinitions/8c6a50c6-9ffd-4ae7-986f-5fa6111f9a54"
    # Cache/RedisCache_PublicNetworkAccess_AuditDeny.json
    redis_no_public_access = "/providers/Microsoft.Authorization/policyDefinitions/470baccb-7e51-4549-8b1a-3e5be069f663"
    # Cache/RedisCache_DisableAccessKeysAuth_Audit.json (Audit, Deny or Disabled)
    redis_no_access_keys = "/providers/Microsoft.Authorization/policyDefinitions/3827af20-8f80-4b15-8300-6db0873ec901"
  }

  # Azure Managed Redis: the property paths of Microsoft.Cache/redisEnterprise as aliases
  # (check with `az provider show -n Microsoft.Cache --expand resourceTypes/aliases`).
  managed_redis_deny_rules = {
    managed_redis_no_public_access = {
      display_name = "Azure Managed Redis should disable public network access"
      rule = {
        "if" = {
          allOf = [
            { field = "type", equals = "Microsoft.Cache/redisEnterprise" },
            { field = "Microsoft.Cache/redisEnterprise/publicNetworkAccess", notEquals = "Disabled" },
          ]
        }
        "then" = { effect = "Deny" }
      }
    }
    managed_redis_no_access_keys = {
      display_name = "Azure Managed Redis databases should not use access keys"
      rule = {
        "if" = {
          allOf = [
            { field = "type", equals = "Microsoft.Cache/redisEnterprise/databases" },
            { field = "Microsoft.Cache/redisEnterprise/databases/accessKeysAuthentication", notEquals = "Disabled" },
          ]
        }
        "then" = { effect = "Deny" }
      }
    }
  }
}

resource "azurerm_subscription_policy_assignment" "deny" {
  for_each = local.deny_policy_definitions

  name                 = "${var.name}-${replace(each.key, "_", "-")}"
  display_name         = "tenantgate: deny ${replace(each.key, "_", " ")}"
  subscription_id      = data.azurerm_subscription.current.id
  policy_definition_id = each.value
  parameters = jsonencode({
    effect = { value = "Deny" }
  })
}

resource "azurerm_policy_definition" "managed_redis" {
  for_each = local.managed_redis_deny_rules

  name         = "${var.name}-${replace(each.key, "_", "-")}"
  display_name = "tenantgate: ${each.value.display_name}"
  policy_type  = "Custom"
  # All, not Indexed: databases carry no tags or location, which Indexed mode requires.
  mode        = "All"
  policy_rule = jsonencode(each.value.rule)
  metadata    = jsonencode({ category = "Cache" })
}

resource "azurerm_subscription_policy_assignment" "managed_redis" {
  for_each = local.managed_redis_deny_rules

  name                 = "${var.name}-${replace(each.key, "_", "-")}"
  display_name         = "tenantgate: ${each.value.display_name}"
  subscription_id      = data.azurerm_subscription.current.id
  policy_definition_id = azurerm_policy_definition.managed_redis[each.key].id
}

# ---------------------------------------------------------------------------------------------
# Defender for Containers: the plan on the subscription (this module assigns policy at
# subscription scope, so it owns the subscription's plan too). The AKS microsoft_defender block
# only deploys the sensor; without the plan nothing scans or alerts.
# ---------------------------------------------------------------------------------------------

resource "azurerm_security_center_subscription_pricing" "containers" {
  tier          = "Standard"
  resource_type = "Containers"
}

# ---------------------------------------------------------------------------------------------
# Kubernetes policies on each cluster, enforced at admission by the Azure Policy add-on
# (Gatekeeper). Built-ins from Azure/azure-policy, built-in-policies/.../Kubernetes/.
# AKS-managed namespaces are excluded where their images or pods are Microsoft's.
# ---------------------------------------------------------------------------------------------

locals {
  kubernetes_policy_definitions = {
    # Kubernetes_PSPBaselineStandard.json: no privileged containers (95edb821-ddaf-4404-9732-
    # 666045e056b4), no host network, PID or IPC, default capabilities only, no hostPath volumes.
    # Baseline rather than restricted cluster-wide: the restricted initiative's volume-type
    # list has no `csi`, which the chart's Key Vault mounts need. The tenantgate namespace gets
    # restricted from Pod Security admission on top (docs/deploy.md, step 2).
    pod_security_baseline = "/providers/Microsoft.Authorization/policySetDefinitions/a8640138-9b0a-4a28-b8cb-1666c838647d"
    # ContainerAllowedImages.json: images only from the stamp's registry.
    allowed_images = "/providers/Microsoft.Authorization/policyDefinitions/febd0533-8e55-448f-b837-bd0e06f16469"
    # LoadbalancerNoPublicIPs.json: Services of type LoadBalancer only internal; Front Door
    # reaches the ingress over Private Link, so a public load balancer is always a mistake.
    internal_load_balancers = "/providers/Microsoft.Authorization/policyDefinitions/3fc4dc25-5baf-40d8-9b05-7fe74c1bc64e"
  }

  # The Gatekeeper defaults, plus the application routing add-on's namespace for the image
  # rule only (its NGINX images come from mcr.microsoft.com); its load balancer stays covered.
  kubernetes_system_namespaces = ["kube-system", "gatekeeper-system", "azure-arc"]

  # Each stamp's own registry (acr<name><stamp>, main.registry.tf) unless one is given.
  allowed_registries = { for key, _ in var.stamps : key => coalesce(var.allowed_registry, "^acr${var.name}${key}\\.azurecr\\.io/.+$") }
}

# Privilege escalation to the node is the one way out of a pod's sandbox; baseline closes it.
resource "azurerm_resource_policy_assignment" "pod_security_baseline" {
  for_each = var.stamps

  name                 = "${var.name}-${each.key}-pod-security-baseline"
  display_name         = "tenantgate: pod security baseline (${each.key})"
  resource_id          = azurerm_kubernetes_cluster.this[each.key].id
  policy_definition_id = local.kubernetes_policy_definitions.pod_security_baseline
  parameters = jsonencode({
    effect             = { value = var.kubernetes_policy_effect }
    excludedNamespaces = { value = local.kubernetes_system_namespaces }
  })
}

# An image from anywhere else bypasses the registry's import review and vulnerability scans
# (and the firewall would block its pull anyway: this makes the failure explicit at admission).
resource "azurerm_resource_policy_assignment" "allowed_images" {
  for_each = var.stamps

  name                 = "${var.name}-${each.key}-allowed-images"
  display_name         = "tenantgate: images only from the stamp's registry (${each.key})"
  resource_id          = azurerm_kubernetes_cluster.this[each.key].id
  policy_definition_id = local.kubernetes_policy_definitions.allowed_images
  parameters = jsonencode({
    effect                      = { value = var.kubernetes_policy_effect }
    allowedContainerImagesRegex = { value = local.allowed_registries[each.key] }
    excludedNamespaces          = { value = concat(local.kubernetes_system_namespaces, ["app-routing-system"]) }
  })
}

# A public load balancer would be a second, WAF-less way in beside Front Door.
resource "azurerm_resource_policy_assignment" "internal_load_balancers" {
  for_each = var.stamps

  name                 = "${var.name}-${each.key}-internal-load-balancers"
  display_name         = "tenantgate: internal load balancers only (${each.key})"
  resource_id          = azurerm_kubernetes_cluster.this[each.key].id
  policy_definition_id = local.kubernetes_policy_definitions.internal_load_balancers
  parameters = jsonencode({
    effect             = { value = var.kubernetes_policy_effect }
    excludedNamespaces = { value = local.kubernetes_system_namespaces }
  })
}
