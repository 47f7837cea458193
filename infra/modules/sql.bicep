// Azure SQL logical server and database, Entra-only authentication: no SQL logins, no passwords.
// Database users for the managed identities are created afterwards with
// sql/mssql/create_managed_identity_user.sql (see docs/deploy.md).

@description('Azure region.')
param location string

@description('Prefix of every resource name.')
param namePrefix string

@description('Database name.')
param databaseName string

@description('Database SKU, e.g. { name: \'GP_S_Gen5\', tier: \'GeneralPurpose\', family: \'Gen5\', capacity: 1 } (serverless) or { name: \'S0\' }.')
param databaseSku object

@description('Entra admin of the server: display name of the user or group.')
param entraAdminLogin string

@description('Entra admin of the server: object id of the user or group.')
param entraAdminObjectId string

@description('Entra admin principal type.')
@allowed([
  'User'
  'Group'
  'Application'
])
param entraAdminPrincipalType string

@description('Allow connections from Azure services (needed without VNet integration).')
param allowAzureServices bool = true

@description('Tags for every resource.')
param tags object = {}

resource server 'Microsoft.Sql/servers@2023-08-01-preview' = {
  name: '${namePrefix}-sql'
  location: location
  tags: tags
  properties: {
    minimalTlsVersion: '1.2'
    publicNetworkAccess: 'Enabled'
    administrators: {
      administratorType: 'ActiveDirectory'
      login: entraAdminLogin
      sid: entraAdminObjectId
      tenantId: subscription().tenantId
      principalType: entraAdminPrincipalType
      azureADOnlyAuthentication: true
    }
  }
}

// 0.0.0.0 to 0.0.0.0 is Azure's marker for "Azure services": the Container Apps environment
// without a VNet has no fixed egress address to list instead.
resource allowAzure 'Microsoft.Sql/servers/firewallRules@2023-08-01-preview' = if (allowAzureServices) {
  parent: server
  name: 'AllowAllWindowsAzureIps'
  properties: {
    startIpAddress: '0.0.0.0'
    endIpAddress: '0.0.0.0'
  }
}

resource database 'Microsoft.Sql/servers/databases@2023-08-01-preview' = {
  parent: server
  name: databaseName
  location: location
  tags: tags
  sku: databaseSku
  properties: {
    // The default for new Azure SQL databases (case-insensitive). The inbox does not rely on
    // it: its key columns are Latin1_General_100_BIN2 and carry their byte length
    // (sql/mssql/0004_exact_keys.sql), so keys differing in case, width or trailing spaces stay
    // distinct whatever the database collation.
    collation: 'SQL_Latin1_General_CP1_CI_AS'
  }
}

output serverName string = server.name
output serverFqdn string = server.properties.fullyQualifiedDomainName
output databaseName string = database.name
