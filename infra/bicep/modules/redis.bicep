// Azure Managed Redis for quotas and shared counters: TLS only, access keys disabled so Entra ID
// is the only way in, no public access, reached over a private endpoint (stamp.bicep). The cache
// is disposable: each region keeps its own budgets (see docs/deploy.md, failover).

// ============== //
//   Parameters   //
// ============== //

@description('Required. Prefix for the stamp\'s resources (`<name>-<stamp>`).')
param name string

@description('Required. Region of the cache.')
param location string

@description('Required. The Entra ID object that gets the default data access policy (the gateway identity).')
param userObjectId string

@description('Required. The Log Analytics workspace for diagnostic settings.')
param logAnalyticsWorkspaceId string

@description('Optional. Tags for every resource.')
param tags object = {}

// ============= //
//   Resources   //
// ============= //

resource cache 'Microsoft.Cache/redisEnterprise@2025-07-01' = {
  name: 'redis-${name}'
  location: location
  tags: tags
  sku: {
    name: 'Balanced_B1'
  }
  properties: {
    highAvailability: 'Enabled'
    minimumTlsVersion: '1.2'
    publicNetworkAccess: 'Disabled'
  }
}

resource database 'Microsoft.Cache/redisEnterprise/databases@2025-07-01' = {
  parent: cache
  name: 'default'
  properties: {
    accessKeysAuthentication: 'Disabled'
    clientProtocol: 'Encrypted'
    port: 10000
    // One endpoint for clients; the limiter's keys are hash-tagged, so OSS cluster mode works too.
    clusteringPolicy: 'EnterpriseCluster'
    // Quota counters must never be evicted silently.
    evictionPolicy: 'NoEviction'
  }
}

// Entra ID authentication: the gateway's identity gets the default data access policy.
resource gatewayAccess 'Microsoft.Cache/redisEnterprise/databases/accessPolicyAssignments@2025-07-01' = {
  parent: database
  name: 'gateway'
  properties: {
    accessPolicyName: 'default'
    user: {
      objectId: userObjectId
    }
  }
}

resource cacheDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: cache
  properties: {
    workspaceId: logAnalyticsWorkspaceId
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

@description('The cache host name (port 10000, TLS).')
output hostName string = cache.properties.hostName

@description('The cache ID, for its private endpoint (stamp.bicep).')
output id string = cache.id
