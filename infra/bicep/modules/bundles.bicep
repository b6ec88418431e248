// Signed policy bundles: one storage account for all stamps (geo-zone-redundant, read-access
// secondary), Entra ID only (no shared keys), no public access; each spoke reaches it over its own
// private endpoint. The OPA sidecars download with the gateway's workload identity and verify
// the bundle signature before activating it.

// ============== //
//   Parameters   //
// ============== //

@description('Required. Short name that prefixes every resource.')
param name string

@description('Required. Region of the storage account.')
param location string

@description('Required. The Log Analytics workspace for diagnostic settings.')
param logAnalyticsWorkspaceId string

@description('Optional. A customer-managed key (storage-key.bicep): `vaultUri`, `keyName`, `identityId`. Empty (the default): Microsoft-managed keys.')
param customerManagedKey object = {}

@description('Optional. Tags for every resource.')
param tags object = {}

// ============= //
//   Variables   //
// ============= //

var cmk = !empty(customerManagedKey)

// ============= //
//   Resources   //
// ============= //

resource storageAccount 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_43:the name is 'st' + the validated 3-10 character name + 'bundles', always 3-24 lowercase letters and digits; checkov cannot read the interpolation
  name: 'st${name}bundles'
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: 'Standard_RAGZRS'
  }
  // Opt-in: the account's own key (storage-key.bicep).
  identity: cmk ? {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${customerManagedKey.identityId}': {}
    }
  } : null
  properties: {
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    allowSharedKeyAccess: false
    defaultToOAuthAuthentication: true
    publicNetworkAccess: 'Disabled'
    allowBlobPublicAccess: false
    allowCrossTenantReplication: false
    isLocalUserEnabled: false
    isSftpEnabled: false
    encryption: {
      requireInfrastructureEncryption: true
      keySource: cmk ? 'Microsoft.Keyvault' : 'Microsoft.Storage'
      keyvaultproperties: cmk ? {
        keyvaulturi: customerManagedKey.vaultUri
        keyname: customerManagedKey.keyName
      } : null
      identity: cmk ? {
        userAssignedIdentity: customerManagedKey.identityId
      } : null
      services: {
        blob: {
          enabled: true
        }
      }
    }
    networkAcls: {
      defaultAction: 'Deny'
      bypass: 'AzureServices'
    }
    sasPolicy: {
      sasExpirationPeriod: '00.01:00:00'
      expirationAction: 'Block'
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storageAccount
  name: 'default'
  properties: {
    isVersioningEnabled: true
    deleteRetentionPolicy: {
      enabled: true
      days: 30
    }
    containerDeleteRetentionPolicy: {
      enabled: true
      days: 30
    }
  }
}

resource container 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: 'bundles'
  properties: {
    publicAccess: 'None'
  }
}

resource blobDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: blobService
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
        category: 'Transaction'
        enabled: true
      }
    ]
  }
}

// =========== //
//   Outputs   //
// =========== //

@description('The storage account that holds the bundles.')
output storageAccountId string = storageAccount.id

@description('Its name.')
output storageAccountName string = storageAccount.name

@description('The container the OPA sidecars download bundles from.')
output containerUrl string = '${storageAccount.properties.primaryEndpoints.blob}${container.name}'
