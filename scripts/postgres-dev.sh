#!/usr/bin/env bash
# A local PostgreSQL for millm's tests and for trying MILLM_DATABASE_URL by hand.
#
#   eval "$(scripts/postgres-dev.sh)"
#
# Installs Debian's postgresql when it is missing (as root; otherwise says how), starts its
# cluster, creates a role that may create databases (the tests make one per data directory)
# and a database for it, and prints the line that exports MILLM_TEST_POSTGRES_URL. Everything
# else goes to stderr, so the output can be eval'ed. Safe to run again. .ci/run uses it.
set -euo pipefail
ROLE=${MILLM_PG_ROLE:-millm}
PASSWORD=${MILLM_PG_PASSWORD:-millm}
DATABASE=${MILLM_PG_DATABASE:-millm_test}

say() { echo "postgres-dev: $*" >&2; }
as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi
}

if ! command -v pg_lsclusters >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    say "PostgreSQL is not installed: sudo apt-get install -y postgresql, then run this again"
    exit 1
  fi
  say "installing postgresql (apt-get)"
  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql; } >&2
fi

# The first cluster Debian knows of (apt creates <version>/main); one is created when there is none.
read -r VERSION CLUSTER PORT STATUS _ < <(pg_lsclusters --no-header | head -n 1) || true
if [ -z "${VERSION:-}" ]; then
  VERSION=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
  CLUSTER=main
  say "creating cluster $VERSION/$CLUSTER"
  pg_createcluster "$VERSION" "$CLUSTER" >&2
  read -r VERSION CLUSTER PORT STATUS _ < <(pg_lsclusters --no-header | head -n 1)
fi
if [ "$STATUS" != online ]; then
  say "starting cluster $VERSION/$CLUSTER on port $PORT"
  if [ "$(id -u)" = 0 ]; then pg_ctlcluster "$VERSION" "$CLUSTER" start >&2; else sudo pg_ctlcluster "$VERSION" "$CLUSTER" start >&2; fi
fi

as_postgres psql -q -p "$PORT" -v ON_ERROR_STOP=1 >&2 <<SQL
SELECT 'CREATE ROLE "$ROLE" LOGIN CREATEDB PASSWORD ''$PASSWORD'''
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$ROLE') \gexec
SELECT 'CREATE DATABASE "$DATABASE" OWNER "$ROLE"'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$DATABASE') \gexec
SQL
say "PostgreSQL $VERSION ready on 127.0.0.1:$PORT, database $DATABASE, role $ROLE"
echo "export MILLM_TEST_POSTGRES_URL=postgresql+psycopg://$ROLE:$PASSWORD@127.0.0.1:$PORT/$DATABASE"
