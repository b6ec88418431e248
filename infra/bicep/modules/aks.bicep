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

@description('Required. Region of the workspaces: the data collection rules and ingestion endpoint live there, whichever region the cluster is in.')
param monitoringLocation string

@description('Required. Effect of the Kubernetes policies on the cluster: `deny` or `audit`.')
@allowed([
  'audit'
  'deny'
])
param kubernetesPolicyEffect string

@description('Required. Regular expression every container image outside the AKS-managed namespaces must match.')
param allowedRegistry string

@description('Required. Weekly maintenance windows: `autoUpgrade` and `nodeOS`, each `dayOfWeek`, `startTime`, `utcOffset`, `durationHours`.')
param maintenanceWindows object

@description('Optional. Tags for every resource.')
param tags object = {}

// ============= //
//   Variables   //
// ============= //

var allZones = [
  '1'
  '2'
  '3'
]

// A gpuNodePool given without `zones` (an older parameters file) keeps the default: all three.
var gpuZones = contains(gpuNodePool, 'zones') ? gpuNodePool.zones : allZones

var clusterAdminRole = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'b1ff04bb-8a4e-4dc4-8eb5-8693973ce19b')

// Kubernetes policies (Azure Policy add-on, Gatekeeper), built-ins from Azure/azure-policy
// built-in-policies/.../Kubernetes/:
// - Kubernetes_PSPBaselineStandard.json: no privileged containers (95edb821-ddaf-4404-9732-
//   666045e056b4), no host network, PID or IPC, default capabilities only, no hostPath volumes.
//   Baseline rather than restricted cluster-wide: the restricted initiative's volume-type list
//   has no `csi`, which the chart's Key Vault mounts need. The tenantgate namespace gets
//   restricted from Pod Security admission on top (docs/deploy.md, step 2).
// - ContainerAllowedImages.json: images only from the stamp's registry.
// - LoadbalancerNoPublicIPs.json: Services of type LoadBalancer only internal.
var kubernetesPolicyDefinitions = {
  podSecurityBaseline: '/providers/Microsoft.Authorization/policySetDefinitions/a8640138-9b0a-4a28-b8cb-1666c838647d'
  allowedImages: '/providers/Microsoft.Authorization/policyDefinitions/febd0533-8e55-448f-b837-bd0e06f16469'
  internalLoadBalancers: '/providers/Microsoft.Authorization/policyDefinitions/3fc4dc25-5baf-40d8-9b05-7fe74c1bc64e'
}

// The Gatekeeper defaults, plus the application routing add-on's namespace for the image rule
// only (its NGINX images come from mcr.microsoft.com); its load balancer stays covered.
var kubernetesSystemNamespaces = [
  'kube-system'
  'gatekeeper-system'
  'azure-arc'
]

var imageRuleExcludedNamespaces = concat(kubernetesSystemNamespaces, [
  'app-routing-system'
])

// The alert rules the chart ships (infra/helm/tenantgate/files/alerts.yaml, docs/operations.md):
// one file, so the landing zone pages on exactly what the chart's PrometheusRule does. The file
// has no `for`: a condition that must hold for a while says so in its expression.
var prometheusAlerts = loadYamlContent('../../helm/tenantgate/files/alerts.yaml', '$.groups[0].rules')
// The rules' severity label on Azure Monitor's 0 (critical) to 4 (verbose) scale.
var prometheusAlertSeverity = {
  critical: 1
  warning: 2
  info: 3
}

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
      // Container Insights, authenticated with the cluster's identity (its data collection rule
    // and association are below). The Defender plan itself is enabled on the subscription
    // (governance.bicep); the securityProfile above only deploys its sensor.
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
    // Zonal like the system pool: a zone outage leaves the other zones' engines serving (the
    // engine StatefulSet spreads over topology.kubernetes.io/zone).
    availabilityZones: gpuZones
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

// Upgrades roll nodes only inside these windows (node images and Kubernetes patches on different
// days, so a node never goes through both at once).
resource autoUpgradeWindow 'Microsoft.ContainerService/managedClusters/maintenanceConfigurations@2024-09-01' = {
  parent: cluster
  name: 'aksManagedAutoUpgradeSchedule'
  properties: {
    maintenanceWindow: {
      schedule: {
        weekly: {
          intervalWeeks: 1
          dayOfWeek: maintenanceWindows.autoUpgrade.dayOfWeek
        }
      }
      startTime: maintenanceWindows.autoUpgrade.startTime
      utcOffset: maintenanceWindows.autoUpgrade.utcOffset
      durationHours: maintenanceWindows.autoUpgrade.durationHours
    }
  }
}

resource nodeOSUpgradeWindow 'Microsoft.ContainerService/managedClusters/maintenanceConfigurations@2024-09-01' = {
  parent: cluster
  name: 'aksManagedNodeOSUpgradeSchedule'
  properties: {
    maintenanceWindow: {
      schedule: {
        weekly: {
          intervalWeeks: 1
          dayOfWeek: maintenanceWindows.nodeOS.dayOfWeek
        }
      }
      startTime: maintenanceWindows.nodeOS.startTime
      utcOffset: maintenanceWindows.nodeOS.utcOffset
      durationHours: maintenanceWindows.nodeOS.durationHours
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

// ================================================= //
//   Data collection: Prometheus, Container Insights //
// ================================================= //

// Rules and the ingestion endpoint live in the workspaces' region, whichever region the cluster
// is in: managed Prometheus needs its DCE and DCR in the Azure Monitor workspace's region, and a
// rule that sends to Log Analytics sits in the workspace's region. The agents fetch their rules
// through a configuration endpoint in the cluster's own region (the only one an agent may use for
// that). All endpoints are private, reached through the Azure Monitor Private Link Scope.
resource ingestionEndpoint 'Microsoft.Insights/dataCollectionEndpoints@2023-03-11' = {
  name: 'dce-${name}-ingest'
  location: monitoringLocation
  tags: tags
  kind: 'Linux'
  properties: {
    networkAcls: {
      publicNetworkAccess: 'Disabled'
    }
  }
}

resource configEndpoint 'Microsoft.Insights/dataCollectionEndpoints@2023-03-11' = {
  name: 'dce-${name}-config'
  location: location
  tags: tags
  kind: 'Linux'
  properties: {
    networkAcls: {
      publicNetworkAccess: 'Disabled'
    }
  }
}

resource prometheusRule 'Microsoft.Insights/dataCollectionRules@2023-03-11' = {
  name: 'dcr-${name}-prometheus'
  location: monitoringLocation
  tags: tags
  kind: 'Linux'
  properties: {
    dataCollectionEndpointId: ingestionEndpoint.id
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

// Container Insights: the add-on (omsagent) collects what this rule says, into Log Analytics.
resource containerInsightsRule 'Microsoft.Insights/dataCollectionRules@2023-03-11' = {
  name: 'dcr-${name}-container-insights'
  location: monitoringLocation
  tags: tags
  kind: 'Linux'
  properties: {
    dataCollectionEndpointId: ingestionEndpoint.id
    dataSources: {
      extensions: [
        {
          name: 'ContainerInsightsExtension'
          extensionName: 'ContainerInsights'
          streams: [
            'Microsoft-ContainerInsights-Group-Default'
          ]
          extensionSettings: {
            dataCollectionSettings: {
              interval: '1m'
              namespaceFilteringMode: 'Off'
              enableContainerLogV2: true
            }
          }
        }
      ]
    }
    destinations: {
      logAnalytics: [
        {
          name: 'ciworkspace'
          workspaceResourceId: logAnalyticsWorkspaceId
        }
      ]
    }
    dataFlows: [
      {
        streams: [
          'Microsoft-ContainerInsights-Group-Default'
        ]
        destinations: [
          'ciworkspace'
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

resource containerInsightsAssociation 'Microsoft.Insights/dataCollectionRuleAssociations@2023-03-11' = {
  name: 'ContainerInsightsExtension'
  scope: cluster
  properties: {
    dataCollectionRuleId: containerInsightsRule.id
  }
}

// The one endpoint association a cluster has: where its agents fetch their rules.
resource configAssociation 'Microsoft.Insights/dataCollectionRuleAssociations@2023-03-11' = {
  name: 'configurationAccessEndpoint'
  scope: cluster
  properties: {
    dataCollectionEndpointId: configEndpoint.id
  }
}

// Alert rules per cluster, evaluated in the Azure Monitor workspace's region.
resource alertRules 'Microsoft.AlertsManagement/prometheusRuleGroups@2023-03-01' = {
  name: 'prg-${name}-tenantgate'
  location: monitoringLocation
  tags: tags
  properties: {
    clusterName: cluster.name
    scopes: [
      monitorWorkspaceId
      cluster.id
    ]
    enabled: true
    interval: 'PT1M'
    rules: [
      for rule in prometheusAlerts: {
        alert: rule.alert
        enabled: true
        expression: rule.expr
        severity: prometheusAlertSeverity[rule.labels.severity]
        labels: rule.labels
        annotations: rule.annotations
        resolveConfiguration: {
          autoResolved: true
          timeToResolve: 'PT10M'
        }
      }
    ]
  }
}

// ========================= //
//   Kubernetes policies     //
// ========================= //

// Privilege escalation to the node is the one way out of a pod's sandbox; baseline closes it.
resource podSecurityBaseline 'Microsoft.Authorization/policyAssignments@2024-04-01' = {
  name: '${name}-pod-security-baseline'
  scope: cluster
  properties: {
    displayName: 'tenantgate: pod security baseline (${name})'
    policyDefinitionId: kubernetesPolicyDefinitions.podSecurityBaseline
    parameters: {
      effect: {
        value: kubernetesPolicyEffect
      }
      excludedNamespaces: {
        value: kubernetesSystemNamespaces
      }
    }
  }
}

// An image from anywhere else bypasses the registry's import review and vulnerability scans
// (and the firewall would block its pull anyway: this makes the failure explicit at admission).
resource allowedImages 'Microsoft.Authorization/policyAssignments@2024-04-01' = {
  name: '${name}-allowed-images'
  scope: cluster
  properties: {
    displayName: 'tenantgate: images only from the stamp\'s registry (${name})'
    policyDefinitionId: kubernetesPolicyDefinitions.allowedImages
    parameters: {
      effect: {
        value: kubernetesPolicyEffect
      }
      allowedContainerImagesRegex: {
        value: allowedRegistry
      }
      excludedNamespaces: {
        value: imageRuleExcludedNamespaces
      }
    }
  }
}

// A public load balancer would be a second, WAF-less way in beside Front Door.
resource internalLoadBalancers 'Microsoft.Authorization/policyAssignments@2024-04-01' = {
  name: '${name}-internal-load-balancers'
  scope: cluster
  properties: {
    displayName: 'tenantgate: internal load balancers only (${name})'
    policyDefinitionId: kubernetesPolicyDefinitions.internalLoadBalancers
    parameters: {
      effect: {
        value: kubernetesPolicyEffect
      }
      excludedNamespaces: {
        value: kubernetesSystemNamespaces
      }
    }
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

@description('The data collection endpoints (ingestion and configuration), for the Azure Monitor Private Link Scope.')
output dataCollectionEndpoints array = [
  {
    name: 'ingest'
    id: ingestionEndpoint.id
  }
  {
    name: 'config'
    id: configEndpoint.id
  }
]
