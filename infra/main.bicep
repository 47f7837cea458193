// sb-inbox on Azure: Service Bus (Entra only), Azure SQL (Entra only), Container Apps with a
// KEDA azure-servicebus scale rule, managed identities, Log Analytics, Application Insights,
// OpenTelemetry and alert rules. Deploy with:
//   az deployment group create -g RG -f infra/main.bicep -p infra/main.parameters.json
// No secret is a parameter or a literal: every service authenticates with Entra.

targetScope = 'resourceGroup'

// ---- Naming and image ----

@description('Prefix of every resource name: letters, digits and hyphens, starting with a letter; lowered before use (Container Apps and SQL server names allow lowercase only). Globally named resources (Service Bus namespace, SQL server) add a suffix unique to the resource group.')
@minLength(3)
@maxLength(20)
param namePrefix string

@description('Azure region.')
param location string = resourceGroup().location

@description('Worker container image by immutable tag or digest, e.g. myregistry.azurecr.io/sb-inbox:v1.2.3 (the release workflow tags with the git tag, v included) or …@sha256:… (the release workflow prints both). Never :latest: replicas would run different builds.')
param image string

@description('Login server of another Azure Container Registry whose pull role (AcrPull, or Container Registry Repository Reader in ABAC mode) is granted elsewhere, pulled with the worker and migrate identities; or empty: a public image, or the login server of acrResourceId. Container Apps authenticates registries[].identity to Azure Container Registry only: GHCR or Docker Hub here cannot be pulled (make the image public instead). Both set and naming different registries fails the deployment.')
param registryServer string = ''

@description('Resource id of the Azure Container Registry holding the image: the worker and migrate identities get AcrPull on it before the app and job are created, and they pull from its login server. Empty when the registry is public or access is granted elsewhere.')
param acrResourceId string = ''

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

@description('Session mode: the consumed queue or subscription requires sessions (fixed at creation: changing it means a new entity) and the worker runs in session mode (SB_INBOX_SESSIONS), each session\'s messages in order, one at a time. The worker refuses delayed retries and batching in session mode (retryMaxRetries 0, batchSize 1).')
param sessions bool = false

@description('Session mode: sessions a replica processes at once (SB_INBOX_MAX_SESSIONS).')
@minValue(1)
@maxValue(1000)
param maxSessions int = 8

@description('Session mode: seconds a quiet session is kept before it is released and the next available one accepted (SB_INBOX_SESSION_IDLE_SECS).')
@minValue(1)
@maxValue(300)
param sessionIdleSecs int = 5

@description('The outbox destination: a queue or a topic.')
@allowed([
  'queue'
  'topic'
])
param outboxEntityKind string = 'topic'

@description('Outbox destination name.')
param outboxEntityName string = 'inventory-events'

@description('Subscriptions created on the outbox topic (outboxEntityKind topic). Service Bus accepts a send to a topic without subscriptions and discards the message: with none, the relay marks rows dispatched and the events are lost. The default keeps the smoke test\'s events readable (docs/deploy.md, "Smoke test"); list your real consumers\' subscriptions instead.')
param outboxSubscriptions array = [
  'audit'
]

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

// Connections: each replica's pool holds at most concurrency + 2 (relay, retention; the
// readiness ping shares the pool). maxReplicas x (concurrency + 2) + 1 (migrate job) must stay
// under the database's concurrent worker limit (GP_S_Gen5_1: 75; error 10928 beyond it):
// 6 x 10 + 1 = 61. tests/infra checks it for the default SKU.
@description('Messages handled at once per replica (each holds a database connection while it runs).')
@minValue(1)
param concurrency int = 8

@description('Messages prefetched per replica; at most concurrency, or prefetched locks expire while waiting for a slot.')
@minValue(0)
param prefetch int = 8

@description('Renew a lock this many seconds before it expires.')
@minValue(1)
param lockMarginSecs int = 10

@description('Longest a delivery is handled before it is cancelled, rolled back and abandoned (like the SDKs\' maximum auto-lock-renewal duration).')
@minValue(1)
param maxProcessingSecs int = 300

@description('Deliveries committed in one database transaction, a savepoint each; 1 (default) commits each delivery on its own. See docs/deploy.md for what batching trades.')
@minValue(1)
@maxValue(1000)
param batchSize int = 1

@description('Milliseconds a batch waits for more deliveries after its first, only while every other slot runs a batch.')
@minValue(0)
@maxValue(10000)
param batchLingerMs int = 5

@description('Outbox rows the relay claims per pass at least (the running relay claims more, up to 4000, while a distant broker needs them).')
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

@description('Seconds the worker drains in-flight messages after SIGTERM. The app\'s termination grace adds the relay/retention stop (35 s) and the telemetry flush, and Container Apps allows at most 600 s.')
@minValue(1)
@maxValue(545)
param shutdownGraceSecs int = 30

@description('Seconds the telemetry exporters get to flush at exit: traces then metrics, each bounded by the OTLP exporter timeout (10 s by default, OTEL_EXPORTER_OTLP_TIMEOUT).')
@minValue(0)
@maxValue(20)
param telemetryFlushSecs int = 20

@description('Port of /healthz and /readyz.')
param healthPort int = 8080

@description('Delayed retries of a transient failure (a copy scheduled for later, the original completed) before dead-lettering with RetriesExhausted; 0 = abandon for an immediate redelivery. Needs entityKind queue: the worker refuses delayed retries on a subscription.')
@minValue(0)
@maxValue(100)
param retryMaxRetries int = 0

@description('Seconds the first delayed retry waits; each next one waits twice as long.')
@minValue(1)
@maxValue(604800)
param retryBaseDelaySecs int = 10

@description('Longest delayed-retry wait in seconds; at least retryBaseDelaySecs.')
@minValue(1)
@maxValue(604800)
param retryMaxDelaySecs int = 600

@description('Each delayed-retry wait is shortened by up to this percentage, so failures of one burst do not come back as one burst.')
@minValue(0)
@maxValue(100)
param retryJitterPercent int = 20

@description('Minimum replicas once databaseReady is true (0 lets KEDA scale to zero).')
@minValue(0)
param minReplicas int = 1

// Until the database users exist and the schema is migrated, /readyz answers 503: a revision
// that must bring minReplicas ready replicas up can end "Activation failed" or keep the
// deployment waiting until it times out, and the outputs the next steps read stay empty. With 0
// minimum replicas the revision is provisioned without waiting on a replica.
@description('False for the first deployment: the worker app gets 0 minimum replicas until the database users and the schema exist (docs/deploy.md steps 2 and 3; infra/setup-database.sh redeploys with true). True afterwards: minReplicas applies.')
param databaseReady bool = false

@description('Create the Container Apps job <prefix>-verify (and the queues verify and verify-sessions it uses): sb-inbox verify with the worker\'s identity, started after a deployment; docs/deploy.md\'s smoke test reads its result.')
param verifyAfterDeploy bool = false

@description('Maximum replicas (see the connection budget above concurrency).')
@minValue(1)
param maxReplicas int = 6

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

// How the worker and the migrate job reach the database. Without a path, the migrate job fails
// with login error 40615 and the worker is never ready.
@description('How the Container Apps environment reaches Azure SQL. azureServices (default, for a trial): no VNet, the server\'s firewall rule AllowAllWindowsAzureIps (0.0.0.0), which admits connections from any Azure customer\'s services (Entra-only login still applies). private: a VNet-integrated environment and a private endpoint of the server (modules/network.bicep), public network access disabled; database setup then runs from inside the VNet (docs/deploy.md, "The database network").')
@allowed([
  'azureServices'
  'private'
])
param databaseNetwork string = 'azureServices'

@description('databaseNetwork private: the subnet for the machine that runs database setup inside the VNet (docs/deploy.md, "The private path from an empty subscription"), declared in the template so its redeployments keep it; empty = none. The template owns the VNet\'s subnets: a subnet added by hand is removed by the next deployment.')
param managementSubnetPrefix string = '10.20.3.0/27'

@description('databaseNetwork private: resource ids of other VNets (a hub, or a peered VNet with a jump box or VPN gateway) linked to the privatelink zone so machines there resolve the server to its private endpoint.')
param dnsZoneLinkVnetIds array = []

@description('databaseNetwork private: resource id of an existing privatelink.database.windows.net zone (a landing zone\'s central zone, linked to the hub); empty = a zone in this resource group linked to the VNet.')
param existingSqlDnsZoneId string = ''

@description('Microsoft Defender for SQL: advanced threat protection and the SQL vulnerability assessment (express configuration, results in Defender for Cloud); billed per server.')
param sqlDefender bool = true

@description('Database SKU (default: General Purpose serverless, 1 vCore max, 75 concurrent workers).')
param sqlDatabaseSku object = {
  name: 'GP_S_Gen5'
  tier: 'GeneralPurpose'
  family: 'Gen5'
  capacity: 1
}

// ---- Telemetry and alerts ----

@description('OTLP endpoint the worker exports to directly (http://HOST:4317; the worker refuses https); empty = the OpenTelemetry Collector app of this deployment (metricsCollector), else the Container Apps managed OpenTelemetry agent (traces and logs to Application Insights, no metrics).')
param otlpEndpoint string = ''

@description('Deploy an OpenTelemetry Collector app (<prefix>-otel) in the environment with the Azure Monitor exporter: the worker exports traces and metrics to it, and it sends them to this Application Insights, so the workbook\'s worker panels and the worker-metric alerts see data with the defaults. False = the managed agent (no metrics) unless otlpEndpoint is set.')
param metricsCollector bool = true

@description('Image of the collector app: the OpenTelemetry Collector contrib distribution (it carries the azuremonitor exporter), by version tag or digest.')
param collectorImage string = 'otel/opentelemetry-collector-contrib:0.115.1'

@description('With the managed agent: OTLP endpoint (e.g. a collector with the Azure Monitor exporter) that receives metrics; empty = no metrics destination.')
param agentMetricsOtlpEndpoint string = ''

@description('With agentMetricsOtlpEndpoint: the agent sends to it without TLS (a plain-HTTP collector in the environment). False = TLS, and then the endpoint usually needs agentMetricsOtlpHeaders.')
param agentMetricsOtlpInsecure bool = false

@description('With agentMetricsOtlpEndpoint: headers the agent sends, as [{ key: \'...\', value: \'...\' }].')
param agentMetricsOtlpHeaders array = []

@description('True when the worker\'s metrics reach this Application Insights through a collector of your own behind otlpEndpoint or agentMetricsOtlpEndpoint. The collector app (metricsCollector, the default) counts as true by itself. The Container Apps agent does not send metrics to Application Insights, so without either the alerts on worker metrics are not created.')
param workerMetricsInAppInsights bool = false

@description('OTLP metric temporality the worker exports: delta for Azure Monitor (it sums deltas), cumulative for Prometheus.')
@allowed([
  'delta'
  'cumulative'
])
param metricsTemporality string = 'delta'

@description('Active messages on the consumed entity above which, for 15 minutes, the backlog alert fires (a dead or stuck worker).')
@minValue(1)
param backlogAlertThreshold int = 1000

@description('Oldest outbox row age in seconds above which the outbox alert fires (needs workerMetricsInAppInsights).')
@minValue(1)
param outboxAgeAlertSecs int = 300

@description('SQL workers percentage above which the alert fires (error 10928 at 100).')
@minValue(1)
@maxValue(100)
param sqlWorkersAlertPercent int = 80

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

@description('The worker\'s oldest-outbox-row age gauge in seconds.')
param outboxAgeMetricName string = 'sb_inbox.outbox.age'

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

// Service Bus namespaces and SQL servers are DNS names, unique across Azure: a suffix stable for
// this resource group and prefix (13 lowercase letters and digits).
var uniqueSuffix = uniqueString(resourceGroup().id, namePrefix)

// Container Apps, jobs and SQL servers accept lowercase names only; @allowed cannot express it.
var prefix = toLower(namePrefix)

var privateNetwork = databaseNetwork == 'private'

// The worker's own configuration check (src/worker/config: runtime.rs sessions(), retry.rs,
// runtime.rs check_margin, horizon.rs) and its telemetry start (src/telemetry/export.rs, no TLS
// exporter) refuse these combinations: the deployment would "succeed" and the worker exit
// non-zero in a crash loop. fail() stops the deployment first, naming the reason
// (https://learn.microsoft.com/azure/azure-resource-manager/bicep/bicep-functions-flow-control).
// tests/infra/round4.rs (m7) checks that each is exactly what the worker refuses.
var refusedSettings = sessions && retryMaxRetries > 0
  ? 'sessions with retryMaxRetries > 0: delayed retries cannot keep a session\'s order; set retryMaxRetries 0.'
  : sessions && batchSize > 1
      ? 'sessions with batchSize > 1: session mode handles each message in its own transaction; set batchSize 1.'
      : entityKind == 'topic' && retryMaxRetries > 0
          ? 'entityKind topic with retryMaxRetries > 0: a delayed-retry copy sent to the topic would reach every subscription; forward the subscription to a queue and consume the queue, or set retryMaxRetries 0.'
          : retryMaxRetries > 0 && retryMaxDelaySecs < retryBaseDelaySecs
              ? 'retryMaxDelaySecs is shorter than retryBaseDelaySecs.'
              : lockMarginSecs >= lockDurationSecs
                  ? 'lockMarginSecs must be shorter than lockDurationSecs: the lock would be renewed too late.'
                  : retentionSecs < replayHorizonSecs
                      ? 'retentionSecs ${retentionSecs} is shorter than the replay horizon ${replayHorizonSecs} s: a replayed message would be processed twice.'
                      : startsWith(toLower(trim(otlpEndpoint)), 'https:')
                          ? 'otlpEndpoint is https: the worker exports OTLP/gRPC over plain HTTP/2 only (http://HOST:4317).'
                          : ''
var checkedConsumerName = empty(refusedSettings)
  ? consumerName
  : fail('The worker would refuse these parameters: ${refusedSettings}')

// The collector app: the worker's OTLP endpoint unless otlpEndpoint names another one.
var collector = metricsCollector && empty(otlpEndpoint)
var workerMetricsReachAppInsights = workerMetricsInAppInsights || collector

module identities 'modules/identity.bicep' = {
  name: 'identities'
  params: {
    location: location
    namePrefix: prefix
    tags: tags
  }
}

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  params: {
    location: location
    namePrefix: prefix
    workbook: loadTextContent('dashboards/sb-inbox.workbook.json')
    // The platform-metric panels' resources, named as the modules create them (resourceId: the
    // monitoring module is deployed before them).
    serviceBusNamespaceId: resourceId('Microsoft.ServiceBus/namespaces', '${prefix}-bus-${uniqueSuffix}')
    containerAppId: resourceId('Microsoft.App/containerApps', '${prefix}-worker')
    tags: tags
  }
}

module serviceBus 'modules/servicebus.bicep' = {
  name: 'servicebus'
  params: {
    location: location
    namePrefix: prefix
    uniqueSuffix: uniqueSuffix
    workspaceId: monitoring.outputs.workspaceId
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
    outboxSubscriptions: outboxSubscriptions
    workerPrincipalId: identities.outputs.workerPrincipalId
    scalerPrincipalId: identities.outputs.scalerPrincipalId
    delayedRetries: retryMaxRetries > 0
    sessions: sessions
    verifyAfterDeploy: verifyAfterDeploy
    tags: tags
  }
}

module sql 'modules/sql.bicep' = {
  name: 'sql'
  params: {
    location: location
    namePrefix: prefix
    uniqueSuffix: uniqueSuffix
    workspaceId: monitoring.outputs.workspaceId
    allowAzureServices: !privateNetwork
    publicNetworkAccess: !privateNetwork
    defender: sqlDefender
    databaseName: sqlDatabaseName
    databaseSku: sqlDatabaseSku
    entraAdminLogin: sqlEntraAdminLogin
    entraAdminObjectId: sqlEntraAdminObjectId
    entraAdminPrincipalType: sqlEntraAdminPrincipalType
    tags: tags
  }
}

module network 'modules/network.bicep' = if (privateNetwork) {
  name: 'network'
  params: {
    location: location
    namePrefix: prefix
    sqlServerId: sql.outputs.serverId
    managementSubnetPrefix: managementSubnetPrefix
    dnsZoneLinkVnetIds: dnsZoneLinkVnetIds
    existingSqlDnsZoneId: existingSqlDnsZoneId
    tags: tags
  }
}

// The environment's subnet, named as network.bicep creates it (a resourceId, so the app module
// needs no output of a module that may not be deployed).
var appsSubnetId = privateNetwork ? resourceId('Microsoft.Network/virtualNetworks/subnets', '${prefix}-vnet', 'apps') : ''

// AcrPull for the identities that pull the image, in the registry's resource group, before the
// app and job exist: a revision cannot pull without it.
// The scope is computed even when the module is skipped: an empty id falls back to this group.
var acrParts = split(empty(acrResourceId) ? '${resourceGroup().id}/providers/Microsoft.ContainerRegistry/registries/none' : acrResourceId, '/')

// The server the identities pull from: the ACR's own loginServer, as registry.bicep reads it (a
// registry with an auto-generated domain name label, autoGeneratedDomainNameLabelScope, has
// another host than NAME.azurecr.io), or registryServer for another registry. Both given and
// naming different registries, the identities would hold the pull role on one and pull from the
// other: fail() stops the deployment with the reason. The registry's login server starts with
// its name (NAME. or, with a domain name label, NAME-HASH.), so the cross-check compares that.
// https://learn.microsoft.com/azure/azure-resource-manager/bicep/bicep-functions-flow-control
var acrName = toLower(last(acrParts))
var pullServer = empty(acrResourceId)
  ? registryServer
  : (empty(registryServer) || toLower(split(registryServer, '.')[0]) == acrName || startsWith(toLower(registryServer), '${acrName}-')
      ? registryAccess!.outputs.loginServer
      : fail('registryServer \'${registryServer}\' is not the login server of acrResourceId (registry ${acrName}): leave registryServer empty or make them name one registry.'))

// Deployed into the registry's resource group: a fixed name would collide when two environments
// sharing one registry deploy at once (deployment names are unique per resource group).
module registryAccess 'modules/registry.bicep' = if (!empty(acrResourceId)) {
  name: 'registry-access-${uniqueSuffix}'
  scope: resourceGroup(acrParts[2], acrParts[4])
  params: {
    registryName: last(acrParts)
    principalIds: [
      identities.outputs.workerPrincipalId
      identities.outputs.migratePrincipalId
    ]
  }
}

module app 'modules/containerapp.bicep' = {
  name: 'containerapp'
  params: {
    location: location
    namePrefix: prefix
    image: image
    registryServer: pullServer
    workerArgs: workerArgs
    workspaceId: monitoring.outputs.workspaceId
    appInsightsId: monitoring.outputs.appInsightsId
    infrastructureSubnetId: appsSubnetId
    otlpEndpoint: otlpEndpoint
    metricsCollector: collector
    collectorImage: collectorImage
    agentMetricsOtlpEndpoint: agentMetricsOtlpEndpoint
    agentMetricsOtlpInsecure: agentMetricsOtlpInsecure
    agentMetricsOtlpHeaders: agentMetricsOtlpHeaders
    workerIdentityId: identities.outputs.workerId
    workerClientId: identities.outputs.workerClientId
    scalerIdentityId: identities.outputs.scalerId
    migrateIdentityId: identities.outputs.migrateId
    migrateClientId: identities.outputs.migrateClientId
    verifyAfterDeploy: verifyAfterDeploy
    serviceBusNamespaceName: serviceBus.outputs.namespaceName
    serviceBusNamespaceFqdn: serviceBus.outputs.namespaceFqdn
    entityKind: entityKind
    entityName: entityName
    subscriptionName: subscriptionName
    entityPath: serviceBus.outputs.entityPath
    outboxEntityName: outboxEntityName
    sqlServerFqdn: sql.outputs.serverFqdn
    sqlDatabaseName: sql.outputs.databaseName
    metricsTemporality: metricsTemporality
    worker: {
      consumer: checkedConsumerName
      concurrency: concurrency
      prefetch: prefetch
      lockMarginSecs: lockMarginSecs
      maxProcessingSecs: maxProcessingSecs
      batchSize: batchSize
      batchLingerMs: batchLingerMs
      shutdownGraceSecs: shutdownGraceSecs
      telemetryFlushSecs: telemetryFlushSecs
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
      sessions: sessions
      maxSessions: maxSessions
      sessionIdleSecs: sessionIdleSecs
      retentionBatchSize: retentionBatchSize
      retentionIntervalSecs: retentionIntervalSecs
      outboxBatchSize: outboxBatchSize
      outboxPollIntervalMs: outboxPollIntervalMs
      outboxLeaseSecs: outboxLeaseSecs
    }
    minReplicas: databaseReady ? minReplicas : 0
    maxReplicas: maxReplicas
    scaleMessageCount: scaleMessageCount
    tags: tags
  }
  dependsOn: [
    registryAccess
    network
  ]
}

module alerts 'modules/alerts.bicep' = {
  name: 'alerts'
  params: {
    location: location
    namePrefix: prefix
    serviceBusNamespaceId: serviceBus.outputs.namespaceId
    containerAppId: app.outputs.appId
    sqlDatabaseId: sql.outputs.databaseId
    workspaceId: monitoring.outputs.workspaceId
    workerMetrics: workerMetricsReachAppInsights
    backlogThreshold: backlogAlertThreshold
    outboxAgeSecs: outboxAgeAlertSecs
    sqlWorkersPercent: sqlWorkersAlertPercent
    outboxAgeMetricName: outboxAgeMetricName
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

@description('The verify job (verifyAfterDeploy), empty without it: az containerapp job start -n <this>.')
output verifyJobName string = app.outputs.verifyJobName

@description('Worker identity name: the database user to create (IdentityName).')
output workerIdentityName string = identities.outputs.workerName

@description('Worker identity client id (AZURE_CLIENT_ID).')
output workerIdentityClientId string = identities.outputs.workerClientId

@description('Worker identity principal (object) id.')
output workerPrincipalId string = identities.outputs.workerPrincipalId

@description('Migration identity principal (object) id.')
output migratePrincipalId string = identities.outputs.migratePrincipalId

@description('Migration identity client (application) id: CREATE USER … WITH SID, TYPE = E takes it.')
output migrateIdentityClientId string = identities.outputs.migrateClientId

@description('How the environment reaches the database (azureServices or private): infra/setup-database.sh reads it.')
output databaseNetwork string = databaseNetwork

@description('The VNet (databaseNetwork private), or empty.')
output vnetName string = privateNetwork ? '${prefix}-vnet' : ''

@description('Subscriptions of the outbox topic (where the outbox events can be read).')
output outboxSubscriptions array = outboxEntityKind == 'topic' ? outboxSubscriptions : []

@description('Migration identity name: the database user allowed DDL.')
output migrateIdentityName string = identities.outputs.migrateName

@description('Replay horizon in seconds: TTL + lock duration x max delivery count + delayed retries x their longest wait + DLQ resubmit window.')
output replayHorizonSecs int = replayHorizonSecs

@description('True when inbox retention covers the replay horizon; the worker refuses to start otherwise.')
output retentionCoversReplayHorizon bool = retentionSecs >= replayHorizonSecs
