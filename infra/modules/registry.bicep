// Image pull rights on a container registry for the identities that pull the worker image.
// Deployed in the registry's resource group (main.bicep sets the scope from acrResourceId) and
// before the app and job (main.bicep's dependsOn): Container Apps pulls the image while creating
// the revision, and a role assignment made by the same deployment afterwards comes too late.
// https://learn.microsoft.com/azure/container-apps/managed-identity-image-pull
//
// The role depends on the registry's role assignment permissions mode: "Legacy ACR roles such as
// AcrPull, AcrPush, and AcrDelete are not honored in ABAC-enabled registries", and ABAC will
// become the default mode
// (https://learn.microsoft.com/azure/container-registry/container-registry-rbac-abac-repository-permissions).
// An ABAC registry (roleAssignmentMode AbacRepositoryPermissions) gets Container Registry
// Repository Reader, any other AcrPull. Assigning a role needs Owner or Role Based Access
// Control Administrator on the registry (docs/deploy.md, "Who deploys").

@description('Name of the container registry, in this deployment\'s resource group.')
param registryName string

@description('Principal ids to grant image pull.')
param principalIds array

// Built-in role ids: https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/containers
// AcrPull: https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/containers#acrpull
var roleAcrPull = '7f951dda-4ed3-4680-a7ca-43fe172d538d'
// Container Registry Repository Reader (ABAC-enabled registries):
// https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/containers#container-registry-repository-reader
var roleRepositoryReader = 'b93aa761-3e63-49ed-ac28-beffa264f7ac'

// roleAssignmentMode is in the registry API from 2025-04-01; safe access keeps a registry whose
// answer lacks it on the legacy role.
resource registry 'Microsoft.ContainerRegistry/registries@2025-04-01' existing = {
  name: registryName
}

var abac = (registry.properties.?roleAssignmentMode ?? 'LegacyRegistryPermissions') == 'AbacRepositoryPermissions'

// The name stays the one the AcrPull assignment always had: a second name for the same role,
// principal and scope would fail with RoleAssignmentExists on redeployment.
resource imagePull 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for principalId in principalIds: {
    name: guid(registry.id, principalId, roleAcrPull)
    scope: registry
    properties: {
      principalId: principalId
      principalType: 'ServicePrincipal'
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', abac ? roleRepositoryReader : roleAcrPull)
    }
  }
]

@description('The registry\'s real login server (a registry with a domain name label has another host than NAME.azurecr.io).')
output loginServer string = registry.properties.loginServer

@description('The registry\'s role assignment permissions mode, as read.')
output roleAssignmentMode string = registry.properties.?roleAssignmentMode ?? 'LegacyRegistryPermissions'
