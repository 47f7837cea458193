// Container Apps environment (logs to Log Analytics through Azure Monitor, OpenTelemetry through
// the managed agent or an OTLP endpoint), the worker app (KEDA azure-servicebus scale rule with a
// managed identity, health probes, graceful shutdown) and a manual migration job.

@description('Azure region.')
param location string

@description('Prefix of every resource name.')
param namePrefix string

@description('Container image of the worker, e.g. myregistry.azurecr.io/sb-inbox:v1.2.3.')
param image string

@description('Azure Container Registry login server to pull from with the worker and migrate identities (AcrPull, or Container Registry Repository Reader in ABAC mode), or empty for a public image.')
param registryServer string = ''

@description('Arguments after the sb-inbox entrypoint for the worker.')
param workerArgs array

@description('Log Analytics workspace resource id.')
param workspaceId string

@description('Application Insights resource id.')
param appInsightsId string

@description('Subnet the environment runs in (delegated to Microsoft.App/environments), or empty for no VNet.')
param infrastructureSubnetId string = ''

@description('OTLP endpoint the worker exports to directly; empty = the collector app (metricsCollector) or the managed agent.')
param otlpEndpoint string

@description('Deploy the OpenTelemetry Collector app (<prefix>-otel) and point the worker at it (only with otlpEndpoint empty).')
param metricsCollector bool = false

@description('Image of the collector app (OpenTelemetry Collector contrib, with the azuremonitor exporter).')
param collectorImage string = 'otel/opentelemetry-collector-contrib:0.115.1'

@description('With the managed agent: OTLP endpoint for metrics (Application Insights takes no metrics from the agent); empty = no metrics destination.')
param agentMetricsOtlpEndpoint string

@description('The agent sends to agentMetricsOtlpEndpoint without TLS (the OTLP destination\'s insecure flag).')
param agentMetricsOtlpInsecure bool = false

@description('Headers the agent sends to agentMetricsOtlpEndpoint ([{ key, value }]); with insecure false the CLI reference requires them.')
param agentMetricsOtlpHeaders array = []

@description('Resource id of the worker identity.')
param workerIdentityId string

@description('Client id of the worker identity (AZURE_CLIENT_ID).')
param workerClientId string

@description('Resource id of the KEDA scaler identity.')
param scalerIdentityId string

@description('Resource id of the migration identity.')
param migrateIdentityId string

@description('Client id of the migration identity.')
param migrateClientId string

@description('verifyAfterDeploy: the Container Apps job <prefix>-verify, which runs sb-inbox verify with the worker\'s identity on the queues verify and verify-sessions.')
param verifyAfterDeploy bool = false

@description('Service Bus namespace name (the KEDA scaler wants the name, not the FQDN).')
param serviceBusNamespaceName string

@description('Service Bus namespace FQDN.')
param serviceBusNamespaceFqdn string

@description('The consumed entity is a queue or a topic subscription.')
param entityKind string

@description('Queue or topic name.')
param entityName string

@description('Subscription name (topic only).')
param subscriptionName string

@description('Consumed entity path for the worker: queue, or topic/Subscriptions/sub.')
param entityPath string

@description('Outbox destination name.')
param outboxEntityName string

@description('Worker settings passed as SB_INBOX_* environment variables.')
param worker object

@description('Azure SQL server FQDN.')
param sqlServerFqdn string

@description('Azure SQL database name.')
param sqlDatabaseName string

@description('OTLP metric temporality: delta (Azure Monitor) or cumulative (Prometheus).')
param metricsTemporality string

@description('Minimum replicas (0 lets KEDA scale to zero).')
@minValue(0)
param minReplicas int

@description('Maximum replicas.')
@minValue(1)
param maxReplicas int

@description('Active messages per replica that KEDA aims for.')
@minValue(1)
param scaleMessageCount int

@description('CPU cores per replica.')
param cpu string = '0.5'

@description('Memory per replica.')
param memory string = '1Gi'

@description('Tags for every resource.')
param tags object = {}

// One store string per identity: User Id names the user-assigned identity whose token logs in
// (the app and the job carry different identities; without it the token request would go to a
// system-assigned identity they do not have). The store also falls back to AZURE_CLIENT_ID.
var storeBase = 'Server=tcp:${sqlServerFqdn},1433;Database=${sqlDatabaseName};Encrypt=True;Authentication=Active Directory Default'
var workerStore = '${storeBase};User Id=${workerClientId}'
var migrateStore = '${storeBase};User Id=${migrateClientId}'

// SIGTERM to SIGKILL must cover the drain, the relay and retention stop (BACKGROUND_STOP in
// src/worker/run.rs) and the telemetry flush; Container Apps allows at most 600 s.
var backgroundStopSecs = 35
var drainSecs = worker.shutdownGraceSecs
var flushSecs = worker.telemetryFlushSecs
var terminationGraceSecs = drainSecs + backgroundStopSecs + flushSecs

// The collector app is reached by its name inside the environment, through its internal ingress
// (HTTP/2 without TLS, port 80; https://learn.microsoft.com/azure/container-apps/connect-apps).
var collectorName = '${namePrefix}-otel'
var collectorEndpoint = 'http://${collectorName}:80'
var exportEndpoint = empty(otlpEndpoint) && metricsCollector ? collectorEndpoint : otlpEndpoint
var useAgent = empty(exportEndpoint)
var agentMetrics = useAgent && !empty(agentMetricsOtlpEndpoint)
// The managed agent has no metrics destination unless agentMetricsOtlpEndpoint is set (its
// Application Insights destination takes traces and logs only), and refuses the metric exports
// the worker would send every minute. OTEL_METRICS_EXPORTER=none (the OpenTelemetry SDK
// environment variable specification) turns the worker's metric exporter off.
var metricsExported = !useAgent || agentMetrics

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: last(split(appInsightsId, '/'))
}

resource environment 'Microsoft.App/managedEnvironments@2024-10-02-preview' = {
  name: '${namePrefix}-env'
  location: location
  tags: tags
  properties: {
    // A workload profiles environment (the Consumption profile only): the consumption-only
    // environment is the legacy type, and only this type can later be VNet-integrated with a
    // /27 subnet and user-defined routes or a NAT gateway.
    // https://learn.microsoft.com/azure/container-apps/environment-type
    workloadProfiles: [
      {
        name: 'Consumption'
        workloadProfileType: 'Consumption'
      }
    ]
    // With databaseNetwork 'private': the VNet whose private DNS zone resolves the SQL server to
    // its private endpoint. Fixed at creation: changing it means a new environment.
    vnetConfiguration: empty(infrastructureSubnetId)
      ? null
      : {
          infrastructureSubnetId: infrastructureSubnetId
        }
    // Logs go through Azure Monitor diagnostic settings: no workspace key in the template.
    appLogsConfiguration: {
      destination: 'azure-monitor'
    }
    // The managed agent's Application Insights destination takes traces and logs, not metrics.
    appInsightsConfiguration: useAgent
      ? {
          connectionString: appInsights.properties.ConnectionString
        }
      : null
    openTelemetryConfiguration: useAgent
      ? {
          destinationsConfiguration: agentMetrics
            ? {
                otlpConfigurations: [
                  {
                    name: 'metrics'
                    endpoint: agentMetricsOtlpEndpoint
                    // OtlpConfiguration (Microsoft.App 2024-10-02-preview): a plain-HTTP collector
                    // needs insecure; with TLS the CLI reference requires headers
                    // (MicrosoftDocs/azure-docs articles/container-apps/opentelemetry-agents.md).
                    insecure: agentMetricsOtlpInsecure
                    headers: agentMetricsOtlpHeaders
                  }
                ]
              }
            : null
          tracesConfiguration: {
            destinations: [
              'appInsights'
            ]
          }
          logsConfiguration: {
            destinations: [
              'appInsights'
            ]
          }
          metricsConfiguration: agentMetrics
            ? {
                destinations: [
                  'metrics'
                ]
              }
            : null
        }
      : null
  }
}

resource environmentLogs 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'to-log-analytics'
  scope: environment
  properties: {
    workspaceId: workspaceId
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
  }
}

// The namespace FQDN without its name: servicebus.windows.net in the public cloud.
var serviceBusSuffix = substring(serviceBusNamespaceFqdn, indexOf(serviceBusNamespaceFqdn, '.') + 1)
// KEDA's names of the clouds ARM calls AzureCloud, AzureChinaCloud, AzureUSGovernment.
var kedaClouds = {
  AzureCloud: 'AzurePublicCloud'
  AzureChinaCloud: 'AzureChinaCloud'
  AzureUSGovernment: 'AzureUSGovernmentCloud'
}
var kedaCloud = kedaClouds[?environment().name] ?? 'Private'

var scaleEntity = entityKind == 'queue'
  ? {
      queueName: entityName
    }
  : {
      topicName: entityName
      subscriptionName: subscriptionName
    }

var registries = empty(registryServer)
  ? []
  : [
      {
        server: registryServer
        identity: workerIdentityId
      }
    ]

// One table of environment variables; docs/deploy.md lists the same names.
var workerEnv = [
  { name: 'SB_INBOX_SERVICEBUS_NAMESPACE', value: serviceBusNamespaceFqdn }
  { name: 'SB_INBOX_ENTITY', value: entityPath }
  { name: 'SB_INBOX_CONSUMER', value: worker.consumer }
  { name: 'SB_INBOX_STORE', value: workerStore }
  { name: 'SB_INBOX_CONCURRENCY', value: string(worker.concurrency) }
  { name: 'SB_INBOX_PREFETCH', value: string(worker.prefetch) }
  { name: 'SB_INBOX_LOCK_MARGIN_SECS', value: string(worker.lockMarginSecs) }
  { name: 'SB_INBOX_MAX_PROCESSING_SECS', value: string(worker.maxProcessingSecs) }
  { name: 'SB_INBOX_BATCH_SIZE', value: string(worker.batchSize) }
  { name: 'SB_INBOX_BATCH_LINGER_MS', value: string(worker.batchLingerMs) }
  { name: 'SB_INBOX_SHUTDOWN_GRACE_SECS', value: string(worker.shutdownGraceSecs) }
  { name: 'SB_INBOX_HEALTH_PORT', value: string(worker.healthPort) }
  { name: 'SB_INBOX_LOCK_DURATION_SECS', value: string(worker.lockDurationSecs) }
  { name: 'SB_INBOX_MAX_DELIVERY_COUNT', value: string(worker.maxDeliveryCount) }
  { name: 'SB_INBOX_MESSAGE_TTL_SECS', value: string(worker.messageTtlSecs) }
  { name: 'SB_INBOX_DLQ_RESUBMIT_WINDOW_SECS', value: string(worker.dlqResubmitWindowSecs) }
  { name: 'SB_INBOX_RETENTION_SECS', value: string(worker.retentionSecs) }
  { name: 'SB_INBOX_RETRY_MAX_RETRIES', value: string(worker.retryMaxRetries) }
  { name: 'SB_INBOX_RETRY_BASE_DELAY_SECS', value: string(worker.retryBaseDelaySecs) }
  { name: 'SB_INBOX_RETRY_MAX_DELAY_SECS', value: string(worker.retryMaxDelaySecs) }
  { name: 'SB_INBOX_RETRY_JITTER_PERCENT', value: string(worker.retryJitterPercent) }
  { name: 'SB_INBOX_RETENTION_BATCH', value: string(worker.retentionBatchSize) }
  { name: 'SB_INBOX_RETENTION_INTERVAL_SECS', value: string(worker.retentionIntervalSecs) }
  { name: 'SB_INBOX_OUTBOX_DESTINATION', value: outboxEntityName }
  { name: 'SB_INBOX_OUTBOX_BATCH', value: string(worker.outboxBatchSize) }
  { name: 'SB_INBOX_OUTBOX_POLL_MS', value: string(worker.outboxPollIntervalMs) }
  { name: 'SB_INBOX_OUTBOX_LEASE_SECS', value: string(worker.outboxLeaseSecs) }
  { name: 'AZURE_CLIENT_ID', value: workerClientId }
  { name: 'OTEL_SERVICE_NAME', value: 'sb-inbox' }
  { name: 'OTEL_RESOURCE_ATTRIBUTES', value: 'service.namespace=sb-inbox,deployment.environment.name=${namePrefix}' }
  // Azure Monitor sums metric deltas (the workbook and alerts add up valueSum).
  { name: 'OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE', value: metricsTemporality }
]

// Session mode only: the worker refuses the session settings without it.
var sessionEnv = worker.sessions
  ? [
      { name: 'SB_INBOX_SESSIONS', value: 'true' }
      { name: 'SB_INBOX_MAX_SESSIONS', value: string(worker.maxSessions) }
      { name: 'SB_INBOX_SESSION_IDLE_SECS', value: string(worker.sessionIdleSecs) }
    ]
  : []

// With the managed agent, Container Apps injects OTEL_EXPORTER_OTLP_ENDPOINT itself.
var otlpEnv = concat(
  useAgent ? [] : [{ name: 'OTEL_EXPORTER_OTLP_ENDPOINT', value: exportEndpoint }],
  metricsExported ? [] : [{ name: 'OTEL_METRICS_EXPORTER', value: 'none' }]
)

resource app 'Microsoft.App/containerApps@2024-10-02-preview' = {
  name: '${namePrefix}-worker'
  location: location
  tags: tags
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${workerIdentityId}': {}
      '${scalerIdentityId}': {}
    }
  }
  properties: {
    environmentId: environment.id
    workloadProfileName: 'Consumption'
    configuration: {
      activeRevisionsMode: 'Single'
      // A queue worker: no ingress; the probes reach the container port directly.
      registries: registries
      // The scaler identity (Data Owner on the entity) is for KEDA only: lifecycle None keeps
      // it out of the containers' identity endpoint. The worker's own is for the main container.
      // https://learn.microsoft.com/azure/container-apps/managed-identity#control-managed-identity-availability
      identitySettings: [
        {
          identity: scalerIdentityId
          lifecycle: 'None'
        }
        {
          identity: workerIdentityId
          lifecycle: 'Main'
        }
      ]
    }
    template: {
      terminationGracePeriodSeconds: terminationGraceSecs
      containers: [
        {
          name: 'sb-inbox'
          image: image
          args: workerArgs
          env: concat(workerEnv, sessionEnv, otlpEnv)
          resources: {
            cpu: json(cpu)
            memory: memory
          }
          // Timeouts of 3 s: /readyz bounds its own checks to 2 s (PROBE_TIMEOUT), so a hung
          // database answers 503 instead of timing out. The startup probe stays within the
          // API's limits (failureThreshold 1-10, periodSeconds 1-240; ContainerAppProbe in the
          // Microsoft.App REST specification): /healthz answers as soon as the port is bound.
          // https://learn.microsoft.com/azure/container-apps/health-probes
          probes: [
            {
              type: 'Liveness'
              httpGet: {
                path: '/healthz'
                port: worker.healthPort
              }
              periodSeconds: 10
              timeoutSeconds: 3
              failureThreshold: 3
            }
            {
              type: 'Readiness'
              httpGet: {
                path: '/readyz'
                port: worker.healthPort
              }
              periodSeconds: 5
              timeoutSeconds: 3
              failureThreshold: 3
            }
            {
              type: 'Startup'
              httpGet: {
                path: '/healthz'
                port: worker.healthPort
              }
              periodSeconds: 3
              timeoutSeconds: 3
              failureThreshold: 10
            }
          ]
        }
      ]
      scale: {
        minReplicas: minReplicas
        maxReplicas: maxReplicas
        rules: [
          {
            name: 'servicebus-backlog'
            custom: {
              type: 'azure-servicebus'
              metadata: union(
                {
                  namespace: serviceBusNamespaceName
                  messageCount: string(scaleMessageCount)
                  // KEDA's azure-servicebus scaler defaults to AzurePublicCloud; elsewhere it needs
                  // the cloud, or "Private" with the namespace suffix
                  // (https://keda.sh/docs/latest/scalers/azure-service-bus/, metadata cloud and
                  // endpointSuffix).
                  cloud: kedaCloud
                },
                kedaCloud == 'Private'
                  ? {
                      endpointSuffix: serviceBusSuffix
                    }
                  : {},
                scaleEntity
              )
              // KEDA authenticates with this identity (Data Owner on the consumed entity).
              identity: scalerIdentityId
            }
          }
        ]
      }
    }
  }
}

// Migrations run on demand (az containerapp job start) with the identity that may run DDL.
resource migrateJob 'Microsoft.App/jobs@2024-10-02-preview' = {
  name: '${namePrefix}-migrate'
  location: location
  tags: tags
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${migrateIdentityId}': {}
    }
  }
  properties: {
    environmentId: environment.id
    workloadProfileName: 'Consumption'
    configuration: {
      triggerType: 'Manual'
      replicaTimeout: 1800
      // A transient failure (database resuming from auto-pause, 40613; a fail-over) gets two
      // more tries; sb-inbox migrate also retries unavailable errors itself, and is idempotent.
      replicaRetryLimit: 2
      manualTriggerConfig: {
        parallelism: 1
        replicaCompletionCount: 1
      }
      registries: empty(registryServer)
        ? []
        : [
            {
              server: registryServer
              identity: migrateIdentityId
            }
          ]
    }
    template: {
      containers: [
        {
          name: 'migrate'
          image: image
          args: [
            'migrate'
            '--inventory'
          ]
          // The same telemetry variables as the worker: with the agent and no metrics
          // destination, OTEL_METRICS_EXPORTER=none keeps the job from exporting metrics nobody
          // takes (and waiting up to the exporter timeout at exit).
          env: concat([
            { name: 'SB_INBOX_STORE', value: migrateStore }
            { name: 'AZURE_CLIENT_ID', value: migrateClientId }
            { name: 'OTEL_SERVICE_NAME', value: 'sb-inbox-migrate' }
          ], otlpEnv)
          resources: {
            cpu: json('0.25')
            memory: '0.5Gi'
          }
        }
      ]
    }
  }
}

// verifyAfterDeploy (issue 43): sb-inbox verify with the worker's identity, started on demand
// after a deployment (docs/deploy.md, smoke test) against the namespace's queues verify and
// verify-sessions (given entities: no Manage right needed). Its store scenarios run on SQLite in
// the job's own container (/tmp), not on Azure SQL: on SQL Server verify creates a user and a
// schema, rights the worker's database user does not have (db_owner would). Exit 0
// when nothing failed (--allow-skipped: token_refresh needs a SAS key, and this is Entra ID),
// so the execution's status is the verdict; the table is in the job's logs.
resource verifyJob 'Microsoft.App/jobs@2024-10-02-preview' = if (verifyAfterDeploy) {
  name: '${namePrefix}-verify'
  location: location
  tags: tags
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${workerIdentityId}': {}
    }
  }
  properties: {
    environmentId: environment.id
    workloadProfileName: 'Consumption'
    configuration: {
      triggerType: 'Manual'
      // idle_detach_survival waits 11 minutes (the service detaches links idle for 10).
      replicaTimeout: 1800
      // A second run would find nothing of the first's (it purges), but a failure is a verdict.
      replicaRetryLimit: 0
      manualTriggerConfig: {
        parallelism: 1
        replicaCompletionCount: 1
      }
      registries: empty(registryServer)
        ? []
        : [
            {
              server: registryServer
              identity: workerIdentityId
            }
          ]
    }
    template: {
      containers: [
        {
          name: 'verify'
          image: image
          args: [
            'verify'
            '--queue'
            'verify'
            '--session-queue'
            'verify-sessions'
            '--store'
            'sqlite:///tmp/verify.db'
            '--idle-secs'
            '660'
            '--allow-skipped'
          ]
          env: concat([
            { name: 'SB_INBOX_SERVICEBUS_NAMESPACE', value: serviceBusNamespaceFqdn }
            { name: 'AZURE_CLIENT_ID', value: workerClientId }
            { name: 'OTEL_SERVICE_NAME', value: 'sb-inbox-verify' }
          ], otlpEnv)
          resources: {
            cpu: json('0.5')
            memory: '1Gi'
          }
        }
      ]
    }
  }
}

// The OpenTelemetry Collector: OTLP/gRPC in (from the worker, plain HTTP/2 inside the
// environment), the azuremonitor exporter out to Application Insights (customMetrics, requests,
// dependencies, traces), so the worker's metrics reach Azure Monitor with the defaults: the
// managed agent's Application Insights destination takes no metrics ("Azure App Insights: Logs
// Yes, Metrics No, Traces Yes", MicrosoftDocs/azure-docs
// articles/container-apps/opentelemetry-agents.md). The configuration is read from an
// environment variable (--config=env:NAME, the collector's env config provider,
// https://opentelemetry.io/docs/collector/configuration/); the connection string is an
// identifier, not a secret (Application Insights docs), and the collector reads it from its env.
var collectorConfig = '''
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 0.0.0.0:4317
processors:
  batch: {}
exporters:
  azuremonitor:
    connection_string: ${env:APPLICATIONINSIGHTS_CONNECTION_STRING}
extensions:
  health_check:
    endpoint: 0.0.0.0:13133
service:
  extensions: [health_check]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [azuremonitor]
    metrics:
      receivers: [otlp]
      processors: [batch]
      exporters: [azuremonitor]
    logs:
      receivers: [otlp]
      processors: [batch]
      exporters: [azuremonitor]
'''

resource collectorApp 'Microsoft.App/containerApps@2024-10-02-preview' = if (metricsCollector && empty(otlpEndpoint)) {
  name: collectorName
  location: location
  tags: tags
  properties: {
    environmentId: environment.id
    workloadProfileName: 'Consumption'
    configuration: {
      activeRevisionsMode: 'Single'
      // Reachable inside the environment only, as http://<prefix>-otel (HTTP/2 for gRPC).
      ingress: {
        external: false
        targetPort: 4317
        transport: 'http2'
        allowInsecure: true
      }
    }
    template: {
      containers: [
        {
          name: 'otel-collector'
          image: collectorImage
          args: [
            '--config=env:COLLECTOR_CONFIG'
          ]
          env: [
            { name: 'COLLECTOR_CONFIG', value: collectorConfig }
            { name: 'APPLICATIONINSIGHTS_CONNECTION_STRING', value: appInsights.properties.ConnectionString }
          ]
          resources: {
            cpu: json('0.25')
            memory: '0.5Gi'
          }
          probes: [
            {
              type: 'Liveness'
              httpGet: {
                path: '/'
                port: 13133
              }
              periodSeconds: 10
              timeoutSeconds: 3
              failureThreshold: 3
            }
          ]
        }
      ]
      // One replica: the worker's exports must always find it (scale to zero would drop them).
      scale: {
        minReplicas: 1
        maxReplicas: 1
      }
    }
  }
}

output appName string = app.name
output appId string = app.id
output environmentName string = environment.name
output migrateJobName string = migrateJob.name
output verifyJobName string = verifyAfterDeploy ? verifyJob.name : ''
@description('Where the worker exports OTLP: the collector app, otlpEndpoint, or empty (the managed agent injects its own).')
output otlpExportEndpoint string = exportEndpoint
