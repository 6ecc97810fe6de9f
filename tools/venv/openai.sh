#!/usr/bin/env bash
# Creates (once) a venv with the `openai` Python SDK for the real-client integration test
# (tests/it/openai_sdk.rs) and prints its python. Idempotent: a venv that already imports the
# pinned version is reused. Usage: tools/venv/openai.sh [VENV_DIR]   (default tools/venv/.openai)
set -euo pipefail
cd "$(dirname "$0")/../.."
OPENAI_VERSION=2.54.0
venv="${1:-tools/venv/.openai}"
py="$venv/bin/python"
have() { [ -x "$py" ] && "$py" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; }
if ! have; then
  python3 -m venv "$venv" >&2 || { echo "tools/venv/openai.sh: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
  "$py" -m pip install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION" >&2
  have || { echo "tools/venv/openai.sh: $py cannot import openai $OPENAI_VERSION" >&2; exit 1; }
fi
echo "$(cd "$(dirname "$py")" && pwd)/$(basename "$py")"
