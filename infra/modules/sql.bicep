// Azure SQL logical server and database, Entra-only authentication: no SQL logins, no passwords.
// Database users for the managed identities are created afterwards with
// sql/mssql/create_managed_identity_user.sql (see docs/deploy.md).

@description('Azure region.')
param location string

@description('Prefix of every resource name.')
param namePrefix string

@description('Suffix unique to the resource group: the server name is a global DNS name.')
param uniqueSuffix string

@description('Log Analytics workspace for auditing, diagnostic logs and metrics.')
param workspaceId string

@description('Microsoft Defender for SQL: advanced threat protection and the SQL vulnerability assessment (express configuration).')
param defender bool

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

@description('Allow connections from every Azure service (any tenant): what lets a Container Apps environment without a VNet reach the server. Off with the private network (network.bicep).')
param allowAzureServices bool

@description('Accept connections on the public endpoint; false when the private endpoint carries all traffic.')
param publicNetworkAccess bool

@description('Tags for every resource.')
param tags object = {}

// Lowercase letters, digits and hyphens, 1-63, a global DNS name
// (https://learn.microsoft.com/azure/azure-resource-manager/management/resource-name-rules#microsoftsql).
resource server 'Microsoft.Sql/servers@2023-08-01-preview' = {
  name: toLower('${namePrefix}-sql-${uniqueSuffix}')
  location: location
  tags: tags
  properties: {
    minimalTlsVersion: '1.2'
    publicNetworkAccess: publicNetworkAccess ? 'Enabled' : 'Disabled'
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

// Auditing to Azure Monitor: the events reach the workspace through the master database's
// diagnostic setting (SQLSecurityAuditEvents).
// https://learn.microsoft.com/azure/azure-sql/database/auditing-setup
resource auditing 'Microsoft.Sql/servers/auditingSettings@2023-08-01-preview' = {
  parent: server
  name: 'default'
  properties: {
    state: 'Enabled'
    isAzureMonitorTargetEnabled: true
  }
}

resource master 'Microsoft.Sql/servers/databases@2023-08-01-preview' existing = {
  parent: server
  name: 'master'
}

resource auditDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'audit-to-log-analytics'
  scope: master
  properties: {
    workspaceId: workspaceId
    logs: [
      {
        category: 'SQLSecurityAuditEvents'
        enabled: true
      }
    ]
  }
  dependsOn: [
    auditing
  ]
}

resource threatProtection 'Microsoft.Sql/servers/securityAlertPolicies@2023-08-01-preview' = if (defender) {
  parent: server
  name: 'Default'
  properties: {
    state: 'Enabled'
  }
}

// The SQL vulnerability assessment in its express configuration: scans every database of the
// server, results in Defender for Cloud, no storage account to create or secure.
// https://learn.microsoft.com/azure/templates/microsoft.sql/servers/sqlvulnerabilityassessments
// https://learn.microsoft.com/azure/defender-for-cloud/sql-azure-vulnerability-assessment-overview
resource vulnerabilityAssessment 'Microsoft.Sql/servers/sqlVulnerabilityAssessments@2023-05-01-preview' = if (defender) {
  parent: server
  name: 'default'
  properties: {
    state: 'Enabled'
  }
  dependsOn: [
    threatProtection
  ]
}

resource databaseDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: database
  properties: {
    workspaceId: workspaceId
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

output serverName string = server.name
output serverId string = server.id
output serverFqdn string = server.properties.fullyQualifiedDomainName
output databaseName string = database.name
output databaseId string = database.id
