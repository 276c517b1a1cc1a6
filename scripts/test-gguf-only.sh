#!/usr/bin/env bash
# The light setup as a user gets it: a new virtual environment (.venv-gguf) made by the README's
# GGUF-only command, checked to hold neither torch nor transformers, then the GGUF engine's tests
# run inside it, with the test tools added at the versions requirements.lock pins. Tests that need
# what the light setup lacks (torch, the other plugins) skip, saying so. Run it outside any venv.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${GGUF_VENV:-.venv-gguf}
started=$SECONDS
rm -rf "$venv"
python3.11 -m venv "$venv" && . "$venv/bin/activate" && pip install -r requirements-gguf.txt
echo "test-gguf-only: the light setup took $((SECONDS - started)) s"
for heavy in torch transformers; do
  if python -c "import $heavy" 2>/dev/null; then
    echo "test-gguf-only: the light setup installed $heavy" >&2
    exit 1
  fi
done
# The test tools, not the light setup's: pytest and its timeout plugin, hypothesis, gguf (the tests
# write tiny GGUF files) and jsonschema (replies checked against OpenAI's schemas), each locked.
pip install -c requirements.lock pytest pytest-timeout hypothesis gguf jsonschema
pytest plugins/engine_gguf/tests "$@"
