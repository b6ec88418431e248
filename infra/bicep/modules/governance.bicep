// Governance on the subscription beside main.bicep's guardrails: deny policies on the data
// stores' network and local auth, and the Defender for Containers plan.
targetScope = 'subscription'

// ============== //
//   Parameters   //
// ============== //

@description('Required. Short name that prefixes every resource.')
param name string

// ============= //
//   Variables   //
// ============= //

// The landing zone's own Storage and Redis already comply; these keep anything added to the
// subscription later to the same rules. Built-ins from Azure/azure-policy
// (built-in-policies/policyDefinitions/...); the Redis ones cover Azure Cache for Redis
// (Microsoft.Cache/Redis). Azure Managed Redis (redisEnterprise) has no built-in for either yet,
// so two custom definitions below cover it.
var denyPolicies = [
  {
    // Storage/StoragePublicNetworkAccess_AuditDeny.json
    key: 'storage-no-public-access'
    id: '/providers/Microsoft.Authorization/policyDefinitions/b2982f36-99f2-4db5-8eff-283140c09693'
  }
  {
    // Storage/StorageAccountAllowSharedKeyAccess_Audit.json (Audit, Deny or Disabled)
    key: 'storage-no-shared-key'
    id: '/providers/Microsoft.Authorization/policyDefinitions/8c6a50c6-9ffd-4ae7-986f-5fa6111f9a54'
  }
  {
    // Cache/RedisCache_PublicNetworkAccess_AuditDeny.json
    key: 'redis-no-public-access'
    id: '/providers/Microsoft.Authorization/policyDefinitions/470baccb-7e51-4549-8b1a-3e5be069f663'
  }
  {
    // Cache/RedisCache_DisableAccessKeysAuth_Audit.json (Audit, Deny or Disabled)
    key: 'redis-no-access-keys'
    id: '/providers/Microsoft.Authorization/policyDefinitions/3827af20-8f80-4b15-8300-6db0873ec901'
  }
]

// Azure Managed Redis: the property paths of Microsoft.Cache/redisEnterprise as aliases (check
// with `az provider show -n Microsoft.Cache --expand resourceTypes/aliases`).
var managedRedisDenyRules = [
  {
    key: 'managed-redis-no-public-access'
    displayName: 'Azure Managed Redis should disable public network access'
    rule: {
      if: {
        allOf: [
          {
            field: 'type'
            equals: 'Microsoft.Cache/redisEnterprise'
          }
          {
            field: 'Microsoft.Cache/redisEnterprise/publicNetworkAccess'
            notEquals: 'Disabled'
          }
        ]
      }
      then: {
        effect: 'Deny'
      }
    }
  }
  {
    key: 'managed-redis-no-access-keys'
    displayName: 'Azure Managed Redis databases should not use access keys'
    rule: {
      if: {
        allOf: [
          {
            field: 'type'
            equals: 'Microsoft.Cache/redisEnterprise/databases'
          }
          {
            field: 'Microsoft.Cache/redisEnterprise/databases/accessKeysAuthentication'
            notEquals: 'Disabled'
          }
        ]
      }
      then: {
        effect: 'Deny'
      }
    }
  }
]

// ================= //
//   Deny policies   //
// ================= //

resource denyAssignments 'Microsoft.Authorization/policyAssignments@2024-04-01' = [
  for policy in denyPolicies: {
    name: '${name}-${policy.key}'
    properties: {
      displayName: 'tenantgate: deny ${replace(policy.key, '-', ' ')}'
      policyDefinitionId: policy.id
      parameters: {
        effect: {
          value: 'Deny'
        }
      }
    }
  }
]

resource managedRedisDefinitions 'Microsoft.Authorization/policyDefinitions@2023-04-01' = [
  for policy in managedRedisDenyRules: {
    name: '${name}-${policy.key}'
    properties: {
      displayName: 'tenantgate: ${policy.displayName}'
      policyType: 'Custom'
      // All, not Indexed: databases carry no tags or location, which Indexed mode requires.
      mode: 'All'
      metadata: {
        category: 'Cache'
      }
      policyRule: policy.rule
    }
  }
]

resource managedRedisAssignments 'Microsoft.Authorization/policyAssignments@2024-04-01' = [
  for (policy, i) in managedRedisDenyRules: {
    name: '${name}-${policy.key}'
    properties: {
      displayName: 'tenantgate: ${policy.displayName}'
      policyDefinitionId: managedRedisDefinitions[i].id
    }
  }
]

// ============================ //
//   Defender for Containers    //
// ============================ //

// The plan on the subscription (this deployment has subscription scope, so it owns the
// subscription's plan too). The AKS securityProfile.defender only deploys the sensor; without
// the plan nothing scans or alerts.
resource containersPlan 'Microsoft.Security/pricings@2024-01-01' = {
  // checkov:skip=CKV_AZURE_87:this is the Containers plan, not Key Vault's; the Bicep check reads every pricings resource as the Key Vault plan (its Terraform twin checks resource_type and passes)
  name: 'Containers'
  properties: {
    pricingTier: 'Standard'
  }
}
