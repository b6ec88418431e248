// AKS: Entra ID with Azure RBAC and no local accounts, workload identity (OIDC issuer), Azure
// Policy add-on, Cilium network policy, Defender, Container Insights and managed Prometheus, a
// private API server (or authorized ranges), egress through the hub firewall, the application
// routing add-on as the regional ingress; a system pool and a tainted GPU pool (optionally
// MIG-partitioned).

// ============== //
//   Parameters   //
// ============== //

@description('Required. Prefix for the stamp\'s resources (`<name>-<stamp>`).')
param name string

@description('Required. Region of the cluster.')
param location string

@description('Required. The control plane\'s user-assigned identity (Network Contributor on the spoke, Private DNS Zone Contributor on the API server zone).')
param controlPlaneIdentityId string

@description('Required. The AKS subnet (routes 0.0.0.0/0 to the hub firewall).')
param subnetId string

@description('Required. Whether the API server is private.')
param privateClusterEnabled bool

@description('Required. The private DNS zone of the API server (used when private).')
param privateDnsZoneId string

@description('Optional. CIDR ranges allowed to reach a public API server.')
param apiServerAuthorizedIpRanges array = []

@description('Required. Entra ID groups that get Azure Kubernetes Service RBAC Cluster Admin.')
param aksAdminGroupObjectIds array

@description('Required. The system pool: `vmSize`, `minCount`, `maxCount`.')
param systemNodePool object

@description('Required. The GPU pool: `vmSize`, `minCount`, `maxCount`, `gpuInstanceProfile` (empty for whole GPUs), `osDiskSizeGB` (fits the size\'s temp disk).')
param gpuNodePool object

@description('Required. The Log Analytics workspace for Container Insights, Defender and diagnostics.')
param logAnalyticsWorkspaceId string

@description('Required. The Azure Monitor workspace for managed Prometheus.')
param monitorWorkspaceId string

@description('Optional. Tags for every resource.')
param tags object = {}

// ============= //
//   Variables   //
// ============= //

var clusterAdminRole = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'b1ff04bb-8a4e-4dc4-8eb5-8693973ce19b')

// =========== //
//   Cluster   //
// =========== //

resource cluster 'Microsoft.ContainerService/managedClusters@2025-07-01' = {
  // checkov:skip=CKV_AZURE_8:the Kubernetes dashboard add-on no longer exists on supported Kubernetes versions and the API rejects a kubeDashboard profile
  // checkov:skip=CKV_AZURE_172:rotation is on (enableSecretRotation 'true'); add-on config values are strings in the API and checkov compares with a boolean
  name: 'aks-${name}'
  location: location
  tags: tags
  sku: {
    name: 'Base'
    tier: 'Standard'
  }
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${controlPlaneIdentityId}': {}
    }
  }
  properties: {
    dnsPrefix: name
    nodeResourceGroup: 'rg-${name}-nodes'
    autoUpgradeProfile: {
      upgradeChannel: 'patch'
      nodeOSUpgradeChannel: 'NodeImage'
    }
    // Identity: Entra ID users through Azure RBAC only; pods through workload identity.
    disableLocalAccounts: true
    enableRBAC: true
    aadProfile: {
      managed: true
      enableAzureRBAC: true
      adminGroupObjectIDs: aksAdminGroupObjectIds
      tenantID: subscription().tenantId
    }
    oidcIssuerProfile: {
      enabled: true
    }
    securityProfile: {
      workloadIdentity: {
        enabled: true
      }
      defender: {
        logAnalyticsWorkspaceResourceId: logAnalyticsWorkspaceId
        securityMonitoring: {
          enabled: true
        }
      }
      imageCleaner: {
        enabled: true
        intervalHours: 48
      }
    }
    // API server: private by default, or public behind authorized ranges.
    apiServerAccessProfile: {
      enablePrivateCluster: privateClusterEnabled
      privateDNSZone: privateClusterEnabled ? privateDnsZoneId : null
      enablePrivateClusterPublicFQDN: false
      authorizedIPRanges: privateClusterEnabled ? [] : apiServerAuthorizedIpRanges
    }
    addonProfiles: {
      azurepolicy: {
        enabled: true
      }
      // Container Insights, authenticated with the cluster's identity.
      omsagent: {
        enabled: true
        config: {
          logAnalyticsWorkspaceResourceID: logAnalyticsWorkspaceId
          useAADAuth: 'true'
        }
      }
      // Secrets come from Key Vault through the Secrets Store CSI driver, rotated in place.
      azureKeyvaultSecretsProvider: {
        enabled: true
        config: {
          enableSecretRotation: 'true'
          rotationPollInterval: '2m'
        }
      }
    }
    // The regional ingress (application routing add-on), declared so a redeployment keeps it and
    // the Private Link Service Front Door's origin points at. AnnotationControlled: the default
    // NginxIngressController carries the internal-LB/PLS annotations (docs/deploy.md, step 2).
    // No DNS zones (Front Door uses Private Link); TLS from Key Vault via the CSI driver above.
    ingressProfile: {
      webAppRouting: {
        enabled: true
        dnsZoneResourceIds: []
        nginx: {
          defaultIngressControllerType: 'AnnotationControlled'
        }
      }
    }
    // Managed Prometheus (the data collection rule and its association are below).
    azureMonitorProfile: {
      metrics: {
        enabled: true
      }
    }
    agentPoolProfiles: [
      {
        name: 'system'
        mode: 'System'
        osType: 'Linux'
        type: 'VirtualMachineScaleSets'
        vmSize: systemNodePool.vmSize
        count: systemNodePool.minCount
        minCount: systemNodePool.minCount
        maxCount: systemNodePool.maxCount
        enableAutoScaling: true
        maxPods: 50
        osDiskType: 'Ephemeral'
        enableEncryptionAtHost: true
        vnetSubnetID: subnetId
        availabilityZones: [
          '1'
          '2'
          '3'
        ]
        // Critical add-ons only: workloads go to the GPU pool.
        nodeTaints: [
          'CriticalAddonsOnly=true:NoSchedule'
        ]
        upgradeSettings: {
          maxSurge: '33%'
        }
      }
    ]
    networkProfile: {
      networkPlugin: 'azure'
      networkPluginMode: 'overlay'
      networkDataplane: 'cilium'
      networkPolicy: 'cilium'
      outboundType: 'userDefinedRouting'
      loadBalancerSku: 'standard'
      podCidr: '192.168.0.0/16'
      serviceCidr: '172.16.0.0/16'
      dnsServiceIP: '172.16.0.10'
    }
  }
}

resource gpuPool 'Microsoft.ContainerService/managedClusters/agentPools@2025-07-01' = {
  parent: cluster
  name: 'gpu'
  properties: {
    mode: 'User'
    osType: 'Linux'
    type: 'VirtualMachineScaleSets'
    vmSize: gpuNodePool.vmSize
    count: gpuNodePool.minCount
    minCount: gpuNodePool.minCount
    maxCount: gpuNodePool.maxCount
    enableAutoScaling: true
    maxPods: 50
    osDiskType: 'Ephemeral'
    osDiskSizeGB: gpuNodePool.osDiskSizeGB
    enableEncryptionAtHost: true
    vnetSubnetID: subnetId
    gpuInstanceProfile: empty(gpuNodePool.gpuInstanceProfile) ? null : gpuNodePool.gpuInstanceProfile
    // AKS installs and maintains the NVIDIA driver; the device plugin is ours (docs/deploy.md).
    gpuProfile: {
      driver: 'Install'
    }
    nodeTaints: [
      'nvidia.com/gpu=present:NoSchedule'
    ]
    nodeLabels: {
      'tenantgate.io/pool': 'gpu'
    }
    upgradeSettings: {
      maxSurge: '1'
    }
  }
}

// Cluster admins are Entra ID groups; there is no other way in.
resource clusterAdmins 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for groupId in aksAdminGroupObjectIds: {
    name: guid(cluster.id, groupId, clusterAdminRole)
    scope: cluster
    properties: {
      roleDefinitionId: clusterAdminRole
      principalId: groupId
      principalType: 'Group'
    }
  }
]

// ====================== //
//   Managed Prometheus   //
// ====================== //

resource prometheusEndpoint 'Microsoft.Insights/dataCollectionEndpoints@2023-03-11' = {
  name: 'dce-${name}'
  location: location
  tags: tags
  kind: 'Linux'
  properties: {
    // The metrics agents reach it through the hub firewall (*.ingest.monitor.azure.com); an Azure
    // Monitor Private Link Scope would make this private too (docs/deploy.md).
    networkAcls: {
      publicNetworkAccess: 'Enabled'
    }
  }
}

resource prometheusRule 'Microsoft.Insights/dataCollectionRules@2023-03-11' = {
  name: 'dcr-${name}-prometheus'
  location: location
  tags: tags
  kind: 'Linux'
  properties: {
    dataCollectionEndpointId: prometheusEndpoint.id
    dataSources: {
      prometheusForwarder: [
        {
          name: 'PrometheusDataSource'
          streams: [
            'Microsoft-PrometheusMetrics'
          ]
        }
      ]
    }
    destinations: {
      monitoringAccounts: [
        {
          name: 'MonitoringAccount'
          accountResourceId: monitorWorkspaceId
        }
      ]
    }
    dataFlows: [
      {
        streams: [
          'Microsoft-PrometheusMetrics'
        ]
        destinations: [
          'MonitoringAccount'
        ]
      }
    ]
  }
}

resource prometheusAssociation 'Microsoft.Insights/dataCollectionRuleAssociations@2023-03-11' = {
  name: 'dcra-${name}-prometheus'
  scope: cluster
  properties: {
    dataCollectionRuleId: prometheusRule.id
  }
}

resource clusterDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: cluster
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    logAnalyticsDestinationType: 'Dedicated'
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

@description('The cluster name.')
output name string = cluster.name

@description('The cluster\'s OIDC issuer (the gateway\'s federated credential trusts it).')
output oidcIssuerUrl string = cluster.properties.oidcIssuerProfile.issuerURL

@description('The kubelet identity\'s principal ID (AcrPull on the stamp\'s registry).')
output kubeletPrincipalId string = cluster.properties.identityProfile.kubeletidentity.objectId

@description('The application routing add-on identity\'s principal ID (reads the ingress certificate).')
output webAppRoutingPrincipalId string = cluster.properties.ingressProfile.webAppRouting.identity.objectId
