// Alert rules: dead-letter growth (Service Bus platform metric), any lost lock, processing time
// and end-to-end message age above target (the worker's OpenTelemetry metrics in Application
// Insights). The metric names come from main.bicep parameters, whose defaults tests/infra checks
// against the worker's names module.

@description('Azure region.')
param location string

@description('Prefix of every resource name.')
param namePrefix string

@description('Service Bus namespace resource id.')
param serviceBusNamespaceId string

@description('Queue or topic name: the EntityName dimension of the Service Bus metrics.')
param entityName string

@description('Application Insights resource id.')
param appInsightsId string

@description('Action group resource id, or empty for alerts without notifications.')
param actionGroupId string

@description('Dead-lettered messages on the entity above which the alert fires.')
@minValue(0)
param dlqThreshold int

@description('Name of the worker\'s lock-lost counter.')
param lockLostMetricName string

@description('Name of the worker\'s processing duration histogram (seconds).')
param processDurationMetricName string

@description('Processing duration target in seconds; the alert fires when the maximum exceeds it.')
@minValue(1)
param processDurationTargetSecs int

@description('Name of the worker\'s end-to-end age histogram (seconds, enqueue to settlement).')
param messageAgeMetricName string

@description('End-to-end age target in seconds; the alert fires when the maximum exceeds it.')
@minValue(1)
param messageAgeTargetSecs int

@description('Tags for every resource.')
param tags object = {}

var actions = empty(actionGroupId)
  ? []
  : [
      {
        actionGroupId: actionGroupId
      }
    ]

resource dlqGrowth 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: '${namePrefix}-dlq-growth'
  location: 'global'
  tags: tags
  properties: {
    description: 'Dead-lettered messages on ${entityName} above ${dlqThreshold}: inspect with sb-inbox dlq peek.'
    severity: 2
    enabled: true
    scopes: [
      serviceBusNamespaceId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'deadlettered'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'DeadletteredMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                entityName
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: dlqThreshold
          timeAggregation: 'Maximum'
        }
      ]
    }
    autoMitigate: true
    actions: actions
  }
}

resource lockLost 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = {
  name: '${namePrefix}-lock-lost'
  location: location
  tags: tags
  properties: {
    description: 'A message lock was lost: handler slower than lock renewal, or renewals failing.'
    severity: 2
    enabled: true
    scopes: [
      appInsightsId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    criteria: {
      allOf: [
        {
          query: 'customMetrics | where name == "${lockLostMetricName}" | summarize lost = sum(valueSum)'
          timeAggregation: 'Total'
          metricMeasureColumn: 'lost'
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: true
    actions: {
      actionGroups: empty(actionGroupId) ? [] : [
        actionGroupId
      ]
    }
  }
}

resource slowProcessing 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = {
  name: '${namePrefix}-process-duration'
  location: location
  tags: tags
  properties: {
    description: 'Processing time above ${processDurationTargetSecs} s: messages age in the queue.'
    severity: 3
    enabled: true
    scopes: [
      appInsightsId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    criteria: {
      allOf: [
        {
          query: 'customMetrics | where name == "${processDurationMetricName}" | summarize slowest = max(valueMax)'
          timeAggregation: 'Maximum'
          metricMeasureColumn: 'slowest'
          operator: 'GreaterThan'
          threshold: processDurationTargetSecs
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: true
    actions: {
      actionGroups: empty(actionGroupId) ? [] : [
        actionGroupId
      ]
    }
  }
}

resource oldMessages 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = {
  name: '${namePrefix}-message-age'
  location: location
  tags: tags
  properties: {
    description: 'Messages settled more than ${messageAgeTargetSecs} s after they were enqueued: the consumer is falling behind.'
    severity: 2
    enabled: true
    scopes: [
      appInsightsId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    criteria: {
      allOf: [
        {
          query: 'customMetrics | where name == "${messageAgeMetricName}" | summarize oldest = max(valueMax)'
          timeAggregation: 'Maximum'
          metricMeasureColumn: 'oldest'
          operator: 'GreaterThan'
          threshold: messageAgeTargetSecs
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: true
    actions: {
      actionGroups: empty(actionGroupId) ? [] : [
        actionGroupId
      ]
    }
  }
}

output alertNames array = [
  dlqGrowth.name
  lockLost.name
  slowProcessing.name
  oldMessages.name
]
