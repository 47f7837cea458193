#!/usr/bin/env bash
# Steps 2 and 3 of docs/deploy.md after the first `az deployment group create`, in their order:
#   2. the database users of the worker and migrate identities, by object id
#      (sql/mssql/create_managed_identity_user.sql with ObjectId: no display-name lookup),
#   3. the migrate job, waited for until it succeeded, then
#      the same deployment again with databaseReady=true (the app's minReplicas applies).
# Run it as a member of the SQL server's Entra admin group, logged in with `az login`, with
# go-sqlcmd on PATH (https://learn.microsoft.com/sql/tools/sqlcmd/go-sqlcmd-utility). It opens
# the SQL firewall for this machine's address while it runs and removes that rule on exit.
#
#   infra/setup-database.sh -g RG -p infra/main.bicepparam [-n main] [--client-ip A.B.C.D]
#
# With databaseNetwork 'private' the server takes no public traffic: run it from a machine in
# the VNet with --no-firewall-rule.
set -euo pipefail

usage() {
  echo "usage: $0 -g RESOURCE_GROUP -p PARAMETERS_FILE [-n DEPLOYMENT_NAME] [--client-ip IP | --no-firewall-rule]" >&2
  exit 2
}

group=""
parameters=""
deployment="main"
client_ip=""
firewall_rule=yes
while [ $# -gt 0 ]; do
  case "$1" in
    -g) group="${2:-}"; shift 2 || usage ;;
    -p) parameters="${2:-}"; shift 2 || usage ;;
    -n) deployment="${2:-}"; shift 2 || usage ;;
    --client-ip) client_ip="${2:-}"; shift 2 || usage ;;
    --no-firewall-rule) firewall_rule=no; shift ;;
    *) usage ;;
  esac
done
[ -n "$group" ] && [ -n "$parameters" ] || usage
[ -f "$parameters" ] || { echo "$parameters: no such parameters file" >&2; exit 2; }

here="$(cd "$(dirname "$0")" && pwd)"
script="$here/../sql/mssql/create_managed_identity_user.sql"

output() {
  az deployment group show -g "$group" -n "$deployment" \
    --query "properties.outputs.$1.value" -o tsv
}

server_fqdn="$(output sqlServerFqdn)"
database="$(output sqlDatabaseName)"
job="$(output migrateJobName)"
server="${server_fqdn%%.*}"

# Step 2 needs this machine to reach the server: a rule for its address, removed on any exit.
if [ "$firewall_rule" = yes ]; then
  if [ -z "$client_ip" ]; then
    client_ip="$(curl -fsS https://api.ipify.org)"
  fi
  rule="setup-database-$$"
  az sql server firewall-rule create -g "$group" -s "$server" -n "$rule" \
    --start-ip-address "$client_ip" --end-ip-address "$client_ip" --output none
  trap 'az sql server firewall-rule delete -g "$group" -s "$server" -n "$rule" --output none' EXIT
fi

# Step 2: CREATE USER … WITH OBJECT_ID for each identity (the principal ids the deployment
# printed), so a display name shared by two principals of the tenant cannot pick the wrong one.
for role in worker migrate; do
  sqlcmd -S "tcp:$server_fqdn,1433" -d "$database" --authentication-method ActiveDirectoryDefault \
    -b -v IdentityName="$(output "${role}IdentityName")" ObjectId="$(output "${role}PrincipalId")" \
    Role="$role" -i "$script"
done

# Step 3: the schema, by the migrate job (its identity has DDL); wait for its result.
execution="$(az containerapp job start -g "$group" -n "$job" --query name -o tsv)"
echo "migrate job execution $execution started"
while :; do
  status="$(az containerapp job execution show -g "$group" -n "$job" \
    --job-execution-name "$execution" --query properties.status -o tsv)"
  case "$status" in
    Succeeded) break ;;
    Failed | Stopped | Degraded)
      echo "migrate job execution $execution ended $status; its logs:" >&2
      echo "  az containerapp job logs show -g $group -n $job --container migrate" >&2
      exit 1
      ;;
    *) sleep "${SETUP_DATABASE_POLL_SECS:-10}" ;;
  esac
done
echo "migrate job execution $execution succeeded"

# End of step 3: the worker may now keep its minimum replicas ready.
az deployment group create -g "$group" -n "$deployment" -f "$here/main.bicep" \
  -p "$parameters" -p databaseReady=true --output none
echo "deployment $deployment updated with databaseReady=true; set it in $parameters too"
