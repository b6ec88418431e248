// Lets a cluster's control plane identity join nodes and internal load balancers to the spoke.

// ============== //
//   Parameters   //
// ============== //

@description('Required. The spoke virtual network (in this resource group).')
param virtualNetworkName string

@description('Required. The principal ID of the control plane identity.')
param principalId string

// ============= //
//   Variables   //
// ============= //

var networkContributor = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '4d97b98b-1d4f-4787-a291-c67834d212e7')

// ============= //
//   Resources   //
// ============= //

resource spoke 'Microsoft.Network/virtualNetworks@2024-05-01' existing = {
  name: virtualNetworkName
}

resource contributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(spoke.id, principalId, networkContributor)
  scope: spoke
  properties: {
    roleDefinitionId: networkContributor
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}
