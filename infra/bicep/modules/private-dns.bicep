// Private DNS zones for the private endpoints and the private AKS API servers, global to all stamps.

// ============== //
//   Parameters   //
// ============== //

@description('Required. Names of the private DNS zones.')
param zoneNames array

@description('Optional. Tags for every resource.')
param tags object = {}

// ============= //
//   Resources   //
// ============= //

resource zones 'Microsoft.Network/privateDnsZones@2024-06-01' = [
  for zoneName in zoneNames: {
    name: zoneName
    location: 'global'
    tags: tags
  }
]

// =========== //
//   Outputs   //
// =========== //

@description('The zone names, in the order given.')
output zoneNames array = zoneNames
