// Key Vault: Azure RBAC, purge protection, soft delete, no public access, reached over a private
// endpoint (stamp.bicep). Holds the gateway's namespace secret (read by the Secrets Store CSI
// driver with the gateway's workload identity).

// ============== //
//   Parameters   //
// ============== //

@description('Required. Prefix for the stamp\'s resources (`<name>-<stamp>`).')
param name string

@description('Required. Region of the vault.')
param location string

@description('Required. The principal that reads secrets (the gateway identity).')
param secretReaderPrincipalId string

@description('Required. The application routing add-on\'s identity, which reads the ingress certificate through its secret.')
param ingressCertificateReaderPrincipalId string

@description('Required. The Log Analytics workspace for diagnostic settings.')
param logAnalyticsWorkspaceId string

@description('Optional. Tags for every resource.')
param tags object = {}

// ============= //
//   Variables   //
// ============= //

var keyVaultSecretsUser = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '4633458b-17de-408a-b874-0445c86b69e6')

// ============= //
//   Resources   //
// ============= //

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  name: 'kv-${name}'
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
      bypass: 'None'
    }
  }
}

resource secretReader 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(vault.id, secretReaderPrincipalId, keyVaultSecretsUser)
  scope: vault
  properties: {
    roleDefinitionId: keyVaultSecretsUser
    principalId: secretReaderPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// The certificate's private key is read through its secret, so Key Vault Secrets User is all the
// add-on needs (the role `az aks approuting update --attach-kv` grants on an RBAC vault).
resource ingressCertificateReader 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(vault.id, ingressCertificateReaderPrincipalId, keyVaultSecretsUser)
  scope: vault
  properties: {
    roleDefinitionId: keyVaultSecretsUser
    principalId: ingressCertificateReaderPrincipalId
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

@description('The vault name (the chart\'s SecretProviderClass reads from it).')
output name string = vault.name

@description('The vault ID, for its private endpoint (stamp.bicep).')
output id string = vault.id
