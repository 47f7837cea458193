// Service Bus: the namespace (Entra only), the consumed entity (a queue, or a topic and one
// subscription), the outbox destination, and the data-plane role assignments.
//
// Roles (built-in, by id):
// - worker: Azure Service Bus Data Receiver on the consumed entity only (receive, renew lock,
//   complete, abandon, dead-letter) and Data Sender on the outbox destination only; with delayed
//   retries also Data Sender on the consumed queue (the scheduled copies go back to it).
// - scaler: the KEDA azure-servicebus scaler reads the entity's runtime properties
//   (ActiveMessageCount) through the Service Bus administration API (GetQueueRuntimeProperties /
//   GetSubscriptionRuntimeProperties, an ATOM call on the namespace endpoint, not Azure Resource
//   Manager). That call needs the Manage right: a SAS policy with Manage, or with Entra the
//   Azure Service Bus Data Owner role. Data Receiver is not enough (the scaler then reports errors
//   and never scales). So the scaler gets its own identity with Data Owner scoped to the consumed
//   entity alone, never the namespace, and the worker's identity stays least-privileged.
//   Sources: docs/deploy.md, "Why the scaler needs more".

@description('Azure region.')
param location string

@description('Prefix of every resource name.')
param namePrefix string

@description('Suffix unique to the resource group: the namespace name is a global DNS name.')
param uniqueSuffix string

@description('Log Analytics workspace for the namespace\'s diagnostic logs and metrics.')
param workspaceId string

@description('Namespace SKU. Basic has no topics and no duplicate detection.')
@allowed([
  'Standard'
  'Premium'
])
param sku string

@description('Messaging units (Premium only).')
param premiumCapacity int = 1

@description('The consumed entity is a queue or a topic subscription.')
@allowed([
  'queue'
  'topic'
])
param entityKind string

@description('Queue name (entityKind queue) or topic name (entityKind topic).')
param entityName string

@description('Subscription name (entityKind topic only).')
param subscriptionName string

@description('Peek-lock duration in seconds (5 to 300).')
@minValue(5)
@maxValue(300)
param lockDurationSecs int

@description('Deliveries before Service Bus dead-letters a message.')
@minValue(1)
param maxDeliveryCount int

@description('Default message time to live in seconds.')
@minValue(60)
param messageTtlSecs int

@description('Duplicate detection history window in seconds (20 s to 7 days).')
@minValue(20)
@maxValue(604800)
param duplicateDetectionWindowSecs int

@description('The outbox destination is a queue or a topic.')
@allowed([
  'queue'
  'topic'
])
param outboxEntityKind string

@description('Name of the outbox destination queue or topic.')
param outboxEntityName string

@description('Subscriptions to create on the outbox topic (outboxEntityKind topic).')
param outboxSubscriptions array = []

@description('Principal id of the worker identity.')
param workerPrincipalId string

@description('Principal id of the KEDA scaler identity.')
param scalerPrincipalId string

@description('Tags for every resource.')
param tags object = {}

@description('The worker schedules delayed-retry copies on the consumed queue, so it needs Data Sender there too.')
param delayedRetries bool = false

@description('The consumed queue or subscription requires sessions (fixed at creation).')
param sessions bool = false

@description('verifyAfterDeploy: create the queues verify and verify-sessions (its scratch entities, empty between runs) and let the worker send to and receive from them.')
param verifyAfterDeploy bool = false

var roleDataReceiver = '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'
var roleDataSender = '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
var roleDataOwner = '090c5cfd-751d-490a-894a-3ce6f1109419'

var isQueue = entityKind == 'queue'
var outboxIsQueue = outboxEntityKind == 'queue'

// 6-50 letters, digits and hyphens, starting with a letter, ending with a letter or digit, and
// not ending in -sb or -mgmt (https://learn.microsoft.com/azure/azure-resource-manager/management/resource-name-rules#microsoftservicebus).
resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: '${namePrefix}-bus-${uniqueSuffix}'
  location: location
  tags: tags
  sku: {
    name: sku
    tier: sku
    capacity: sku == 'Premium' ? premiumCapacity : null
  }
  properties: {
    // Entra (managed identity) only: no SAS keys, so no connection string can leak.
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
  }
}

resource queue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = if (isQueue) {
  parent: namespace
  name: entityName
  properties: {
    lockDuration: 'PT${lockDurationSecs}S'
    maxDeliveryCount: maxDeliveryCount
    defaultMessageTimeToLive: 'PT${messageTtlSecs}S'
    deadLetteringOnMessageExpiration: true
    // Fixed at creation: changing it means a new queue.
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: 'PT${duplicateDetectionWindowSecs}S'
    // Fixed at creation too (SBQueueProperties.requiresSession, Microsoft.ServiceBus 2024-01-01).
    requiresSession: sessions
  }
}

resource topic 'Microsoft.ServiceBus/namespaces/topics@2024-01-01' = if (!isQueue) {
  parent: namespace
  name: entityName
  properties: {
    defaultMessageTimeToLive: 'PT${messageTtlSecs}S'
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: 'PT${duplicateDetectionWindowSecs}S'
  }
}

resource topicSubscription 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2024-01-01' = if (!isQueue) {
  parent: topic
  name: subscriptionName
  properties: {
    lockDuration: 'PT${lockDurationSecs}S'
    maxDeliveryCount: maxDeliveryCount
    defaultMessageTimeToLive: 'PT${messageTtlSecs}S'
    deadLetteringOnMessageExpiration: true
    // SBSubscriptionProperties.requiresSession: fixed at creation.
    requiresSession: sessions
  }
}

resource outboxQueue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = if (outboxIsQueue) {
  parent: namespace
  name: outboxEntityName
  properties: {
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: 'PT${duplicateDetectionWindowSecs}S'
    deadLetteringOnMessageExpiration: true
  }
}

resource outboxTopic 'Microsoft.ServiceBus/namespaces/topics@2024-01-01' = if (!outboxIsQueue) {
  parent: namespace
  name: outboxEntityName
  properties: {
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: 'PT${duplicateDetectionWindowSecs}S'
  }
}

// A topic without subscriptions accepts sends and discards them (the message goes nowhere): the
// relay would mark its rows dispatched and the events would be lost. Each listed subscription
// keeps a copy until its consumer reads it.
// https://learn.microsoft.com/azure/service-bus-messaging/service-bus-queues-topics-subscriptions#topics-and-subscriptions
resource outboxTopicSubscriptions 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2024-01-01' = [
  for name in outboxSubscriptions: if (!outboxIsQueue) {
    parent: outboxTopic
    name: name
    properties: {
      lockDuration: 'PT1M'
      defaultMessageTimeToLive: 'PT${messageTtlSecs}S'
      deadLetteringOnMessageExpiration: true
      maxDeliveryCount: maxDeliveryCount
    }
  }
]

// Worker: receive and settle on the consumed entity only.
resource receiverOnQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (isQueue) {
  name: guid(namespace.id, entityName, workerPrincipalId, roleDataReceiver)
  scope: queue
  properties: {
    principalId: workerPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleDataReceiver)
  }
}

resource receiverOnSubscription 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!isQueue) {
  name: guid(namespace.id, entityName, subscriptionName, workerPrincipalId, roleDataReceiver)
  scope: topicSubscription
  properties: {
    principalId: workerPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleDataReceiver)
  }
}

// Worker with delayed retries: send the scheduled copies to the consumed queue (a subscription
// cannot take them; the worker refuses delayed retries there).
resource senderOnQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (isQueue && delayedRetries) {
  name: guid(namespace.id, entityName, workerPrincipalId, roleDataSender)
  scope: queue
  properties: {
    principalId: workerPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleDataSender)
  }
}

// Worker: send on the outbox destination only.
resource senderOnOutboxQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (outboxIsQueue) {
  name: guid(namespace.id, outboxEntityName, workerPrincipalId, roleDataSender)
  scope: outboxQueue
  properties: {
    principalId: workerPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleDataSender)
  }
}

resource senderOnOutboxTopic 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!outboxIsQueue) {
  name: guid(namespace.id, outboxEntityName, workerPrincipalId, roleDataSender)
  scope: outboxTopic
  properties: {
    principalId: workerPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleDataSender)
  }
}

// KEDA scaler: Data Owner (the Manage right the runtime-properties call needs), scoped to the
// consumed entity. Data Owner also allows send, receive and entity management on that entity,
// which is why it sits on a separate identity that the worker's code does not select.
resource ownerOnQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (isQueue) {
  name: guid(namespace.id, entityName, scalerPrincipalId, roleDataOwner)
  scope: queue
  properties: {
    principalId: scalerPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleDataOwner)
  }
}

resource ownerOnSubscription 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!isQueue) {
  name: guid(namespace.id, entityName, subscriptionName, scalerPrincipalId, roleDataOwner)
  scope: topicSubscription
  properties: {
    principalId: scalerPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleDataOwner)
  }
}

// verifyAfterDeploy: sb-inbox verify's scratch queues. It refuses one holding messages it did not
// send and purges what it sent, so they stay empty between runs. A 5 s lock: its lock-loss
// scenario waits for the redelivery of a lock its stalled child lets run out.
resource verifyQueue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = if (verifyAfterDeploy) {
  parent: namespace
  name: 'verify'
  properties: {
    lockDuration: 'PT5S'
    maxDeliveryCount: 10
    defaultMessageTimeToLive: 'PT1H'
  }
}

resource verifySessionQueue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = if (verifyAfterDeploy) {
  parent: namespace
  name: 'verify-sessions'
  properties: {
    lockDuration: 'PT5S'
    maxDeliveryCount: 10
    defaultMessageTimeToLive: 'PT1H'
    requiresSession: true
  }
}

// The worker's identity runs verify (as it runs in production): send and receive on its two
// queues only, no Manage right (so verify uses them as given entities, not scratch ones it
// would create).
resource verifyRoles 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for role in (verifyAfterDeploy ? [roleDataReceiver, roleDataSender] : []): {
    name: guid(namespace.id, 'verify', workerPrincipalId, role)
    scope: verifyQueue
    properties: {
      principalId: workerPrincipalId
      principalType: 'ServicePrincipal'
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', role)
    }
  }
]

resource verifySessionRoles 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for role in (verifyAfterDeploy ? [roleDataReceiver, roleDataSender] : []): {
    name: guid(namespace.id, 'verify-sessions', workerPrincipalId, role)
    scope: verifySessionQueue
    properties: {
      principalId: workerPrincipalId
      principalType: 'ServicePrincipal'
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', role)
    }
  }
]

resource namespaceDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: namespace
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

output namespaceId string = namespace.id
output namespaceName string = namespace.name
// serviceBusEndpoint is https://NAME.servicebus.windows.net:443/ (another suffix in other clouds).
output namespaceFqdn string = split(replace(namespace.properties.serviceBusEndpoint, 'https://', ''), ':')[0]
@description('The consumed entity path as the worker names it: queue, or topic/Subscriptions/sub.')
output entityPath string = isQueue ? entityName : '${entityName}/Subscriptions/${subscriptionName}'
output outboxEntityName string = outboxEntityName
