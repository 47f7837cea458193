// Alert rules. Platform signals, always created: dead-letter growth and a backlog that stays
// (a dead or stuck worker) on the Service Bus entity, replica restarts of the app, KEDA scaler
// errors in the environment's system logs, SQL workers near the limit (error 10928). The
// worker's OpenTelemetry metrics (lost locks, processing time, end-to-end age, outbox age) only
// when they reach Application Insights (workerMetrics): the Container Apps agent does not send
// metrics there, and rules over absent data never fire. The metric names come from main.bicep parameters, whose defaults tests/infra checks
// against the worker's names module.

@description('Azure region.')
param location string

@description('Prefix of every resource name.')
param namePrefix string

@description('Service Bus namespace resource id.')
param serviceBusNamespaceId string

@description('Container app resource id (replica restarts).')
param containerAppId string

@description('SQL database resource id (workers percentage).')
param sqlDatabaseId string

@description('Log Analytics workspace id (Container Apps system logs).')
param workspaceId string

@description('The worker\'s metrics reach Application Insights: create the alerts on them.')
param workerMetrics bool

@description('Active messages above which, for 15 minutes, the backlog alert fires.')
@minValue(1)
param backlogThreshold int

@description('Oldest outbox row age in seconds above which the outbox alert fires.')
@minValue(1)
param outboxAgeSecs int

@description('Name of the worker\'s oldest-outbox-row age gauge (seconds).')
param outboxAgeMetricName string

@description('SQL workers percentage above which the alert fires.')
param sqlWorkersPercent int

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

resource lockLost 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = if (workerMetrics) {
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
    // Rows arrive 1-4 minutes late (a minute's export interval plus Application Insights
    // ingestion): a 15-minute window at a 5-minute frequency sees each row in some evaluation.
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
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

resource slowProcessing 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = if (workerMetrics) {
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

resource oldMessages 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = if (workerMetrics) {
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

// Only the rules this deployment creates: the worker-metric rules exist with workerMetrics only.
output alertNames array = concat(
  [
    dlqGrowth.name
  ],
  workerMetrics
    ? [
        '${namePrefix}-lock-lost'
        '${namePrefix}-process-duration'
        '${namePrefix}-message-age'
      ]
    : []
)

// Active messages that stay above the threshold for 15 minutes: no replica consumes (crash loop,
// lost credentials, scaler broken) or it cannot keep up at maxReplicas.
resource backlog 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: '${namePrefix}-backlog'
  location: 'global'
  tags: tags
  properties: {
    description: 'More than ${backlogThreshold} active messages on ${entityName} for 15 minutes: is the worker running and ready?'
    severity: 1
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
          name: 'active'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'ActiveMessages'
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
          threshold: backlogThreshold
          timeAggregation: 'Minimum'
        }
      ]
    }
    autoMitigate: true
    actions: actions
  }
}

// Container Apps platform metric RestartCount: liveness failures and crashes.
// https://learn.microsoft.com/azure/container-apps/metrics
resource restarts 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: '${namePrefix}-restarts'
  location: 'global'
  tags: tags
  properties: {
    description: 'Worker replicas restarted: read the console and system logs of the revision.'
    severity: 2
    enabled: true
    scopes: [
      containerAppId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'restarts'
          metricNamespace: 'Microsoft.App/containerApps'
          metricName: 'RestartCount'
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Total'
        }
      ]
    }
    autoMitigate: true
    actions: actions
  }
}

// workers_percent: concurrent requests against the service objective's limit; at 100 new
// requests fail with error 10928. https://learn.microsoft.com/azure/azure-sql/database/resource-limits-logical-server
resource sqlWorkers 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: '${namePrefix}-sql-workers'
  location: 'global'
  tags: tags
  properties: {
    description: 'SQL workers above ${sqlWorkersPercent}%: lower maxReplicas x concurrency or raise the database SKU.'
    severity: 2
    enabled: true
    scopes: [
      sqlDatabaseId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'workers'
          metricNamespace: 'Microsoft.Sql/servers/databases'
          metricName: 'workers_percent'
          operator: 'GreaterThan'
          threshold: sqlWorkersPercent
          timeAggregation: 'Maximum'
        }
      ]
    }
    autoMitigate: true
    actions: actions
  }
}

// KEDA reports scaler failures (e.g. missing Manage right, wrong namespace) as system log events
// of the environment: EventSource KEDA, Type Warning (KEDAScalerFailed is a Warning event,
// https://keda.sh/docs/latest/reference/events). The environment's diagnostic setting writes
// them to the resource-specific table ContainerAppSystemLogs (columns EventSource, Type, Reason,
// Log: https://learn.microsoft.com/azure/azure-monitor/reference/tables/containerappsystemlogs).
// That table exists only once the first event arrived, so on a new workspace the query cannot be
// validated when the rule is created (SEM0100, and union isfuzzy does not help when no table
// resolves): skipQueryValidation creates the rule anyway
// (ScheduledQueryRuleProperties.skipQueryValidation, Microsoft.Insights 2023-03-15-preview).
resource scalerErrors 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = {
  name: '${namePrefix}-scaler-errors'
  location: location
  tags: tags
  properties: {
    description: 'The KEDA azure-servicebus scaler reports errors: the app will not scale. Check the scaler identity\'s role on the entity.'
    severity: 2
    enabled: true
    skipQueryValidation: true
    scopes: [
      workspaceId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    criteria: {
      allOf: [
        {
          query: 'ContainerAppSystemLogs | where EventSource =~ "KEDA" and Type =~ "Warning" | summarize errors = count()'
          timeAggregation: 'Total'
          metricMeasureColumn: 'errors'
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

resource outboxAge 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = if (workerMetrics) {
  name: '${namePrefix}-outbox-age'
  location: location
  tags: tags
  properties: {
    description: 'Outbox rows wait longer than ${outboxAgeSecs} s: the relay cannot publish (rights on the destination, broker errors).'
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
          query: 'customMetrics | where name == "${outboxAgeMetricName}" | summarize age = max(valueMax)'
          timeAggregation: 'Maximum'
          metricMeasureColumn: 'age'
          operator: 'GreaterThan'
          threshold: outboxAgeSecs
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
