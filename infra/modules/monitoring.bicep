// Log Analytics workspace, a workspace-based Application Insights component and the sb-inbox
// workbook (infra/dashboards/sb-inbox.workbook.json) over it.

@description('Azure region.')
param location string

@description('Prefix of every resource name.')
param namePrefix string

@description('Days Log Analytics keeps data.')
@minValue(30)
@maxValue(730)
param logRetentionDays int = 30

@description('Serialized Azure Monitor workbook (infra/dashboards/sb-inbox.workbook.json).')
param workbook string

@description('Service Bus namespace resource id: the workbook\'s platform-metric panels (active and dead-lettered messages).')
param serviceBusNamespaceId string

@description('Worker container app resource id: the workbook\'s platform-metric panels (replicas, restarts).')
param containerAppId string

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
    // Entra only: queries and ingestion APIs refuse the workspace keys.
    features: {
      disableLocalAuth: true
    }
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

resource dashboard 'Microsoft.Insights/workbooks@2023-06-01' = {
  name: guid(resourceGroup().id, namePrefix, 'sb-inbox-workbook')
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: '${namePrefix} sb-inbox'
    category: 'workbook'
    // The platform-metric panels name their resources by placeholder: the workbook file stays
    // one JSON document for every deployment.
    serializedData: replace(replace(replace(workbook, '__SERVICEBUS_NAMESPACE_ID__', serviceBusNamespaceId), '__CONTAINER_APP_ID__', containerAppId), '__APP_INSIGHTS_ID__', appInsights.id)
    sourceId: appInsights.id
  }
}

output workspaceId string = workspace.id
output appInsightsId string = appInsights.id
output appInsightsName string = appInsights.name
