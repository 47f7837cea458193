// sb-inbox on Azure: Service Bus (Entra only), Azure SQL (Entra only), Container Apps with a
// KEDA azure-servicebus scale rule, managed identities, Log Analytics, Application Insights,
// OpenTelemetry and alert rules. Deploy with:
//   az deployment group create -g RG -f infra/main.bicep -p infra/main.parameters.json
// No secret is a parameter or a literal: every service authenticates with Entra.

targetScope = 'resourceGroup'

// ---- Naming and image ----

@description('Prefix of every resource name (lowercase letters, digits, hyphens).')
@minLength(3)
@maxLength(20)
param namePrefix string

@description('Azure region.')
param location string = resourceGroup().location

@description('Worker container image, e.g. myregistry.azurecr.io/sb-inbox:1.2.3.')
param image string

@description('Registry to pull the image from with the worker identity (grant it AcrPull), or empty for a public image.')
param registryServer string = ''

@description('Arguments after the sb-inbox entrypoint.')
param workerArgs array = [
  'run'
]

@description('Tags for every resource.')
param tags object = {}

// ---- Service Bus ----

@description('Service Bus namespace SKU.')
@allowed([
  'Standard'
  'Premium'
])
param serviceBusSku string = 'Standard'

@description('The consumed entity: a queue, or a topic with one subscription.')
@allowed([
  'queue'
  'topic'
])
param entityKind string = 'queue'

@description('Queue name (entityKind queue) or topic name (entityKind topic).')
param entityName string = 'orders-order-placed'

@description('Subscription name (entityKind topic only).')
param subscriptionName string = 'inventory'

@description('The outbox destination: a queue or a topic.')
@allowed([
  'queue'
  'topic'
])
param outboxEntityKind string = 'topic'

@description('Outbox destination name.')
param outboxEntityName string = 'inventory-events'

@description('Peek-lock duration in seconds.')
@minValue(5)
@maxValue(300)
param lockDurationSecs int = 60

@description('Deliveries before Service Bus dead-letters a message.')
@minValue(1)
@maxValue(2000)
param maxDeliveryCount int = 10

@description('Default message time to live in seconds (expired messages are dead-lettered).')
@minValue(60)
param messageTtlSecs int = 1209600

@description('Broker duplicate detection window in seconds (producer-side; not a substitute for the inbox).')
@minValue(20)
@maxValue(604800)
param duplicateDetectionWindowSecs int = 600

@description('How long after dead-lettering a message may still be resubmitted (sb-inbox dlq resubmit), in seconds.')
@minValue(0)
param dlqResubmitWindowSecs int = 604800

@description('How long inbox rows are kept, in seconds. Must cover the replay horizon (see replayHorizonSecs).')
@minValue(1)
param retentionSecs int = 2592000

// ---- Worker ----

@description('Stable consumer name: part of the inbox key. Renaming it replays retained messages.')
param consumerName string = 'inventory.order-placed.v1'

@description('Messages handled at once per replica.')
@minValue(1)
param concurrency int = 16

@description('Messages prefetched per replica.')
@minValue(0)
param prefetch int = 32

@description('Renew a lock this many seconds before it expires.')
@minValue(1)
param lockMarginSecs int = 10

@description('Longest a delivery is handled before it is cancelled, rolled back and abandoned (like the SDKs\' maximum auto-lock-renewal duration).')
@minValue(1)
param maxProcessingSecs int = 300

@description('Outbox rows the relay claims per pass.')
@minValue(1)
@maxValue(1000)
param outboxBatchSize int = 100

@description('Relay poll interval in milliseconds while the outbox has nothing due.')
@minValue(10)
@maxValue(60000)
param outboxPollIntervalMs int = 500

@description('Seconds a relay claim reserves its rows; after a crash, rows are published again (same message id) once it ends.')
@minValue(5)
@maxValue(3600)
param outboxLeaseSecs int = 60

@description('Inbox rows deleted per retention statement (at most 4000: below SQL Server lock escalation).')
@minValue(1)
@maxValue(4000)
param retentionBatchSize int = 1000

@description('Seconds between retention sweeps.')
@minValue(1)
@maxValue(86400)
param retentionIntervalSecs int = 300

@description('Seconds the worker drains in-flight messages after SIGTERM (the app\'s termination grace is this + 10, at most 600).')
@minValue(1)
@maxValue(590)
param shutdownGraceSecs int = 30

@description('Port of /healthz and /readyz.')
param healthPort int = 8080

@description('Delayed retries of a transient failure (a copy scheduled for later, the original completed) before dead-lettering with RetriesExhausted; 0 = abandon for an immediate redelivery. Needs entityKind queue: the worker refuses delayed retries on a subscription.')
@minValue(0)
@maxValue(100)
param retryMaxRetries int = 0

@description('Seconds the first delayed retry waits; each next one waits twice as long.')
@minValue(1)
param retryBaseDelaySecs int = 10

@description('Longest delayed-retry wait in seconds.')
@minValue(1)
param retryMaxDelaySecs int = 600

@description('Each delayed-retry wait is shortened by up to this percentage, so failures of one burst do not come back as one burst.')
@minValue(0)
@maxValue(100)
param retryJitterPercent int = 20

@description('Minimum replicas (0 lets KEDA scale to zero).')
@minValue(0)
param minReplicas int = 1

@description('Maximum replicas.')
@minValue(1)
param maxReplicas int = 10

@description('Active messages per replica that KEDA aims for.')
@minValue(1)
param scaleMessageCount int = 50

// ---- Azure SQL ----

@description('SQL server Entra admin: display name of the user or group.')
param sqlEntraAdminLogin string

@description('SQL server Entra admin: object id of the user or group.')
param sqlEntraAdminObjectId string

@description('SQL server Entra admin principal type.')
@allowed([
  'User'
  'Group'
  'Application'
])
param sqlEntraAdminPrincipalType string = 'Group'

@description('Database name.')
param sqlDatabaseName string = 'sbinbox'

@description('Database SKU (default: General Purpose serverless, 1 vCore max).')
param sqlDatabaseSku object = {
  name: 'GP_S_Gen5'
  tier: 'GeneralPurpose'
  family: 'Gen5'
  capacity: 1
}

// ---- Telemetry and alerts ----

@description('OTLP endpoint the worker exports to directly; empty = the Container Apps managed OpenTelemetry agent (traces and logs to Application Insights).')
param otlpEndpoint string = ''

@description('With the managed agent: OTLP endpoint (e.g. a collector with the Azure Monitor exporter) that receives metrics; empty = no metrics destination.')
param agentMetricsOtlpEndpoint string = ''

@description('Action group for the alerts, or empty.')
param alertActionGroupId string = ''

@description('Dead-lettered messages above which the DLQ alert fires.')
@minValue(0)
param dlqAlertThreshold int = 0

@description('The worker\'s lock-lost counter (OpenTelemetry name).')
param lockLostMetricName string = 'sb_inbox.lock.lost'

@description('The worker\'s processing duration histogram in seconds (OpenTelemetry messaging semantic conventions).')
param processDurationMetricName string = 'messaging.process.duration'

@description('Processing duration target in seconds.')
@minValue(1)
param processDurationTargetSecs int = 30

@description('The worker\'s end-to-end age histogram in seconds (enqueue to settlement).')
param messageAgeMetricName string = 'sb_inbox.message.age'

@description('End-to-end age target in seconds: older messages mean the consumer is falling behind.')
@minValue(1)
param messageAgeTargetSecs int = 300

// The longest time after which the same message id can still arrive: it may wait its whole TTL,
// then each delivery can hold the lock, delayed retries can put copies of it (same logical id)
// on the queue later still, then it can sit in the DLQ until resubmitted. Inbox rows must live
// longer, or a replay is processed twice. The worker refuses to start otherwise.
var replayHorizonSecs = messageTtlSecs + (lockDurationSecs * maxDeliveryCount) + (retryMaxRetries * retryMaxDelaySecs) + dlqResubmitWindowSecs

module identities 'modules/identity.bicep' = {
  name: 'identities'
  params: {
    location: location
    namePrefix: namePrefix
    tags: tags
  }
}

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  params: {
    location: location
    namePrefix: namePrefix
    workbook: loadTextContent('dashboards/sb-inbox.workbook.json')
    tags: tags
  }
}

module serviceBus 'modules/servicebus.bicep' = {
  name: 'servicebus'
  params: {
    location: location
    namePrefix: namePrefix
    sku: serviceBusSku
    entityKind: entityKind
    entityName: entityName
    subscriptionName: subscriptionName
    lockDurationSecs: lockDurationSecs
    maxDeliveryCount: maxDeliveryCount
    messageTtlSecs: messageTtlSecs
    duplicateDetectionWindowSecs: duplicateDetectionWindowSecs
    outboxEntityKind: outboxEntityKind
    outboxEntityName: outboxEntityName
    workerPrincipalId: identities.outputs.workerPrincipalId
    scalerPrincipalId: identities.outputs.scalerPrincipalId
    delayedRetries: retryMaxRetries > 0
    tags: tags
  }
}

module sql 'modules/sql.bicep' = {
  name: 'sql'
  params: {
    location: location
    namePrefix: namePrefix
    databaseName: sqlDatabaseName
    databaseSku: sqlDatabaseSku
    entraAdminLogin: sqlEntraAdminLogin
    entraAdminObjectId: sqlEntraAdminObjectId
    entraAdminPrincipalType: sqlEntraAdminPrincipalType
    tags: tags
  }
}

// ADO.NET form; Active Directory Default picks the identity named by AZURE_CLIENT_ID.
var store = 'Server=tcp:${sql.outputs.serverFqdn},1433;Database=${sql.outputs.databaseName};Encrypt=True;Authentication=Active Directory Default'

module app 'modules/containerapp.bicep' = {
  name: 'containerapp'
  params: {
    location: location
    namePrefix: namePrefix
    image: image
    registryServer: registryServer
    workerArgs: workerArgs
    workspaceId: monitoring.outputs.workspaceId
    appInsightsId: monitoring.outputs.appInsightsId
    otlpEndpoint: otlpEndpoint
    agentMetricsOtlpEndpoint: agentMetricsOtlpEndpoint
    workerIdentityId: identities.outputs.workerId
    workerClientId: identities.outputs.workerClientId
    scalerIdentityId: identities.outputs.scalerId
    migrateIdentityId: identities.outputs.migrateId
    migrateClientId: identities.outputs.migrateClientId
    serviceBusNamespaceName: serviceBus.outputs.namespaceName
    serviceBusNamespaceFqdn: serviceBus.outputs.namespaceFqdn
    entityKind: entityKind
    entityName: entityName
    subscriptionName: subscriptionName
    entityPath: serviceBus.outputs.entityPath
    outboxEntityName: outboxEntityName
    store: store
    worker: {
      consumer: consumerName
      concurrency: concurrency
      prefetch: prefetch
      lockMarginSecs: lockMarginSecs
      maxProcessingSecs: maxProcessingSecs
      shutdownGraceSecs: shutdownGraceSecs
      healthPort: healthPort
      lockDurationSecs: lockDurationSecs
      maxDeliveryCount: maxDeliveryCount
      messageTtlSecs: messageTtlSecs
      dlqResubmitWindowSecs: dlqResubmitWindowSecs
      retentionSecs: retentionSecs
      retryMaxRetries: retryMaxRetries
      retryBaseDelaySecs: retryBaseDelaySecs
      retryMaxDelaySecs: retryMaxDelaySecs
      retryJitterPercent: retryJitterPercent
      retentionBatchSize: retentionBatchSize
      retentionIntervalSecs: retentionIntervalSecs
      outboxBatchSize: outboxBatchSize
      outboxPollIntervalMs: outboxPollIntervalMs
      outboxLeaseSecs: outboxLeaseSecs
    }
    minReplicas: minReplicas
    maxReplicas: maxReplicas
    scaleMessageCount: scaleMessageCount
    tags: tags
  }
}

module alerts 'modules/alerts.bicep' = {
  name: 'alerts'
  params: {
    location: location
    namePrefix: namePrefix
    serviceBusNamespaceId: serviceBus.outputs.namespaceId
    entityName: entityName
    appInsightsId: monitoring.outputs.appInsightsId
    actionGroupId: alertActionGroupId
    dlqThreshold: dlqAlertThreshold
    lockLostMetricName: lockLostMetricName
    processDurationMetricName: processDurationMetricName
    processDurationTargetSecs: processDurationTargetSecs
    messageAgeMetricName: messageAgeMetricName
    messageAgeTargetSecs: messageAgeTargetSecs
    tags: tags
  }
}

@description('Service Bus namespace FQDN (SB_INBOX_SERVICEBUS_NAMESPACE).')
output serviceBusNamespaceFqdn string = serviceBus.outputs.namespaceFqdn

@description('Consumed entity path (SB_INBOX_ENTITY).')
output entity string = serviceBus.outputs.entityPath

@description('Outbox destination (SB_INBOX_OUTBOX_DESTINATION).')
output outboxDestination string = serviceBus.outputs.outboxEntityName

@description('Azure SQL server FQDN.')
output sqlServerFqdn string = sql.outputs.serverFqdn

@description('Azure SQL database name.')
output sqlDatabaseName string = sql.outputs.databaseName

@description('Container app name of the worker.')
output appName string = app.outputs.appName

@description('Manual migration job name.')
output migrateJobName string = app.outputs.migrateJobName

@description('Worker identity name: the database user to create (IdentityName).')
output workerIdentityName string = identities.outputs.workerName

@description('Worker identity client id (AZURE_CLIENT_ID).')
output workerIdentityClientId string = identities.outputs.workerClientId

@description('Migration identity name: the database user allowed DDL.')
output migrateIdentityName string = identities.outputs.migrateName

@description('Replay horizon in seconds: TTL + lock duration x max delivery count + delayed retries x their longest wait + DLQ resubmit window.')
output replayHorizonSecs int = replayHorizonSecs

@description('True when inbox retention covers the replay horizon; the worker refuses to start otherwise.')
output retentionCoversReplayHorizon bool = retentionSecs >= replayHorizonSecs
