// A stamp's network: a hub with Azure Firewall (Premium, threat intelligence and IDPS in Deny) and
// a spoke for AKS, private endpoints and the ingress, peered; the AKS subnet routes 0.0.0.0/0 to
// the firewall, so all egress is inspected.

// ============== //
//   Parameters   //
// ============== //

@description('Required. Prefix for the stamp\'s resources (`<name>-<stamp>`).')
param name string

@description('Required. Region of the stamp.')
param location string

@description('Required. A /16 (e.g. 10.10.0.0/16) split into the hub (/18) and the spoke (/17).')
param addressSpace string

@description('Required. The Log Analytics workspace for diagnostic settings.')
param logAnalyticsWorkspaceId string

@description('Optional. Tags for every resource.')
param tags object = {}

// ============= //
//   Variables   //
// ============= //

// The same split as Terraform's cidrsubnet() in infra/terraform, written out for a /16
// (checkov's Bicep parser does not read cidrSubnet()).
var octets = split(split(addressSpace, '/')[0], '.')
var base = '${octets[0]}.${octets[1]}'
var hubPrefix = '${base}.0.0/18'
var spokePrefix = '${base}.128.0/17'
var firewallSubnetPrefix = '${base}.0.0/26'
var aksSubnetPrefix = '${base}.128.0/20'
var privateEndpointSubnetPrefix = '${base}.144.0/24'
var ingressSubnetPrefix = '${base}.145.0/24'

// ======= //
//   Hub   //
// ======= //

resource hub 'Microsoft.Network/virtualNetworks@2024-05-01' = {
  name: 'vnet-${name}-hub'
  location: location
  tags: tags
  properties: {
    addressSpace: {
      addressPrefixes: [
        hubPrefix
      ]
    }
    subnets: [
      {
        name: 'AzureFirewallSubnet'
        properties: {
          addressPrefix: firewallSubnetPrefix
          defaultOutboundAccess: false
        }
      }
    ]
  }
}

resource firewallPublicIp 'Microsoft.Network/publicIPAddresses@2024-05-01' = {
  name: 'pip-${name}-fw'
  location: location
  tags: tags
  zones: [
    '1'
    '2'
    '3'
  ]
  sku: {
    name: 'Standard'
  }
  properties: {
    publicIPAllocationMethod: 'Static'
  }
}

resource firewallPolicy 'Microsoft.Network/firewallPolicies@2024-05-01' = {
  name: 'afwp-${name}'
  location: location
  tags: tags
  properties: {
    sku: {
      tier: 'Premium'
    }
    threatIntelMode: 'Deny'
    intrusionDetection: {
      mode: 'Deny'
    }
    dnsSettings: {
      enableProxy: true
    }
  }
}

// Egress the cluster needs, and nothing else: AKS's own dependencies (FQDN tag), Entra ID for
// token validation (JWKS) and workload identity, Azure Monitor, and time sync. No rule for any
// image registry: workload images come from the stamp's own registry over its private endpoint
// (registry.bicep), and MCR, for AKS's own images, is part of the FQDN tag.
resource aksEgress 'Microsoft.Network/firewallPolicies/ruleCollectionGroups@2024-05-01' = {
  parent: firewallPolicy
  name: 'aks-egress'
  properties: {
    priority: 200
    ruleCollections: [
      {
        ruleCollectionType: 'FirewallPolicyFilterRuleCollection'
        name: 'aks-dependencies'
        priority: 200
        action: {
          type: 'Allow'
        }
        rules: [
          {
            ruleType: 'ApplicationRule'
            name: 'aks-fqdn-tag'
            sourceAddresses: [
              aksSubnetPrefix
            ]
            fqdnTags: [
              'AzureKubernetesService'
            ]
            protocols: [
              {
                protocolType: 'Https'
                port: 443
              }
            ]
          }
          {
            ruleType: 'ApplicationRule'
            name: 'entra-id'
            sourceAddresses: [
              aksSubnetPrefix
            ]
            targetFqdns: [
              'login.microsoftonline.com'
              'graph.microsoft.com'
            ]
            protocols: [
              {
                protocolType: 'Https'
                port: 443
              }
            ]
          }
          {
            ruleType: 'ApplicationRule'
            name: 'azure-monitor'
            sourceAddresses: [
              aksSubnetPrefix
            ]
            targetFqdns: [
              '*.ods.opinsights.azure.com'
              '*.oms.opinsights.azure.com'
              '*.monitoring.azure.com'
              '*.ingest.monitor.azure.com'
              '*.handler.control.monitor.azure.com'
            ]
            protocols: [
              {
                protocolType: 'Https'
                port: 443
              }
            ]
          }
        ]
      }
      {
        ruleCollectionType: 'FirewallPolicyFilterRuleCollection'
        name: 'time'
        priority: 300
        action: {
          type: 'Allow'
        }
        rules: [
          {
            ruleType: 'NetworkRule'
            name: 'ntp'
            ipProtocols: [
              'UDP'
            ]
            sourceAddresses: [
              aksSubnetPrefix
            ]
            destinationFqdns: [
              'ntp.ubuntu.com'
            ]
            destinationPorts: [
              '123'
            ]
          }
        ]
      }
    ]
  }
}

resource firewall 'Microsoft.Network/azureFirewalls@2024-05-01' = {
  // checkov:skip=CKV_AZURE_216:threat intelligence is Deny on the attached firewall policy (firewallPolicy above); the firewall-level setting is for classic rules only
  name: 'afw-${name}'
  location: location
  tags: tags
  zones: [
    '1'
    '2'
    '3'
  ]
  properties: {
    sku: {
      name: 'AZFW_VNet'
      tier: 'Premium'
    }
    firewallPolicy: {
      id: firewallPolicy.id
    }
    ipConfigurations: [
      {
        name: 'ipconfig'
        properties: {
          subnet: {
            id: '${hub.id}/subnets/AzureFirewallSubnet'
          }
          publicIPAddress: {
            id: firewallPublicIp.id
          }
        }
      }
    ]
  }
  dependsOn: [
    aksEgress
  ]
}

// ========= //
//   Spoke   //
// ========= //

resource spokeNsg 'Microsoft.Network/networkSecurityGroups@2024-05-01' = {
  name: 'nsg-${name}-spoke'
  location: location
  tags: tags
  properties: {
    securityRules: [
      {
        // Front Door reaches the ingress only over Private Link; nothing from the internet lands here.
        name: 'deny-internet-inbound'
        properties: {
          priority: 4000
          direction: 'Inbound'
          access: 'Deny'
          protocol: '*'
          sourcePortRange: '*'
          destinationPortRange: '*'
          sourceAddressPrefix: 'Internet'
          destinationAddressPrefix: '*'
        }
      }
    ]
  }
}

resource egressRoutes 'Microsoft.Network/routeTables@2024-05-01' = {
  name: 'rt-${name}-egress'
  location: location
  tags: tags
  properties: {
    disableBgpRoutePropagation: true
    routes: [
      {
        name: 'default-via-firewall'
        properties: {
          addressPrefix: '0.0.0.0/0'
          nextHopType: 'VirtualAppliance'
          nextHopIpAddress: firewall.properties.ipConfigurations[0].properties.privateIPAddress
        }
      }
    ]
  }
}

resource spoke 'Microsoft.Network/virtualNetworks@2024-05-01' = {
  // checkov:skip=CKV_AZURE_182:the single DNS server is the hub firewall DNS proxy, itself zone-redundant; a second resolver would bypass the FQDN rules
  name: 'vnet-${name}-spoke'
  location: location
  tags: tags
  properties: {
    addressSpace: {
      addressPrefixes: [
        spokePrefix
      ]
    }
    // The firewall's DNS proxy resolves for the spoke, so FQDN network rules see the same answers.
    dhcpOptions: {
      dnsServers: [
        firewall.properties.ipConfigurations[0].properties.privateIPAddress
      ]
    }
    subnets: [
      {
        name: 'snet-aks'
        properties: {
          addressPrefix: aksSubnetPrefix
          defaultOutboundAccess: false
          networkSecurityGroup: {
            id: spokeNsg.id
          }
          routeTable: {
            id: egressRoutes.id
          }
        }
      }
      {
        name: 'snet-private-endpoints'
        properties: {
          addressPrefix: privateEndpointSubnetPrefix
          defaultOutboundAccess: false
          privateEndpointNetworkPolicies: 'Enabled'
          networkSecurityGroup: {
            id: spokeNsg.id
          }
        }
      }
      {
        // The in-cluster ingress's internal load balancer and its Private Link Service.
        name: 'snet-ingress'
        properties: {
          addressPrefix: ingressSubnetPrefix
          defaultOutboundAccess: false
          privateLinkServiceNetworkPolicies: 'Disabled'
          networkSecurityGroup: {
            id: spokeNsg.id
          }
        }
      }
    ]
  }
}

resource hubToSpoke 'Microsoft.Network/virtualNetworks/virtualNetworkPeerings@2024-05-01' = {
  parent: hub
  name: 'hub-to-spoke'
  properties: {
    remoteVirtualNetwork: {
      id: spoke.id
    }
    allowForwardedTraffic: true
    allowVirtualNetworkAccess: true
  }
}

resource spokeToHub 'Microsoft.Network/virtualNetworks/virtualNetworkPeerings@2024-05-01' = {
  parent: spoke
  name: 'spoke-to-hub'
  properties: {
    remoteVirtualNetwork: {
      id: hub.id
    }
    allowForwardedTraffic: true
    allowVirtualNetworkAccess: true
  }
}

// ======================== //
//   Diagnostic settings    //
// ======================== //

resource firewallDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: firewall
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    logAnalyticsDestinationType: 'Dedicated'
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
    metrics: [
      {
        category: 'AllMetrics'
        enabled: true
      }
    ]
  }
}

resource firewallPublicIpDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: firewallPublicIp
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
    metrics: [
      {
        category: 'AllMetrics'
        enabled: true
      }
    ]
  }
}

resource hubDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: hub
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
    metrics: [
      {
        category: 'AllMetrics'
        enabled: true
      }
    ]
  }
}

resource spokeDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: spoke
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
    metrics: [
      {
        category: 'AllMetrics'
        enabled: true
      }
    ]
  }
}

resource spokeNsgDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: spokeNsg
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    // Network security groups have logs only, no metrics.
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
  }
}

// =========== //
//   Outputs   //
// =========== //

@description('The AKS subnet.')
output aksSubnetId string = '${spoke.id}/subnets/snet-aks'

@description('The private endpoint subnet.')
output privateEndpointSubnetId string = '${spoke.id}/subnets/snet-private-endpoints'

@description('The spoke virtual network name.')
output spokeVirtualNetworkName string = spoke.name

@description('The hub and spoke virtual networks.')
output virtualNetworkIds array = [
  hub.id
  spoke.id
]
