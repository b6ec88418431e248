// One deployment stamp (one region): hub and spoke network, AKS, the gateway's workload identity,
// Key Vault, Azure Managed Redis and the container registry, each in a module of its own, and the
// spoke's private endpoints to them and to the shared services.

// ============== //
//   Parameters   //
// ============== //

@description('Required. Short name that prefixes every resource.')
param name string

@description('Required. The stamp\'s short key (1-4 lowercase letters or digits).')
@minLength(1)
@maxLength(4)
param stampKey string

@description('Required. Region of the stamp.')
param location string

@description('Required. A /16 split into the hub (/18) and the spoke (/17).')
param addressSpace string

@description('Required. Whether the AKS API server is private.')
param privateClusterEnabled bool

@description('Optional. CIDR ranges allowed to reach a public API server.')
param apiServerAuthorizedIpRanges array = []

@description('Required. Entra ID groups that administer the cluster.')
param aksAdminGroupObjectIds array

@description('Required. The system pool: `vmSize`, `minCount`, `maxCount`.')
param systemNodePool object

@description('Required. The GPU pool: `vmSize`, `minCount`, `maxCount`, `gpuInstanceProfile`.')
param gpuNodePool object

@description('Required. The gateway\'s Kubernetes service account: `namespace`, `name`.')
param gatewayServiceAccount object

@description('Required. The Log Analytics workspace for logs, Container Insights and Defender.')
param logAnalyticsWorkspaceId string

@description('Required. The Azure Monitor workspace for managed Prometheus.')
param monitorWorkspaceId string

@description('Required. Region of the workspaces (the data collection rules and ingestion endpoint go there).')
param monitoringLocation string

@description('Required. The Azure Monitor Private Link Scope (an endpoint in this spoke).')
param privateLinkScopeId string

@description('Required. The Azure Monitor Private Link Scope\'s name (in the platform resource group).')
param privateLinkScopeName string

@description('Required. Azure Managed Grafana (an endpoint in this spoke).')
param grafanaId string

@description('Required. Effect of the Kubernetes policies: `deny` or `audit`.')
param kubernetesPolicyEffect string

@description('Required. Regular expression every container image outside the AKS-managed namespaces must match; empty for the stamp\'s own registry (acr<name><stamp>, registry.bicep).')
param allowedRegistry string

@description('Required. The AKS maintenance windows (`autoUpgrade`, `nodeOS`).')
param maintenanceWindows object

@description('Optional. The bundle storage\'s customer-managed key vault, when this spoke carries its private endpoint (the stamp in the platform region); empty otherwise.')
param customerManagedKeyVaultId string = ''

@description('Required. The resource group that holds the private DNS zones.')
param privateDnsResourceGroupName string

@description('Required. Names of the private DNS zones in that group, all linked to this stamp\'s hub and spoke.')
param privateDnsZoneNames array

@description('Required. The bundle storage account, reached over a private endpoint in this spoke.')
param bundleStorageAccountId string

@description('Optional. Tags for every resource.')
param tags object = {}

// ============= //
//   Variables   //
// ============= //

var privateDnsZoneIds = {
  keyVault: resourceId(subscription().subscriptionId, privateDnsResourceGroupName, 'Microsoft.Network/privateDnsZones', 'privatelink.vaultcore.azure.net')
  redis: resourceId(subscription().subscriptionId, privateDnsResourceGroupName, 'Microsoft.Network/privateDnsZones', 'privatelink.redis.azure.net')
  registry: resourceId(subscription().subscriptionId, privateDnsResourceGroupName, 'Microsoft.Network/privateDnsZones', 'privatelink.azurecr.io')
  aks: resourceId(subscription().subscriptionId, privateDnsResourceGroupName, 'Microsoft.Network/privateDnsZones', 'privatelink.${location}.azmk8s.io')
}

// Zones of resources with an endpoint in every spoke: each stamp keeps its own
// (stamp-private-dns.bicep says why).
var stampPrivateDnsZoneNames = [
  'privatelink.blob.core.windows.net'
  'privatelink.monitor.azure.com'
  'privatelink.oms.opinsights.azure.com'
  'privatelink.ods.opinsights.azure.com'
  'privatelink.agentsvc.azure-automation.net'
  'privatelink.grafana.azure.com'
]

var monitorZoneNames = [
  'privatelink.monitor.azure.com'
  'privatelink.oms.opinsights.azure.com'
  'privatelink.ods.opinsights.azure.com'
  'privatelink.agentsvc.azure-automation.net'
  'privatelink.blob.core.windows.net'
]

// ============= //
//   Modules     //
// ============= //

module network 'network.bicep' = {
  name: '${deployment().name}-network'
  params: {
    name: '${name}-${stampKey}'
    location: location
    addressSpace: addressSpace
    logAnalyticsWorkspaceId: logAnalyticsWorkspaceId
    tags: tags
  }
}

module stampPrivateDns 'stamp-private-dns.bicep' = {
  name: '${deployment().name}-private-dns'
  params: {
    zoneNames: stampPrivateDnsZoneNames
    virtualNetworkIds: network.outputs.virtualNetworkIds
    tags: tags
  }
}

// The control plane identity exists, with its roles, before the cluster does.
resource controlPlaneIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: 'id-${name}-${stampKey}-aks'
  location: location
  tags: tags
}

module spokeNetworkContributor 'network-contributor.bicep' = {
  name: '${deployment().name}-aks-network'
  params: {
    virtualNetworkName: network.outputs.spokeVirtualNetworkName
    principalId: controlPlaneIdentity.properties.principalId
  }
}

module apiServerZoneContributor 'zone-contributor.bicep' = if (privateClusterEnabled) {
  name: '${deployment().name}-aks-dns'
  scope: resourceGroup(privateDnsResourceGroupName)
  params: {
    zoneName: 'privatelink.${location}.azmk8s.io'
    principalId: controlPlaneIdentity.properties.principalId
  }
}

// Nodes resolve the private API server through the hub's DNS proxy: the zones are linked to
// this stamp's networks before the cluster bootstraps.
module privateDnsLinks 'private-dns-links.bicep' = {
  name: '${deployment().name}-dns-links'
  scope: resourceGroup(privateDnsResourceGroupName)
  params: {
    zoneNames: privateDnsZoneNames
    virtualNetworkIds: network.outputs.virtualNetworkIds
    tags: tags
  }
}

module aks 'aks.bicep' = {
  name: '${deployment().name}-aks'
  dependsOn: [
    spokeNetworkContributor
    apiServerZoneContributor
    privateDnsLinks
  ]
  params: {
    name: '${name}-${stampKey}'
    location: location
    controlPlaneIdentityId: controlPlaneIdentity.id
    subnetId: network.outputs.aksSubnetId
    privateClusterEnabled: privateClusterEnabled
    privateDnsZoneId: privateDnsZoneIds.aks
    apiServerAuthorizedIpRanges: apiServerAuthorizedIpRanges
    aksAdminGroupObjectIds: aksAdminGroupObjectIds
    systemNodePool: systemNodePool
    gpuNodePool: gpuNodePool
    logAnalyticsWorkspaceId: logAnalyticsWorkspaceId
    monitorWorkspaceId: monitorWorkspaceId
    monitoringLocation: monitoringLocation
    kubernetesPolicyEffect: kubernetesPolicyEffect
    allowedRegistry: empty(allowedRegistry) ? '^acr${name}${stampKey}\\.azurecr\\.io/.+$' : allowedRegistry
    maintenanceWindows: maintenanceWindows
    tags: tags
  }
}

module dataCollectionEndpointsScoped 'ampls-scoped.bicep' = {
  name: '${deployment().name}-ampls-scoped'
  scope: resourceGroup(privateDnsResourceGroupName)
  params: {
    privateLinkScopeName: privateLinkScopeName
    namePrefix: stampKey
    endpoints: aks.outputs.dataCollectionEndpoints
  }
}

module gatewayIdentity 'gateway-identity.bicep' = {
  name: '${deployment().name}-gateway-identity'
  params: {
    name: '${name}-${stampKey}'
    location: location
    oidcIssuerUrl: aks.outputs.oidcIssuerUrl
    gatewayServiceAccount: gatewayServiceAccount
    tags: tags
  }
}

module keyVault 'key-vault.bicep' = {
  name: '${deployment().name}-key-vault'
  params: {
    name: '${name}-${stampKey}'
    location: location
    secretReaderPrincipalId: gatewayIdentity.outputs.principalId
    ingressCertificateReaderPrincipalId: aks.outputs.webAppRoutingPrincipalId
    logAnalyticsWorkspaceId: logAnalyticsWorkspaceId
    tags: tags
  }
}

module registry 'registry.bicep' = {
  name: '${deployment().name}-registry'
  params: {
    name: '${name}-${stampKey}'
    location: location
    pullerPrincipalId: aks.outputs.kubeletPrincipalId
    logAnalyticsWorkspaceId: logAnalyticsWorkspaceId
    tags: tags
  }
}

module redis 'redis.bicep' = {
  name: '${deployment().name}-redis'
  params: {
    name: '${name}-${stampKey}'
    location: location
    userObjectId: gatewayIdentity.outputs.principalId
    logAnalyticsWorkspaceId: logAnalyticsWorkspaceId
    tags: tags
  }
}

// ============= //
//   Resources   //
// ============= //

// Every service this spoke reaches over an endpoint of its own, registered in a private DNS zone
// (the Terraform's local.private_endpoints, main.endpoints.tf): the name's suffix, the
// connection, the private link group, the zone config and the zone. The Private Link Scope's
// endpoint (five zones) and the opt-in customer-managed key's are declared below on their own.
var privateEndpoints = [
  {
    suffix: 'kv'
    connection: 'key-vault'
    groupId: 'vault'
    zoneConfig: 'vault'
    zoneId: privateDnsZoneIds.keyVault
  }
  {
    suffix: 'redis'
    connection: 'redis'
    groupId: 'redisEnterprise'
    zoneConfig: 'redis'
    zoneId: privateDnsZoneIds.redis
  }
  {
    // The zone group writes both the login server and the regional data endpoint records.
    suffix: 'acr'
    connection: 'registry'
    groupId: 'registry'
    zoneConfig: 'registry'
    zoneId: privateDnsZoneIds.registry
  }
  {
    // The stamp's own blob zone: each spoke resolves the account to its own endpoint.
    suffix: 'bundles'
    connection: 'bundles'
    groupId: 'blob'
    zoneConfig: 'blob'
    zoneId: resourceId('Microsoft.Network/privateDnsZones', 'privatelink.blob.core.windows.net')
  }
  {
    suffix: 'grafana'
    connection: 'grafana'
    groupId: 'grafana'
    zoneConfig: 'grafana'
    zoneId: resourceId('Microsoft.Network/privateDnsZones', 'privatelink.grafana.azure.com')
  }
]

// What each endpoint connects to, by suffix. Module outputs are known only during the
// deployment, and a loop's array must be known at its start, so they are looked up here.
var privateEndpointTargets = {
  kv: keyVault.outputs.id
  redis: redis.outputs.id
  acr: registry.outputs.id
  bundles: bundleStorageAccountId
  grafana: grafanaId
}

resource endpoints 'Microsoft.Network/privateEndpoints@2024-05-01' = [
  for endpoint in privateEndpoints: {
    name: 'pe-${name}-${stampKey}-${endpoint.suffix}'
    location: location
    tags: tags
    properties: {
      subnet: {
        id: network.outputs.privateEndpointSubnetId
      }
      privateLinkServiceConnections: [
        {
          name: endpoint.connection
          properties: {
            privateLinkServiceId: privateEndpointTargets[endpoint.suffix]
            groupIds: [
              endpoint.groupId
            ]
          }
        }
      ]
    }
  }
]

resource endpointsDns 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2024-05-01' = [
  for (endpoint, i) in privateEndpoints: {
    parent: endpoints[i]
    name: 'default'
    dependsOn: [
      stampPrivateDns
    ]
    properties: {
      privateDnsZoneConfigs: [
        {
          name: endpoint.zoneConfig
          properties: {
            privateDnsZoneId: endpoint.zoneId
          }
        }
      ]
    }
  }
]

// The customer-managed key's vault (opt-in), reached from the platform region's spoke.
resource customerManagedKeyEndpoint 'Microsoft.Network/privateEndpoints@2024-05-01' = if (!empty(customerManagedKeyVaultId)) {
  name: 'pe-${name}-${stampKey}-kv-cmk'
  location: location
  tags: tags
  properties: {
    subnet: {
      id: network.outputs.privateEndpointSubnetId
    }
    privateLinkServiceConnections: [
      {
        name: 'key-vault-cmk'
        properties: {
          privateLinkServiceId: customerManagedKeyVaultId
          groupIds: [
            'vault'
          ]
        }
      }
    ]
  }
}

resource customerManagedKeyEndpointDns 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2024-05-01' = if (!empty(customerManagedKeyVaultId)) {
  parent: customerManagedKeyEndpoint
  name: 'default'
  properties: {
    privateDnsZoneConfigs: [
      {
        name: 'vault'
        properties: {
          privateDnsZoneId: privateDnsZoneIds.keyVault
        }
      }
    ]
  }
}

// Private ingestion: this spoke's endpoint to the Azure Monitor Private Link Scope, registered in
// the stamp's own Azure Monitor zones.
resource monitorEndpoint 'Microsoft.Network/privateEndpoints@2024-05-01' = {
  name: 'pe-${name}-${stampKey}-ampls'
  location: location
  tags: tags
  dependsOn: [
    dataCollectionEndpointsScoped
  ]
  properties: {
    subnet: {
      id: network.outputs.privateEndpointSubnetId
    }
    privateLinkServiceConnections: [
      {
        name: 'ampls'
        properties: {
          privateLinkServiceId: privateLinkScopeId
          groupIds: [
            'azuremonitor'
          ]
        }
      }
    ]
  }
}

resource monitorEndpointDns 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2024-05-01' = {
  parent: monitorEndpoint
  name: 'default'
  dependsOn: [
    stampPrivateDns
  ]
  properties: {
    privateDnsZoneConfigs: [
      for zoneName in monitorZoneNames: {
        name: replace(zoneName, '.', '-')
        properties: {
          privateDnsZoneId: resourceId('Microsoft.Network/privateDnsZones', zoneName)
        }
      }
    ]
  }
}

// =========== //
//   Outputs   //
// =========== //

@description('The hub and spoke virtual networks, for the private DNS zone links.')
output virtualNetworkIds array = network.outputs.virtualNetworkIds

@description('The gateway identity\'s principal ID (bundle reader).')
output gatewayPrincipalId string = gatewayIdentity.outputs.principalId

@description('The gateway identity\'s client ID (the service account annotation).')
output gatewayClientId string = gatewayIdentity.outputs.clientId

@description('The cluster name.')
output aksClusterName string = aks.outputs.name

@description('The cluster\'s OIDC issuer.')
output oidcIssuerUrl string = aks.outputs.oidcIssuerUrl

@description('The Key Vault name.')
output keyVaultName string = keyVault.outputs.name

@description('The Redis host name.')
output redisHostName string = redis.outputs.hostName

@description('The registry\'s login server.')
output registryLoginServer string = registry.outputs.loginServer
