// User-assigned managed identities. Three identities so that each holds only what its job needs:
// the worker (receive, send to the outbox, read/write rows), the KEDA scaler (read message counts,
// which needs more than the worker has; see servicebus.bicep) and the migration job (DDL).

@description('Azure region.')
param location string

@description('Prefix of every resource name.')
param namePrefix string

@description('Tags for every resource.')
param tags object = {}

resource worker 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: '${namePrefix}-worker'
  location: location
  tags: tags
}

resource scaler 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: '${namePrefix}-scaler'
  location: location
  tags: tags
}

resource migrate 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: '${namePrefix}-migrate'
  location: location
  tags: tags
}

output workerId string = worker.id
output workerName string = worker.name
output workerClientId string = worker.properties.clientId
output workerPrincipalId string = worker.properties.principalId
output scalerId string = scaler.id
output scalerPrincipalId string = scaler.properties.principalId
output migrateId string = migrate.id
output migrateName string = migrate.name
output migrateClientId string = migrate.properties.clientId
output migratePrincipalId string = migrate.properties.principalId
