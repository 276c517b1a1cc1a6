#!/usr/bin/env bash
# The whole test suite, one command: scripts/test.sh [pytest arguments for both passes]
#
# Run it in the environment the setup made (pip install -r requirements.txt). It installs and
# starts what the tests need, then runs them:
#   - Debian's chromium for the web UI's browser tests (Playwright downloads no browser);
#   - Debian's nginx, which the deployment example's test puts in front of a server;
#   - PostgreSQL (scripts/postgres-dev.sh: installed when missing, started, a role and database);
#   - pytest: everything, on SQLite, in two pytest-xdist workers (each test file on one);
#   - pytest -m storage --database postgresql: every test that writes to the database, again,
#     each app on a PostgreSQL database of its own.
# apt-get needs root; as another user, install chromium, nginx and postgresql first.
# Exits non-zero if either pass fails (both always run).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null; then
  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; } >&2
fi
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y nginx; } >&2
fi
eval "$(scripts/postgres-dev.sh)"  # exports MILLM_TEST_POSTGRES_URL
# Two workers' processes share the cores: OpenMP threads that wait sleep instead of spinning
# (libgomp spins by default), so one process's idle team does not hold a core the other needs.
export OMP_WAIT_POLICY=PASSIVE
status=0
pytest -n 2 --dist loadfile "$@" || status=$?
pytest -m storage --database postgresql "$@" || status=$?
exit $status
