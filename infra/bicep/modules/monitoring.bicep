// Monitoring: one Log Analytics workspace (logs, Container Insights, Defender) and one Azure
// Monitor workspace (managed Prometheus) for all stamps.

// ============== //
//   Parameters   //
// ============== //

@description('Required. Short name that prefixes every resource.')
param name string

@description('Required. Region of the workspaces.')
param location string

@description('Required. Days Log Analytics keeps logs.')
param logRetentionDays int

@description('Optional. Tags for every resource.')
param tags object = {}

// ============= //
//   Resources   //
// ============= //

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: 'log-${name}'
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: logRetentionDays
    features: {
      disableLocalAuth: true
    }
  }
}

resource monitorWorkspace 'Microsoft.Monitor/accounts@2023-04-03' = {
  name: 'amw-${name}'
  location: location
  tags: tags
  properties: {
    publicNetworkAccess: 'Disabled'
  }
}

resource workspaceDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: workspace
  properties: {
    workspaceId: workspace.id
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

@description('The Log Analytics workspace every diagnostic setting sends to.')
output logAnalyticsWorkspaceId string = workspace.id

@description('The Azure Monitor workspace that receives managed Prometheus metrics.')
output monitorWorkspaceId string = monitorWorkspace.id

@description('Its name.')
output monitorWorkspaceName string = monitorWorkspace.name
