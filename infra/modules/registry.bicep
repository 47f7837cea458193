// AcrPull on a container registry for the identities that pull the worker image. Deployed in the
// registry's resource group (main.bicep sets the scope from acrResourceId) and before the app and
// job (main.bicep's dependsOn): Container Apps pulls the image while creating the revision, and
// a role assignment made by the same deployment afterwards comes too late.
// https://learn.microsoft.com/azure/container-apps/managed-identity-image-pull

@description('Name of the container registry, in this deployment\'s resource group.')
param registryName string

@description('Principal ids to grant AcrPull.')
param principalIds array

// AcrPull (built-in): https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/containers#acrpull
var roleAcrPull = '7f951dda-4ed3-4680-a7ca-43fe172d538d'

resource registry 'Microsoft.ContainerRegistry/registries@2023-07-01' existing = {
  name: registryName
}

resource acrPull 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for principalId in principalIds: {
    name: guid(registry.id, principalId, roleAcrPull)
    scope: registry
    properties: {
      principalId: principalId
      principalType: 'ServicePrincipal'
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleAcrPull)
    }
  }
]

output loginServer string = registry.properties.loginServer
