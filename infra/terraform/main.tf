# ---------------------------------------------------------------------------------------------
# tenantgate landing zone: one platform resource group (monitoring, private DNS, Front Door,
# policy) and one deployment stamp per region (hub with Azure Firewall, spoke, AKS, Key Vault,
# Azure Managed Redis). Files are split by concern: main.<concern>.tf.
# ---------------------------------------------------------------------------------------------

data "azurerm_client_config" "current" {}

data "azurerm_subscription" "current" {}

locals {
  private_cluster = var.private_cluster_enabled

  # /16 per stamp: hub /18 at the bottom, spoke /17 at the top.
  networks = {
    for key, stamp in var.stamps : key => {
      hub              = cidrsubnet(stamp.address_space, 2, 0)
      spoke            = cidrsubnet(stamp.address_space, 1, 1)
      firewall_subnet  = cidrsubnet(cidrsubnet(stamp.address_space, 2, 0), 8, 0)
      aks_subnet       = cidrsubnet(cidrsubnet(stamp.address_space, 1, 1), 3, 0)
      endpoints_subnet = cidrsubnet(cidrsubnet(stamp.address_space, 1, 1), 7, 16)
      ingress_subnet   = cidrsubnet(cidrsubnet(stamp.address_space, 1, 1), 7, 17)
    }
  }

  gateway_subject = "system:serviceaccount:${var.gateway_service_account.namespace}:${var.gateway_service_account.name}"
}

resource "azurerm_resource_group" "this" {
  name     = "rg-${var.name}-platform"
  location = var.location
  tags     = var.tags
}

resource "azurerm_resource_group" "stamp" {
  for_each = var.stamps

  name     = "rg-${var.name}-${each.key}"
  location = each.value.location
  tags     = var.tags
}
