// Links every private DNS zone to one stamp's hub and spoke.

// ============== //
//   Parameters   //
// ============== //

@description('Required. Names of the private DNS zones (in this resource group).')
param zoneNames array

@description('Required. Resource IDs of the virtual networks to link (the stamp\'s hub and spoke).')
param virtualNetworkIds array

@description('Optional. Tags for every resource.')
param tags object = {}

// ============= //
//   Variables   //
// ============= //

var zoneCount = length(zoneNames)

// ============= //
//   Resources   //
// ============= //

resource links 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2024-06-01' = [
  for i in range(0, zoneCount * length(virtualNetworkIds)): {
    name: '${zoneNames[i % zoneCount]}/${last(split(virtualNetworkIds[i / zoneCount], '/'))}'
    location: 'global'
    tags: tags
    properties: {
      registrationEnabled: false
      virtualNetwork: {
        id: virtualNetworkIds[i / zoneCount]
      }
    }
  }
]
