// The stamp's container registry: Premium, Entra ID only (no admin user, no anonymous pull), no
// public access, reached over a private endpoint in the spoke (stamp.bicep). Every image the
// workloads run (gateway, OPA, the NVIDIA device plugin) is imported into it (docs/deploy.md), so
// nodes pull only from here and the hub firewall needs no rule for any outside registry (MCR, for
// AKS's own images, is part of the AzureKubernetesService FQDN tag). The kubelet identity pulls.

// ============== //
//   Parameters   //
// ============== //

@description('Required. Prefix for the stamp\'s resources (`<name>-<stamp>`); the registry is `acr<name><stamp>`.')
param name string

@description('Required. Region of the registry.')
param location string

@description('Required. The kubelet identity\'s principal ID (AcrPull).')
param pullerPrincipalId string

@description('Required. The Log Analytics workspace for diagnostic settings.')
param logAnalyticsWorkspaceId string

@description('Optional. Tags for every resource.')
param tags object = {}

// ============= //
//   Variables   //
// ============= //

var acrPull = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '7f951dda-4ed3-4680-a7ca-43fe172d538d')

// ============= //
//   Resources   //
// ============= //

resource registry 'Microsoft.ContainerRegistry/registries@2023-07-01' = {
  // checkov:skip=CKV_AZURE_166:quarantine keeps every pushed or imported image unpullable until a scanner marks it verified, and nothing here marks images, so nodes could never pull
  name: 'acr${replace(name, '-', '')}'
  location: location
  tags: tags
  sku: {
    name: 'Premium'
  }
  properties: {
    adminUserEnabled: false
    anonymousPullEnabled: false
    publicNetworkAccess: 'Disabled'
    // Trusted Azure services (Defender's image scanning) still reach it; nothing else does.
    networkRuleBypassOptions: 'AzureServices'
    // Every stamp region has availability zones already (system pool and firewall span 1-3).
    zoneRedundancy: 'Enabled'
    dataEndpointEnabled: true
    policies: {
      exportPolicy: {
        status: 'disabled'
      }
      // Untagged manifests (superseded imports) are purged after a week.
      retentionPolicy: {
        days: 7
        status: 'enabled'
      }
    }
  }
}

resource puller 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(registry.id, pullerPrincipalId, acrPull)
  scope: registry
  properties: {
    roleDefinitionId: acrPull
    principalId: pullerPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource registryDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: registry
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

// =========== //
//   Outputs   //
// =========== //

@description('The registry\'s login server (the chart\'s image repositories start with it).')
output loginServer string = registry.properties.loginServer

@description('The registry ID, for its private endpoint (stamp.bicep).')
output id string = registry.id
