// A stamp's own private DNS zones, linked to its own hub and spoke. One resource reached through
// an endpoint in each spoke (the bundle storage, the Azure Monitor Private Link Scope, Grafana)
// has one name and one address per spoke: a zone shared by the stamps would hold only the last
// endpoint's address, out of the other region's reach.

@description('Required. The zone names.')
param zoneNames array

@description('Required. The stamp\'s hub and spoke virtual networks.')
param virtualNetworkIds array

@description('Optional. Tags for every resource.')
param tags object = {}

resource zones 'Microsoft.Network/privateDnsZones@2024-06-01' = [
  for zoneName in zoneNames: {
    name: zoneName
    location: 'global'
    tags: tags
  }
]

module links 'private-dns-links.bicep' = {
  name: '${deployment().name}-links'
  params: {
    zoneNames: zoneNames
    virtualNetworkIds: virtualNetworkIds
    tags: tags
  }
  dependsOn: [
    zones
  ]
}
