// tenantgate landing zone: one platform resource group (monitoring, private DNS, Front Door,
// policy bundles) and one deployment stamp per region (hub with Azure Firewall, spoke, AKS,
// Key Vault, Azure Managed Redis). The same architecture and settings as infra/terraform.
//
//   az deployment sub create --location westeurope --template-file main.bicep \
//     --parameters examples/single-region/main.parameters.json
targetScope = 'subscription'

// ============== //
//   Parameters   //
// ============== //

@description('Required. Short name that prefixes every resource (lowercase letters and digits, 3-10 characters), e.g. `tgprod`.')
@minLength(3)
@maxLength(10)
param name string

@description('Required. Region of the shared resources: the platform resource group, Log Analytics, the Azure Monitor workspace and the bundle storage.')
param location string

@description('''Required. One deployment stamp per region; two give the active/active option behind one Front Door.
Each item: `key` (1-4 lowercase letters or digits), `location`, `addressSpace` (a /16 split into hub /18 and spoke /17),
and optionally `ingress` = { hostName, privateLinkServiceId } once the in-cluster ingress exists (see docs/deploy.md).''')
@minLength(1)
@maxLength(2)
param stamps array

@description('Required. Tags for every resource. Must carry `tenantId`, `costCenter`, `environment` and `owner`: the policy assignments below deny resources without them.')
param tags object

@description('Required. Object IDs of the Entra ID groups that get `Azure Kubernetes Service RBAC Cluster Admin` on every cluster.')
@minLength(1)
param aksAdminGroupObjectIds array

@description('Optional. Whether the AKS API server is private (the default). Set to false to use a public API server limited to `apiServerAuthorizedIpRanges`.')
param privateClusterEnabled bool = true

@description('Optional. CIDR ranges allowed to reach a public API server; required when `privateClusterEnabled` is false.')
param apiServerAuthorizedIpRanges array = []

@description('Optional. The system pool: `vmSize`, `minCount`, `maxCount`.')
param systemNodePool object = {
  vmSize: 'Standard_D4ds_v5'
  minCount: 3
  maxCount: 5
}

@description('Optional. The GPU pool: `vmSize`, `minCount`, `maxCount`, `gpuInstanceProfile` (MIG1g, MIG2g, MIG3g, MIG4g, MIG7g, or empty for whole GPUs), `zones` (default all three; empty where the size has no zonal capacity) and `osDiskSizeGB`, the ephemeral OS disk, which must fit the size\'s temp disk (64 GiB on Standard_NC24ads_A100_v4, 128 on NC48ads, 256 on NC96ads).')
param gpuNodePool object = {
  vmSize: 'Standard_NC24ads_A100_v4'
  minCount: 1
  maxCount: 4
  gpuInstanceProfile: ''
  osDiskSizeGB: 64
  zones: [
    '1'
    '2'
    '3'
  ]
}

@description('Optional. The Kubernetes service account of the gateway (the Helm chart\'s defaults).')
param gatewayServiceAccount object = {
  namespace: 'tenantgate'
  name: 'tenantgate-gateway'
}

@description('Optional. Days Log Analytics keeps logs (365-730).')
@minValue(365)
@maxValue(730)
param logRetentionDays int = 365

@description('Optional. Effect of the Kubernetes policies on every cluster (pod security baseline, allowed registries, internal load balancers): `deny` refuses a non-compliant pod or Service at admission, `audit` only reports it (a first rollout on a cluster that already runs workloads). The chart complies with all three.')
@allowed([
  'audit'
  'deny'
])
param kubernetesPolicyEffect string = 'deny'

@description('Optional. Regular expression every container image outside the AKS-managed namespaces must match. Empty (the default): each stamp\'s own container registry, `^acr<name><stamp>\\.azurecr\\.io/.+$`.')
param allowedRegistry string = ''

@description('Optional. Whether the bundle storage account is encrypted with a key of your own (RSA-HSM 3072 in a Key Vault of the platform resource group, rotated yearly) instead of Microsoft-managed keys. Off by default: the account holds signed policy code, not tenant data, and is already encrypted twice. On, the vault gets a private endpoint in the spoke of the stamp in `location`.')
param customerManagedKeyEnabled bool = false

@description('Optional. Weekly windows for Kubernetes patch upgrades (`autoUpgrade`) and node images (`nodeOS`): `dayOfWeek`, `startTime` (HH:MM), `utcOffset` (+HH:MM), `durationHours` (4-24).')
param maintenanceWindows object = {
  autoUpgrade: {
    dayOfWeek: 'Sunday'
    startTime: '02:00'
    utcOffset: '+00:00'
    durationHours: 4
  }
  nodeOS: {
    dayOfWeek: 'Saturday'
    startTime: '02:00'
    utcOffset: '+00:00'
    durationHours: 4
  }
}

// ============= //
//   Variables   //
// ============= //

var requiredTags = [
  'tenantId'
  'costCenter'
  'environment'
  'owner'
]

var stampLocations = [for stamp in stamps: stamp.location]

var platformLocation = [
  location
]

var allowedLocations = union(platformLocation, stampLocations)

var aksPrivateDnsZoneNames = [for stamp in stamps: 'privatelink.${stamp.location}.azmk8s.io']

var sharedPrivateDnsZoneNames = [
  'privatelink.vaultcore.azure.net'
  'privatelink.redis.azure.net'
  'privatelink.azurecr.io'
]

var privateDnsZoneNames = concat(sharedPrivateDnsZoneNames, aksPrivateDnsZoneNames)

var diagnosticResourceTypes = [
  'Microsoft.ContainerService/managedClusters'
  'Microsoft.KeyVault/vaults'
  'Microsoft.Cache/redisEnterprise'
  'Microsoft.ContainerRegistry/registries'
  'Microsoft.Network/azureFirewalls'
  'Microsoft.Network/publicIPAddresses'
  'Microsoft.Network/virtualNetworks'
  'Microsoft.Network/networkSecurityGroups'
  'Microsoft.Cdn/profiles'
  'Microsoft.OperationalInsights/workspaces'
]

var policyDefinitions = {
  allowedLocations: '/providers/Microsoft.Authorization/policyDefinitions/e56962a6-4747-49cd-b67b-bf8b01975c4c'
  requireTag: '/providers/Microsoft.Authorization/policyDefinitions/871b6d14-10aa-478d-b590-94f262ecfa99'
  keyVaultNoPublicAccess: '/providers/Microsoft.Authorization/policyDefinitions/405c5871-3e91-4644-8a63-58e19d68ff5b'
  aksPrivateCluster: '/providers/Microsoft.Authorization/policyDefinitions/040732e8-d947-40b8-95d6-854c95024bf8'
  diagnosticSettingsRequired: '/providers/Microsoft.Authorization/policyDefinitions/7f89b1eb-583c-429a-8828-af049802c1d9'
}

// ===================== //
//   Resource groups     //
// ===================== //

resource platformGroup 'Microsoft.Resources/resourceGroups@2024-03-01' = {
  name: 'rg-${name}-platform'
  location: location
  tags: tags
}

resource stampGroups 'Microsoft.Resources/resourceGroups@2024-03-01' = [
  for stamp in stamps: {
    name: 'rg-${name}-${stamp.key}'
    location: stamp.location
    tags: tags
  }
]

// ================================ //
//   Platform: shared by all stamps //
// ================================ //

module monitoring 'modules/monitoring.bicep' = {
  name: '${name}-monitoring'
  scope: platformGroup
  params: {
    name: name
    location: location
    logRetentionDays: logRetentionDays
    tags: tags
  }
}

module privateDns 'modules/private-dns.bicep' = {
  name: '${name}-private-dns'
  scope: platformGroup
  params: {
    zoneNames: privateDnsZoneNames
    tags: tags
  }
}

module storageKey 'modules/storage-key.bicep' = if (customerManagedKeyEnabled) {
  name: '${name}-storage-key'
  scope: platformGroup
  params: {
    name: name
    location: location
    logAnalyticsWorkspaceId: monitoring.outputs.logAnalyticsWorkspaceId
    tags: tags
  }
}

module bundles 'modules/bundles.bicep' = {
  name: '${name}-bundles'
  scope: platformGroup
  params: {
    name: name
    location: location
    logAnalyticsWorkspaceId: monitoring.outputs.logAnalyticsWorkspaceId
    customerManagedKey: customerManagedKeyEnabled ? {
      vaultUri: storageKey.outputs.vaultUri
      keyName: storageKey.outputs.keyName
      identityId: storageKey.outputs.identityId
    } : {}
    tags: tags
  }
}

module observability 'modules/observability.bicep' = {
  name: '${name}-observability'
  scope: platformGroup
  params: {
    name: name
    location: location
    logAnalyticsWorkspaceId: monitoring.outputs.logAnalyticsWorkspaceId
    monitorWorkspaceName: monitoring.outputs.monitorWorkspaceName
    adminGroupObjectIds: aksAdminGroupObjectIds
    tags: tags
  }
}

// ========== //
//   Stamps   //
// ========== //

module stampDeployments 'modules/stamp.bicep' = [
  for (stamp, i) in stamps: {
    name: '${name}-stamp-${stamp.key}'
    scope: stampGroups[i]
    params: {
      name: name
      stampKey: stamp.key
      location: stamp.location
      addressSpace: stamp.addressSpace
      privateClusterEnabled: privateClusterEnabled
      apiServerAuthorizedIpRanges: apiServerAuthorizedIpRanges
      aksAdminGroupObjectIds: aksAdminGroupObjectIds
      systemNodePool: systemNodePool
      gpuNodePool: gpuNodePool
      gatewayServiceAccount: gatewayServiceAccount
      logAnalyticsWorkspaceId: monitoring.outputs.logAnalyticsWorkspaceId
      monitorWorkspaceId: monitoring.outputs.monitorWorkspaceId
      monitoringLocation: location
      privateLinkScopeId: observability.outputs.privateLinkScopeId
      privateLinkScopeName: observability.outputs.privateLinkScopeName
      grafanaId: observability.outputs.grafanaId
      kubernetesPolicyEffect: kubernetesPolicyEffect
      allowedRegistry: allowedRegistry
      maintenanceWindows: maintenanceWindows
      customerManagedKeyVaultId: customerManagedKeyEnabled && stamp.location == location ? storageKey.outputs.vaultId : ''
      privateDnsResourceGroupName: platformGroup.name
      privateDnsZoneNames: privateDnsZoneNames
      bundleStorageAccountId: bundles.outputs.storageAccountId
      tags: tags
    }
    dependsOn: [
      privateDns
    ]
  }
]

module bundleReaders 'modules/bundle-reader.bicep' = [
  for (stamp, i) in stamps: {
    name: '${name}-bundle-reader-${stamp.key}'
    scope: platformGroup
    params: {
      storageAccountName: bundles.outputs.storageAccountName
      principalId: stampDeployments[i].outputs.gatewayPrincipalId
    }
  }
]

module frontDoor 'modules/front-door.bicep' = {
  name: '${name}-front-door'
  scope: platformGroup
  params: {
    name: name
    stamps: stamps
    logAnalyticsWorkspaceId: monitoring.outputs.logAnalyticsWorkspaceId
    tags: tags
  }
}

// ================= //
//   Azure Policy    //
// ================= //

resource allowedLocationsAssignment 'Microsoft.Authorization/policyAssignments@2024-04-01' = {
  name: '${name}-allowed-locations'
  properties: {
    displayName: 'tenantgate: allowed locations'
    policyDefinitionId: policyDefinitions.allowedLocations
    parameters: {
      listOfAllowedLocations: {
        value: allowedLocations
      }
    }
  }
}

resource requireTagAssignments 'Microsoft.Authorization/policyAssignments@2024-04-01' = [
  for tag in requiredTags: {
    name: '${name}-require-tag-${toLower(tag)}'
    properties: {
      displayName: 'tenantgate: require tag ${tag}'
      policyDefinitionId: policyDefinitions.requireTag
      parameters: {
        tagName: {
          value: tag
        }
      }
    }
  }
]

resource keyVaultNoPublicAccessAssignment 'Microsoft.Authorization/policyAssignments@2024-04-01' = {
  name: '${name}-kv-no-public-access'
  properties: {
    displayName: 'tenantgate: Key Vault without public network access'
    policyDefinitionId: policyDefinitions.keyVaultNoPublicAccess
    parameters: {
      effect: {
        value: 'Deny'
      }
    }
  }
}

// Only with a private API server: the authorized-ranges option is a public endpoint by design.
resource aksPrivateClusterAssignment 'Microsoft.Authorization/policyAssignments@2024-04-01' = if (privateClusterEnabled) {
  name: '${name}-aks-private-cluster'
  properties: {
    displayName: 'tenantgate: AKS API server is private'
    policyDefinitionId: policyDefinitions.aksPrivateCluster
    parameters: {
      effect: {
        value: 'Deny'
      }
    }
  }
}

resource diagnosticSettingsAssignment 'Microsoft.Authorization/policyAssignments@2024-04-01' = {
  name: '${name}-diagnostics-required'
  properties: {
    displayName: 'tenantgate: diagnostic settings required'
    policyDefinitionId: policyDefinitions.diagnosticSettingsRequired
    parameters: {
      listOfResourceTypes: {
        value: diagnosticResourceTypes
      }
    }
  }
}

// Deny policies on the data stores' network and local auth, and the Defender for Containers plan.
module governance 'modules/governance.bicep' = {
  name: '${name}-governance'
  params: {
    name: name
  }
}

// =========== //
//   Outputs   //
// =========== //

@description('The public host name (Front Door endpoint) that apps call.')
output frontDoorEndpointHostName string = frontDoor.outputs.endpointHostName

@description('Where `tenantgate policy bundle` output is uploaded; the OPA sidecars download from here.')
output bundleContainerUrl string = bundles.outputs.containerUrl

@description('Azure Managed Grafana\'s URL (reached over its private endpoint in each spoke).')
output grafanaEndpoint string = observability.outputs.grafanaEndpoint

@description('Per stamp, what the Helm chart needs.')
output stamps array = [
  for (stamp, i) in stamps: {
    key: stamp.key
    aksClusterName: stampDeployments[i].outputs.aksClusterName
    oidcIssuerUrl: stampDeployments[i].outputs.oidcIssuerUrl
    gatewayClientId: stampDeployments[i].outputs.gatewayClientId
    keyVaultName: stampDeployments[i].outputs.keyVaultName
    redisHostName: stampDeployments[i].outputs.redisHostName
    registryLoginServer: stampDeployments[i].outputs.registryLoginServer
  }
]
