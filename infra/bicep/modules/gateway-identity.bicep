// The gateway's workload identity: a user-assigned identity federated with the gateway's
// Kubernetes service account. It reads the namespace secret from Key Vault, signs in to Redis and
// downloads the signed policy bundle; no secret for any of it exists anywhere.

// ============== //
//   Parameters   //
// ============== //

@description('Required. Prefix for the stamp\'s resources (`<name>-<stamp>`).')
param name string

@description('Required. Region of the identity.')
param location string

@description('Required. The cluster\'s OIDC issuer URL.')
param oidcIssuerUrl string

@description('Required. The gateway\'s Kubernetes service account: `namespace`, `name`.')
param gatewayServiceAccount object

@description('Optional. Tags for every resource.')
param tags object = {}

// ============= //
//   Resources   //
// ============= //

resource gateway 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: 'id-${name}-gateway'
  location: location
  tags: tags
}

resource federatedCredential 'Microsoft.ManagedIdentity/userAssignedIdentities/federatedIdentityCredentials@2023-01-31' = {
  parent: gateway
  name: 'aks-gateway'
  properties: {
    issuer: oidcIssuerUrl
    subject: 'system:serviceaccount:${gatewayServiceAccount.namespace}:${gatewayServiceAccount.name}'
    audiences: [
      'api://AzureADTokenExchange'
    ]
  }
}

// =========== //
//   Outputs   //
// =========== //

@description('The identity\'s principal ID (for role and access policy assignments).')
output principalId string = gateway.properties.principalId

@description('The identity\'s client ID (the service account\'s azure.workload.identity/client-id annotation).')
output clientId string = gateway.properties.clientId
