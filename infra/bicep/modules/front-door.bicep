// Front Door Premium: the one public entry point. A WAF policy in Prevention mode with the managed
// default and bot rule sets guards the endpoint; each stamp's ingress is an origin reached over
// Private Link (the ingress has no public address). With two stamps both origins take traffic
// (active/active) and a failed health probe takes a region out of rotation.

// ============== //
//   Parameters   //
// ============== //

@description('Required. Short name that prefixes every resource.')
param name string

@description('Required. The stamps; those with an `ingress` ({ hostName, privateLinkServiceId }) become origins.')
param stamps array

@description('Required. The Log Analytics workspace for diagnostic settings.')
param logAnalyticsWorkspaceId string

@description('Optional. Tags for every resource.')
param tags object = {}

// ============= //
//   Resources   //
// ============= //

resource profile 'Microsoft.Cdn/profiles@2024-09-01' = {
  name: 'afd-${name}'
  location: 'global'
  tags: tags
  sku: {
    name: 'Premium_AzureFrontDoor'
  }
  properties: {
    // Streams of generated tokens can take a while before the last byte.
    originResponseTimeoutSeconds: 240
  }
}

// The prompt is data for a model, not input to SQL, a shell or a browser, so SQLi/XSS/RCE
// signatures in it are false positives that would block ordinary prompts about code. Only the
// values of the two prompt fields are exempt from DRS: chat `messages` and completions `prompt`
// (StartsWith, so the WAF's names for nested keys such as messages[].content are covered; the
// gateway rejects any other body field, so no other name can match). Every rule still inspects
// headers, URL, query and all other fields. Rule-set wide because DRS has no narrower safe scope
// for it: a rule-group override without a rule list disables the whole group, and per-rule
// overrides would have to list every rule ID of 2.1. docs/deploy.md, "What the WAF inspects".
resource wafPolicy 'Microsoft.Network/FrontDoorWebApplicationFirewallPolicies@2024-02-01' = {
  name: 'waf${name}'
  location: 'global'
  tags: tags
  sku: {
    name: 'Premium_AzureFrontDoor'
  }
  properties: {
    policySettings: {
      enabledState: 'Enabled'
      mode: 'Prevention'
      requestBodyCheck: 'Enabled'
      customBlockResponseStatusCode: 403
    }
    managedRules: {
      managedRuleSets: [
        {
          ruleSetType: 'Microsoft_DefaultRuleSet'
          ruleSetVersion: '2.1'
          ruleSetAction: 'Block'
          // Only the values of the two prompt fields are exempt (see above the policy).
          exclusions: [
            {
              matchVariable: 'RequestBodyJsonArgNames'
              selectorMatchOperator: 'StartsWith'
              selector: 'messages'
            }
            {
              matchVariable: 'RequestBodyJsonArgNames'
              selectorMatchOperator: 'StartsWith'
              selector: 'prompt'
            }
          ]
        }
        {
          ruleSetType: 'Microsoft_BotManagerRuleSet'
          ruleSetVersion: '1.1'
          ruleSetAction: 'Block'
        }
      ]
    }
  }
}

resource endpoint 'Microsoft.Cdn/profiles/afdEndpoints@2024-09-01' = {
  parent: profile
  name: 'fde-${name}'
  location: 'global'
  tags: tags
  properties: {
    enabledState: 'Enabled'
  }
}

resource securityPolicy 'Microsoft.Cdn/profiles/securityPolicies@2024-09-01' = {
  parent: profile
  name: 'waf'
  properties: {
    parameters: {
      type: 'WebApplicationFirewall'
      wafPolicy: {
        id: wafPolicy.id
      }
      associations: [
        {
          domains: [
            {
              id: endpoint.id
            }
          ]
          patternsToMatch: [
            '/*'
          ]
        }
      ]
    }
  }
}

resource originGroup 'Microsoft.Cdn/profiles/originGroups@2024-09-01' = {
  parent: profile
  name: 'tenantgate'
  properties: {
    sessionAffinityState: 'Disabled'
    loadBalancingSettings: {
      sampleSize: 4
      successfulSamplesRequired: 3
      additionalLatencyInMilliseconds: 50
    }
    healthProbeSettings: {
      probePath: '/readyz'
      probeProtocol: 'Https'
      probeRequestType: 'GET'
      probeIntervalInSeconds: 30
    }
  }
}

resource origins 'Microsoft.Cdn/profiles/originGroups/origins@2024-09-01' = [
  for stamp in stamps: if (contains(stamp, 'ingress')) {
    parent: originGroup
    name: 'stamp-${stamp.key}'
    properties: {
      hostName: stamp.ingress.hostName
      originHostHeader: stamp.ingress.hostName
      enforceCertificateNameCheck: true
      httpsPort: 443
      httpPort: 80
      priority: 1
      weight: 500
      enabledState: 'Enabled'
      sharedPrivateLinkResource: {
        privateLink: {
          id: stamp.ingress.privateLinkServiceId
        }
        privateLinkLocation: stamp.location
        requestMessage: 'Front Door ${name} to the ${stamp.key} ingress'
      }
    }
  }
]

// Which stamps have an ingress yet (the origins' condition); the route needs at least one
// origin, as Terraform's `count` on azurerm_cdn_frontdoor_route.
var stampHasIngress = [for stamp in stamps: contains(stamp, 'ingress')]

resource route 'Microsoft.Cdn/profiles/afdEndpoints/routes@2024-09-01' = if (contains(stampHasIngress, true)) {
  parent: endpoint
  name: 'tenantgate'
  properties: {
    originGroup: {
      id: originGroup.id
    }
    supportedProtocols: [
      'Https'
    ]
    patternsToMatch: [
      '/*'
    ]
    forwardingProtocol: 'HttpsOnly'
    httpsRedirect: 'Disabled'
    linkToDefaultDomain: 'Enabled'
    enabledState: 'Enabled'
  }
  dependsOn: [
    origins
    securityPolicy
  ]
}

resource profileDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: profile
  properties: {
    workspaceId: logAnalyticsWorkspaceId
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

@description('The public host name that apps call.')
output endpointHostName string = endpoint.properties.hostName
