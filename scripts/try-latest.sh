#!/usr/bin/env bash
# Try the newest versions requirements.in allows, without touching the lock: how a lock refresh starts.
#
#   scripts/try-latest.sh [pytest arguments]     (default: the fast tests, -m "not slow" -x)
#
# Resolves requirements.in afresh (pip-compile --upgrade, into build/try-latest/), installs that
# into a scratch virtual environment (build/try-latest/venv), prints every version that differs
# from requirements.lock, and runs the tests there. Not part of CI. If all passes, refresh the lock
# with scripts/lock.sh --upgrade, run scripts/test.sh, and commit the refresh on its own.
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3.11}
scratch=build/try-latest
rm -rf "$scratch"
mkdir -p "$scratch"
LOCK_OUT=$scratch PYTHON=$python scripts/lock.sh --upgrade || { echo "try-latest: the newest versions do not resolve"; exit 1; }

echo "== versions that differ from requirements.lock (locked -> newest)"
python3 - requirements.lock "$scratch/requirements.lock" <<'PY'
import re, sys
def pins(path):
    return dict(m.groups() for m in re.finditer(r"^([A-Za-z0-9._-]+)==(\S+)", open(path).read(), re.M))
old, new = pins(sys.argv[1]), pins(sys.argv[2])
changed = [name for name in sorted(old.keys() | new.keys(), key=str.lower) if old.get(name) != new.get(name)]
for name in changed:
    print(f"  {name}: {old.get(name, '-')} -> {new.get(name, '-')}")
print(f"  {len(changed)} of {len(new)} packages differ")
PY

"$python" -m venv "$scratch/venv"
# shellcheck disable=SC1091
. "$scratch/venv/bin/activate"
pip install -q -r requirements.in -c "$scratch/requirements.lock" || { echo "try-latest: the install failed"; exit 1; }
echo "== tests on the newest versions"
if [ $# -eq 0 ]; then set -- -m "not slow" -x; fi
pytest "$@"
status=$?
[ $status -eq 0 ] && echo "try-latest: passed; refresh with scripts/lock.sh --upgrade" || echo "try-latest: broke (above)"
exit $status
