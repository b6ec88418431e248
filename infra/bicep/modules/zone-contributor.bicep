// Lets a cluster's control plane identity write the A record of its private API server.

// ============== //
//   Parameters   //
// ============== //

@description('Required. The private DNS zone (in this resource group).')
param zoneName string

@description('Required. The principal ID of the control plane identity.')
param principalId string

// ============= //
//   Variables   //
// ============= //

var privateDnsZoneContributor = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'b12aa53e-6015-4669-85d0-8515ebb3ae7f')

// ============= //
//   Resources   //
// ============= //

resource zone 'Microsoft.Network/privateDnsZones@2024-06-01' existing = {
  name: zoneName
}

resource contributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(zone.id, principalId, privateDnsZoneContributor)
  scope: zone
  properties: {
    roleDefinitionId: privateDnsZoneContributor
    principalId: principalId
    principalType: 'ServicePrincipal'
  }
}
