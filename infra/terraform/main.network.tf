# ---------------------------------------------------------------------------------------------
# Network: per stamp a hub (Azure Firewall) and a spoke (AKS, private endpoints, ingress),
# peered; the AKS subnet routes 0.0.0.0/0 to the firewall, so all egress is inspected.
# Private DNS zones are global and linked to every hub and spoke, except those of resources
# with an endpoint in every spoke (below), which each stamp keeps for itself.
# ---------------------------------------------------------------------------------------------

locals {
  private_dns_zones = merge(
    {
      key_vault = "privatelink.vaultcore.azure.net"
      redis     = "privatelink.redis.azure.net"
      registry  = "privatelink.azurecr.io"
    },
    { for key, stamp in var.stamps : "aks_${key}" => "privatelink.${stamp.location}.azmk8s.io" },
  )

  vnet_ids = merge(
    { for key, _ in var.stamps : "hub_${key}" => azurerm_virtual_network.hub[key].id },
    { for key, _ in var.stamps : "spoke_${key}" => azurerm_virtual_network.spoke[key].id },
  )

  # One resource reached through an endpoint in each spoke (the bundle storage, the Azure Monitor
  # Private Link Scope, Grafana) has one name and one address per spoke: a zone shared by the
  # stamps would hold only the last endpoint's address, out of the other region's reach. So each
  # stamp has these zones of its own, linked to its own hub and spoke.
  stamp_private_dns_zones = {
    blob     = "privatelink.blob.core.windows.net"
    monitor  = "privatelink.monitor.azure.com"
    oms      = "privatelink.oms.opinsights.azure.com"
    ods      = "privatelink.ods.opinsights.azure.com"
    agentsvc = "privatelink.agentsvc.azure-automation.net"
    grafana  = "privatelink.grafana.azure.com"
  }

  stamp_dns_zones = merge([
    for stamp, _ in var.stamps : {
      for zone, zone_name in local.stamp_private_dns_zones : "${stamp}-${zone}" => { stamp = stamp, zone = zone, name = zone_name }
    }
  ]...)

  stamp_dns_zone_links = merge([
    for key, zone in local.stamp_dns_zones : {
      for network in ["hub", "spoke"] : "${key}-${network}" => { zone = key, vnet_id = local.vnet_ids["${network}_${zone.stamp}"] }
    }
  ]...)

  private_dns_zone_links = merge([
    for zone_key, _ in local.private_dns_zones : {
      for vnet_key, vnet_id in local.vnet_ids : "${zone_key}-${vnet_key}" => { zone = zone_key, vnet_id = vnet_id }
    }
  ]...)
}

# -- hub ---------------------------------------------------------------------------------------

resource "azurerm_virtual_network" "hub" {
  for_each = var.stamps

  name                = "vnet-${var.name}-${each.key}-hub"
  location            = each.value.location
  resource_group_name = azurerm_resource_group.stamp[each.key].name
  address_space       = [local.networks[each.key].hub]
  tags                = var.tags
}

resource "azurerm_subnet" "firewall" {
  for_each = var.stamps

  name                            = "AzureFirewallSubnet"
  resource_group_name             = azurerm_resource_group.stamp[each.key].name
  virtual_network_name            = azurerm_virtual_network.hub[each.key].name
  address_prefixes                = [local.networks[each.key].firewall_subnet]
  default_outbound_access_enabled = false
}

resource "azurerm_public_ip" "firewall" {
  for_each = var.stamps

  name                = "pip-${var.name}-${each.key}-fw"
  location            = each.value.location
  resource_group_name = azurerm_resource_group.stamp[each.key].name
  allocation_method   = "Static"
  sku                 = "Standard"
  zones               = ["1", "2", "3"]
  tags                = var.tags
}

resource "azurerm_firewall_policy" "this" {
  for_each = var.stamps

  name                     = "afwp-${var.name}-${each.key}"
  location                 = each.value.location
  resource_group_name      = azurerm_resource_group.stamp[each.key].name
  sku                      = "Premium"
  threat_intelligence_mode = "Deny"
  tags                     = var.tags

  intrusion_detection {
    mode = "Deny"
  }

  dns {
    proxy_enabled = true
  }
}

# Egress the cluster needs, and nothing else: AKS's own dependencies (FQDN tag), Entra ID for
# token validation (JWKS) and workload identity, and time sync. No rule for any image registry:
# workload images come from the stamp's own registry over its private endpoint
# (main.registry.tf), and MCR, for AKS's own images, is part of the FQDN tag.
resource "azurerm_firewall_policy_rule_collection_group" "aks_egress" {
  for_each = var.stamps

  name               = "aks-egress"
  firewall_policy_id = azurerm_firewall_policy.this[each.key].id
  priority           = 200

  application_rule_collection {
    name     = "aks-dependencies"
    priority = 200
    action   = "Allow"

    rule {
      name                  = "aks-fqdn-tag"
      source_addresses      = [local.networks[each.key].aks_subnet]
      destination_fqdn_tags = ["AzureKubernetesService"]

      protocols {
        type = "Https"
        port = 443
      }
    }

    rule {
      name              = "entra-id"
      source_addresses  = [local.networks[each.key].aks_subnet]
      destination_fqdns = ["login.microsoftonline.com", "graph.microsoft.com"]

      protocols {
        type = "Https"
        port = 443
      }
    }

    rule {
      name              = "azure-monitor"
      source_addresses  = [local.networks[each.key].aks_subnet]
      destination_fqdns = ["*.ods.opinsights.azure.com", "*.oms.opinsights.azure.com", "*.monitoring.azure.com", "*.ingest.monitor.azure.com", "*.handler.control.monitor.azure.com"]

      protocols {
        type = "Https"
        port = 443
      }
    }
  }

  network_rule_collection {
    name     = "time"
    priority = 300
    action   = "Allow"

    rule {
      name              = "ntp"
      protocols         = ["UDP"]
      source_addresses  = [local.networks[each.key].aks_subnet]
      destination_fqdns = ["ntp.ubuntu.com"]
      destination_ports = ["123"]
    }
  }
}

resource "azurerm_firewall" "this" {
  #checkov:skip=CKV_AZURE_216:threat intelligence is Deny on the attached firewall policy (azurerm_firewall_policy.this); the firewall-level setting is for classic rules only
  for_each = var.stamps

  name                = "afw-${var.name}-${each.key}"
  location            = each.value.location
  resource_group_name = azurerm_resource_group.stamp[each.key].name
  sku_name            = "AZFW_VNet"
  sku_tier            = "Premium"
  firewall_policy_id  = azurerm_firewall_policy.this[each.key].id
  zones               = ["1", "2", "3"]
  tags                = var.tags

  ip_configuration {
    name                 = "ipconfig"
    subnet_id            = azurerm_subnet.firewall[each.key].id
    public_ip_address_id = azurerm_public_ip.firewall[each.key].id
  }
}

# -- spoke -------------------------------------------------------------------------------------

resource "azurerm_virtual_network" "spoke" {
  #checkov:skip=CKV_AZURE_182:the single DNS server is the hub firewall DNS proxy, itself zone-redundant; a second resolver would bypass the FQDN rules
  #checkov:skip=CKV_AZURE_183:DNS goes to the hub firewall DNS proxy (peered hub address) on purpose, so FQDN network rules and clients resolve alike
  for_each = var.stamps

  name                = "vnet-${var.name}-${each.key}-spoke"
  location            = each.value.location
  resource_group_name = azurerm_resource_group.stamp[each.key].name
  address_space       = [local.networks[each.key].spoke]
  # The firewall's DNS proxy resolves for the spoke, so FQDN network rules see the same answers.
  dns_servers = [azurerm_firewall.this[each.key].ip_configuration[0].private_ip_address]
  tags        = var.tags
}

resource "azurerm_network_security_group" "spoke" {
  for_each = var.stamps

  name                = "nsg-${var.name}-${each.key}-spoke"
  location            = each.value.location
  resource_group_name = azurerm_resource_group.stamp[each.key].name
  tags                = var.tags

  # Front Door reaches the ingress only over Private Link; nothing from the internet lands here.
  security_rule {
    name                       = "deny-internet-inbound"
    priority                   = 4000
    direction                  = "Inbound"
    access                     = "Deny"
    protocol                   = "*"
    source_port_range          = "*"
    destination_port_range     = "*"
    source_address_prefix      = "Internet"
    destination_address_prefix = "*"
  }
}

resource "azurerm_subnet" "aks" {
  for_each = var.stamps

  name                            = "snet-aks"
  resource_group_name             = azurerm_resource_group.stamp[each.key].name
  virtual_network_name            = azurerm_virtual_network.spoke[each.key].name
  address_prefixes                = [local.networks[each.key].aks_subnet]
  default_outbound_access_enabled = false
}

resource "azurerm_subnet" "endpoints" {
  for_each = var.stamps

  name                              = "snet-private-endpoints"
  resource_group_name               = azurerm_resource_group.stamp[each.key].name
  virtual_network_name              = azurerm_virtual_network.spoke[each.key].name
  address_prefixes                  = [local.networks[each.key].endpoints_subnet]
  default_outbound_access_enabled   = false
  private_endpoint_network_policies = "Enabled"
}

# The in-cluster ingress's internal load balancer and its Private Link Service (Front Door's way in).
resource "azurerm_subnet" "ingress" {
  for_each = var.stamps

  name                                          = "snet-ingress"
  resource_group_name                           = azurerm_resource_group.stamp[each.key].name
  virtual_network_name                          = azurerm_virtual_network.spoke[each.key].name
  address_prefixes                              = [local.networks[each.key].ingress_subnet]
  default_outbound_access_enabled               = false
  private_link_service_network_policies_enabled = false
}

resource "azurerm_subnet_network_security_group_association" "aks" {
  for_each = var.stamps

  subnet_id                 = azurerm_subnet.aks[each.key].id
  network_security_group_id = azurerm_network_security_group.spoke[each.key].id
}

resource "azurerm_subnet_network_security_group_association" "endpoints" {
  for_each = var.stamps

  subnet_id                 = azurerm_subnet.endpoints[each.key].id
  network_security_group_id = azurerm_network_security_group.spoke[each.key].id
}

resource "azurerm_subnet_network_security_group_association" "ingress" {
  for_each = var.stamps

  subnet_id                 = azurerm_subnet.ingress[each.key].id
  network_security_group_id = azurerm_network_security_group.spoke[each.key].id
}

resource "azurerm_route_table" "egress" {
  for_each = var.stamps

  name                          = "rt-${var.name}-${each.key}-egress"
  location                      = each.value.location
  resource_group_name           = azurerm_resource_group.stamp[each.key].name
  bgp_route_propagation_enabled = false
  tags                          = var.tags

  route {
    name                   = "default-via-firewall"
    address_prefix         = "0.0.0.0/0"
    next_hop_type          = "VirtualAppliance"
    next_hop_in_ip_address = azurerm_firewall.this[each.key].ip_configuration[0].private_ip_address
  }
}

resource "azurerm_subnet_route_table_association" "aks" {
  for_each = var.stamps

  subnet_id      = azurerm_subnet.aks[each.key].id
  route_table_id = azurerm_route_table.egress[each.key].id
}

resource "azurerm_virtual_network_peering" "hub_to_spoke" {
  for_each = var.stamps

  name                      = "hub-to-spoke"
  resource_group_name       = azurerm_resource_group.stamp[each.key].name
  virtual_network_name      = azurerm_virtual_network.hub[each.key].name
  remote_virtual_network_id = azurerm_virtual_network.spoke[each.key].id
  allow_forwarded_traffic   = true
}

resource "azurerm_virtual_network_peering" "spoke_to_hub" {
  for_each = var.stamps

  name                      = "spoke-to-hub"
  resource_group_name       = azurerm_resource_group.stamp[each.key].name
  virtual_network_name      = azurerm_virtual_network.spoke[each.key].name
  remote_virtual_network_id = azurerm_virtual_network.hub[each.key].id
  allow_forwarded_traffic   = true
}

# -- private DNS -------------------------------------------------------------------------------

resource "azurerm_private_dns_zone" "this" {
  for_each = local.private_dns_zones

  name                = each.value
  resource_group_name = azurerm_resource_group.this.name
  tags                = var.tags
}

resource "azurerm_private_dns_zone_virtual_network_link" "this" {
  for_each = local.private_dns_zone_links

  name                  = each.key
  resource_group_name   = azurerm_resource_group.this.name
  private_dns_zone_name = azurerm_private_dns_zone.this[each.value.zone].name
  virtual_network_id    = each.value.vnet_id
  registration_enabled  = false
  tags                  = var.tags
}

resource "azurerm_private_dns_zone" "stamp" {
  for_each = local.stamp_dns_zones

  name                = each.value.name
  resource_group_name = azurerm_resource_group.stamp[each.value.stamp].name
  tags                = var.tags
}

resource "azurerm_private_dns_zone_virtual_network_link" "stamp" {
  for_each = local.stamp_dns_zone_links

  name                  = each.key
  resource_group_name   = azurerm_private_dns_zone.stamp[each.value.zone].resource_group_name
  private_dns_zone_name = azurerm_private_dns_zone.stamp[each.value.zone].name
  virtual_network_id    = each.value.vnet_id
  registration_enabled  = false
  tags                  = var.tags
}
