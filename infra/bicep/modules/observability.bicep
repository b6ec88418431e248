// Observability beside the workspaces: private ingestion (Azure Monitor Private Link Scope) and
// Azure Managed Grafana on the Azure Monitor workspace.

// ============== //
//   Parameters   //
// ============== //

@description('Required. Short name that prefixes every resource.')
param name string

@description('Required. Region of the workspaces and of Grafana.')
param location string

@description('Required. The Log Analytics workspace, scoped into the Private Link Scope.')
param logAnalyticsWorkspaceId string

@description('Required. The Azure Monitor workspace Grafana reads.')
param monitorWorkspaceName string

@description('Required. Entra ID groups that administer Grafana (the cluster admins).')
param adminGroupObjectIds array

@description('Optional. Tags for every resource.')
param tags object = {}

// ============= //
//   Variables   //
// ============= //

var monitoringDataReaderRole = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'b0d8363b-8ddd-447d-831f-62ca05bff136')

var monitoringReaderRole = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '43d0d8ad-25c7-4714-9337-8ba259a9fe05')

var grafanaAdminRole = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '22926164-76b3-42b3-bc55-97df8dab3e41')

// ===================================== //
//   Azure Monitor Private Link Scope    //
// ===================================== //

resource monitorWorkspace 'Microsoft.Monitor/accounts@2023-04-03' existing = {
  name: monitorWorkspaceName
}

// Agents ingest only through the scope's private endpoints (PrivateOnly): the Log Analytics
// workspace and every data collection endpoint are in it. Queries stay open so the portal and
// Grafana keep working without a path into the spokes.
resource privateLinkScope 'Microsoft.Insights/privateLinkScopes@2021-07-01-preview' = {
  name: 'ampls-${name}'
  location: 'global'
  tags: tags
  properties: {
    accessModeSettings: {
      ingestionAccessMode: 'PrivateOnly'
      queryAccessMode: 'Open'
    }
  }
}

resource workspaceScoped 'Microsoft.Insights/privateLinkScopes/scopedResources@2021-07-01-preview' = {
  parent: privateLinkScope
  name: 'log-analytics'
  properties: {
    linkedResourceId: logAnalyticsWorkspaceId
  }
}

// ============================ //
//   Azure Managed Grafana      //
// ============================ //

// Standard (the SKU with private endpoints and zone redundancy), no public access: operators sign
// in with Entra ID from the private network. It reads the Azure Monitor workspace (itself without
// public access) through a managed private endpoint.
resource grafana 'Microsoft.Dashboard/grafana@2024-10-01' = {
  name: 'amg-${name}'
  location: location
  tags: tags
  sku: {
    name: 'Standard'
  }
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    grafanaMajorVersion: '11'
    publicNetworkAccess: 'Disabled'
    apiKey: 'Disabled'
    deterministicOutboundIP: 'Disabled'
    zoneRedundancy: 'Enabled'
    grafanaIntegrations: {
      azureMonitorWorkspaceIntegrations: [
        {
          azureMonitorWorkspaceResourceId: monitorWorkspace.id
        }
      ]
    }
  }
}

// Grafana's identity queries Prometheus data and reads Azure Monitor metrics and logs.
resource grafanaMonitorWorkspace 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(monitorWorkspace.id, grafana.id, monitoringDataReaderRole)
  scope: monitorWorkspace
  properties: {
    roleDefinitionId: monitoringDataReaderRole
    principalId: grafana.identity.principalId
    principalType: 'ServicePrincipal'
  }
}

resource grafanaMonitoringReader 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, grafana.id, monitoringReaderRole)
  properties: {
    roleDefinitionId: monitoringReaderRole
    principalId: grafana.identity.principalId
    principalType: 'ServicePrincipal'
  }
}

// The cluster admins administer Grafana too; nobody else gets in until they grant it.
resource grafanaAdmins 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for groupId in adminGroupObjectIds: {
    name: guid(grafana.id, groupId, grafanaAdminRole)
    scope: grafana
    properties: {
      roleDefinitionId: grafanaAdminRole
      principalId: groupId
      principalType: 'Group'
    }
  }
]

// Approve its connection on the Azure Monitor workspace once (docs/deploy.md, observability).
resource grafanaToMonitorWorkspace 'Microsoft.Dashboard/grafana/managedPrivateEndpoints@2024-10-01' = {
  parent: grafana
  name: 'mpe-amw'
  location: location
  properties: {
    privateLinkResourceId: monitorWorkspace.id
    privateLinkResourceRegion: location
    groupIds: [
      'prometheusMetrics'
    ]
  }
}

// =========== //
//   Outputs   //
// =========== //

@description('The Azure Monitor Private Link Scope (each spoke has a private endpoint to it).')
output privateLinkScopeId string = privateLinkScope.id

@description('Its name, for the stamps\' scoped data collection endpoints.')
output privateLinkScopeName string = privateLinkScope.name

@description('Grafana (each spoke has a private endpoint to it).')
output grafanaId string = grafana.id

@description('Grafana\'s URL (reached over its private endpoint in each spoke).')
output grafanaEndpoint string = grafana.properties.endpoint
