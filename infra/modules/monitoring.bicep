// Log Analytics workspace and a workspace-based Application Insights component.

@description('Azure region.')
param location string

@description('Prefix of every resource name.')
param namePrefix string

@description('Days Log Analytics keeps data.')
@minValue(30)
@maxValue(730)
param logRetentionDays int = 30

@description('Tags for every resource.')
param tags object = {}

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: '${namePrefix}-logs'
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: logRetentionDays
  }
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: '${namePrefix}-ai'
  location: location
  tags: tags
  kind: 'other'
  properties: {
    Application_Type: 'other'
    WorkspaceResourceId: workspace.id
    // The Container Apps OpenTelemetry agent ingests with the connection string (instrumentation
    // key, an identifier rather than a credential), so key-based ingestion stays enabled.
    DisableLocalAuth: false
  }
}

output workspaceId string = workspace.id
output appInsightsId string = appInsights.id
output appInsightsName string = appInsights.name
