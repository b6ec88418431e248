// Lets one stamp's gateway identity read the policy bundles.

// ============== //
//   Parameters   //
// ============== //

@description('Required. The bundle storage account (in this resource group).')
param storageAccountName string

@description('Required. The principal ID of the gateway\'s user-assigned identity.')
param principalId string

// ============= //
//   Variables   //
// ============= //

var storageBlobDataReader = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '2a2b9908-6ea1-4ae2-8e65-a410df84e7d1')

// ============= //
//   Resources   //
// ============= //

resource storageAccount 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource reader 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storageAccount.id, principalId, storageBlobDataReader)
  scope: storageAccount
  properties: {
    roleDefinitionId: storageBlobDataReader
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}
