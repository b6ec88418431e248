// Resources added to the Azure Monitor Private Link Scope (a stamp's data collection endpoints).

@description('Required. The Azure Monitor Private Link Scope.')
param privateLinkScopeName string

@description('Required. A prefix for the scoped resources\' names (the stamp key).')
param namePrefix string

@description('Required. The resources to scope: `name` (suffix of the scoped resource\'s name) and `id`.')
param endpoints array

resource privateLinkScope 'Microsoft.Insights/privateLinkScopes@2021-07-01-preview' existing = {
  name: privateLinkScopeName
}

resource scoped 'Microsoft.Insights/privateLinkScopes/scopedResources@2021-07-01-preview' = [
  for endpoint in endpoints: {
    parent: privateLinkScope
    name: 'dce-${namePrefix}-${endpoint.name}'
    properties: {
      linkedResourceId: endpoint.id
    }
  }
]
