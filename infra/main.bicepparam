// The same deployment as main.parameters.json, in Bicep's own parameters format, checked by
// `az bicep build-params` in .github/workflows/infra.yml. Deploy with:
//   az deployment group create -g RG -f infra/main.bicep -p infra/main.bicepparam
using 'main.bicep'

param namePrefix = 'sbinbox-dev'
// An immutable release tag (or @sha256 digest) printed by .github/workflows/release.yml.
param image = 'ghcr.io/sb-inbox/sb-inbox:v0.1.0'
param sqlEntraAdminLogin = 'sb-inbox-sql-admins'
param sqlEntraAdminObjectId = '00000000-0000-0000-0000-000000000000'
param sqlEntraAdminPrincipalType = 'Group'
param entityKind = 'queue'
param entityName = 'orders-order-placed'
param consumerName = 'inventory.order-placed.v1'
param lockDurationSecs = 60
param maxDeliveryCount = 10
param messageTtlSecs = 1209600
param dlqResubmitWindowSecs = 604800
param retentionSecs = 2592000
