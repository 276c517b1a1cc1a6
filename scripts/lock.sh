#!/usr/bin/env bash
# Make the locks: requirements.lock from requirements.in, and requirements-gguf.lock from
# requirements-gguf.in held to requirements.lock (so the light setup runs versions the full
# suite tested). pip-compile (pip-tools) resolves with pip, so it sees what pip sees here:
# the CPU torch wheel on local disk and pip's configured constraints.
#
#   scripts/lock.sh              keep every pin that still fits (after editing requirements.in)
#   scripts/lock.sh --upgrade    re-resolve everything to the newest allowed (start with
#                                scripts/try-latest.sh, and commit a refresh on its own)
#
# LOCK_OUT=DIR writes the locks there instead (scripts/try-latest.sh does).
# Our own editable packages (-e lines) are dropped from the locks: they are constraints files,
# which pip forbids to hold editables.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3.11}
tools=build/lock-tools
out=${LOCK_OUT:-.}
if [ ! -x "$tools/bin/pip-compile" ]; then
  "$python" -m venv "$tools"
  "$tools/bin/pip" install -q pip-tools==7.7.0
fi
compile() {  # compile IN LOCK [pip-compile options]
  local input=$1 lock=$2
  shift 2
  CUSTOM_COMPILE_COMMAND=scripts/lock.sh "$tools/bin/pip-compile" --quiet --strip-extras --allow-unsafe --no-emit-index-url --no-emit-find-links \
    --output-file "$lock.tmp" "$@" "$input"
  # An editable line goes with the "# via" lines below it.
  awk '/^-e /{skip=1; next} skip && /^ +#/{next} {skip=0; print}' "$lock.tmp" >"$lock"
  rm "$lock.tmp"
}
# pip-compile reads the old lock as its starting pins: hand it the current one.
for lock in "$out/requirements.lock" "$out/requirements-gguf.lock"; do [ -f "$lock" ] && cp "$lock" "$lock.tmp"; done
compile requirements.in "$out/requirements.lock" "$@"
compile requirements-gguf.in "$out/requirements-gguf.lock" --constraint "$out/requirements.lock" "$@"
echo "wrote $out/requirements.lock ($(grep -c '==' "$out/requirements.lock") pins)," \
  "$out/requirements-gguf.lock ($(grep -c '==' "$out/requirements-gguf.lock") pins)"
