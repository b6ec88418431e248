// Opt-in customer-managed key for the bundle storage account: a Key Vault of its own, because the
// storage service reaches the key as a trusted service, which the stamps' vaults (bypass None)
// refuse. The account uses the versionless key, so each rotation is picked up without a change
// here. The vault's private endpoint is in the spoke of the stamp in the platform region
// (stamp.bicep).

// ============== //
//   Parameters   //
// ============== //

@description('Required. Short name that prefixes every resource.')
param name string

@description('Required. Region of the vault (the platform region).')
param location string

@description('Required. The Log Analytics workspace for diagnostic settings.')
param logAnalyticsWorkspaceId string

@description('Optional. Tags for every resource.')
param tags object = {}

// ============= //
//   Variables   //
// ============= //

var cryptoServiceEncryptionUserRole = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'e147488a-f6f5-4113-8e2d-b22465e65bf6')

// ============= //
//   Resources   //
// ============= //

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: 'id-${name}-bundles'
  location: location
  tags: tags
}

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  name: 'kv-${name}-cmk'
  location: location
  tags: tags
  properties: {
    tenantId: subscription().tenantId
    sku: {
      family: 'A'
      name: 'premium'
    }
    enableRbacAuthorization: true
    enablePurgeProtection: true
    enableSoftDelete: true
    softDeleteRetentionInDays: 90
    publicNetworkAccess: 'Disabled'
    networkAcls: {
      defaultAction: 'Deny'
      bypass: 'AzureServices'
    }
  }
}

resource key 'Microsoft.KeyVault/vaults/keys@2023-07-01' = {
  // checkov:skip=CKV_AZURE_40:the rotation policy makes a new version every year and gives each one a two-year expiry; a fixed expiration date here would stop the account's encryption on that day
  parent: vault
  name: 'bundles'
  properties: {
    kty: 'RSA-HSM'
    keySize: 3072
    keyOps: [
      'wrapKey'
      'unwrapKey'
    ]
    rotationPolicy: {
      attributes: {
        expiryTime: 'P2Y'
      }
      lifetimeActions: [
        {
          trigger: {
            timeAfterCreate: 'P1Y'
          }
          action: {
            type: 'rotate'
          }
        }
        {
          trigger: {
            timeBeforeExpiry: 'P30D'
          }
          action: {
            type: 'notify'
          }
        }
      ]
    }
  }
}

resource keyUser 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(vault.id, identity.id, cryptoServiceEncryptionUserRole)
  scope: vault
  properties: {
    roleDefinitionId: cryptoServiceEncryptionUserRole
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

resource vaultDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: vault
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

@description('The vault (its private endpoint is in a stamp\'s spoke).')
output vaultId string = vault.id

@description('The vault\'s URI, for the storage account\'s encryption settings.')
output vaultUri string = vault.properties.vaultUri

@description('The key\'s name.')
output keyName string = key.name

@description('The identity the storage account reads the key with (it has the role once this module is done).')
output identityId string = identity.id
