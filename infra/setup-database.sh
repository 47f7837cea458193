#!/usr/bin/env bash
# Steps 2 and 3 of docs/deploy.md after the first `az deployment group create`, in their order:
#   2. the database users of the worker and migrate identities, by client id
#      (sql/mssql/create_managed_identity_user.sql: CREATE USER … WITH SID = …, TYPE = E, no
#      Microsoft Graph lookup, so a pipeline service principal can run it too),
#   3. the migrate job, waited for until it succeeded, then
#      the same deployment again with databaseReady=true (the app's minReplicas applies).
# Run it as a member of the SQL server's Entra admin group, logged in with `az login`, with
# go-sqlcmd on PATH (https://learn.microsoft.com/sql/tools/sqlcmd/go-sqlcmd-utility). With
# databaseNetwork 'azureServices' it opens the SQL firewall for this machine's address while it
# runs and removes that rule on exit.
#
#   infra/setup-database.sh -g RG -p infra/main.bicepparam [-n main] [--client-ip A.B.C.D]
#
# With databaseNetwork 'private' the server takes no public traffic: run it from a machine in
# the VNet's `management` subnet (docs/deploy.md, "The private path from an empty
# subscription"); it then opens no firewall rule.
#
# The first connection is retried (SETUP_DATABASE_TRIES, default 10, SETUP_DATABASE_RETRY_SECS
# apart, default 30): a new firewall rule takes effect up to five minutes later (error 40615),
# and a serverless database paused after an hour idle answers 40613 while it resumes.
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
tries="${SETUP_DATABASE_TRIES:-10}"
retry_secs="${SETUP_DATABASE_RETRY_SECS:-30}"

output() {
  az deployment group show -g "$group" -n "$deployment" \
    --query "properties.outputs.$1.value" -o tsv
}

# Runs "$@" until it succeeds, at most $tries times, $retry_secs apart.
retry() {
  local attempt=1
  until "$@"; do
    if [ "$attempt" -ge "$tries" ]; then
      echo "failed $attempt times: $1 ${2:-}" >&2
      return 1
    fi
    echo "attempt $attempt of $tries failed; retrying in ${retry_secs}s" >&2
    attempt=$((attempt + 1))
    sleep "$retry_secs"
  done
}

server_fqdn="$(output sqlServerFqdn)"
database="$(output sqlDatabaseName)"
job="$(output migrateJobName)"
network="$(output databaseNetwork)"
server="${server_fqdn%%.*}"

# The private endpoint is the only way in: a firewall rule would change nothing.
if [ "$network" = private ]; then
  firewall_rule=no
fi

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

sql() {
  sqlcmd -S "tcp:$server_fqdn,1433" -d "$database" --authentication-method ActiveDirectoryDefault -b "$@"
}

# Wait until the server admits this machine and the database is online.
retry sql -Q "SELECT 1" >/dev/null

# Step 2: CREATE USER … WITH SID = <client id>, TYPE = E for each identity (the client ids the
# deployment printed): exactly the identity the deployment created, no directory lookup.
for role in worker migrate; do
  retry sql -v IdentityName="$(output "${role}IdentityName")" \
    ClientId="$(output "${role}IdentityClientId")" Role="$role" -i "$script"
done

# Step 3: the schema, by the migrate job (its identity has DDL; the job retries a failed
# execution twice, replicaRetryLimit); wait for its result.
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
