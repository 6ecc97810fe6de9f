#!/usr/bin/env bash
# Creates (once) a venv with AIPerf for tools/bench/bench_aiperf_export.sh and prints its python.
# About 1.2 GB and 100 s to install. Idempotent: a venv that already runs the pinned version is
# reused. Usage: tools/venv/aiperf.sh [VENV_DIR]   (default tools/venv/.aiperf)
set -euo pipefail
cd "$(dirname "$0")/../.."
AIPERF_VERSION=0.13.0
venv="${1:-tools/venv/.aiperf}"
py="$venv/bin/python"
have() { [ -x "$py" ] && [ "$("$py" -c 'import importlib.metadata as m; print(m.version("aiperf"))' 2>/dev/null)" = "$AIPERF_VERSION" ]; }
if ! have; then
  python3 -m venv "$venv" >&2 || { echo "tools/venv/aiperf.sh: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
  "$py" -m pip install --quiet --disable-pip-version-check "aiperf==$AIPERF_VERSION" >&2
  have || { echo "tools/venv/aiperf.sh: $py has no aiperf $AIPERF_VERSION" >&2; exit 1; }
fi
echo "$(cd "$(dirname "$py")" && pwd)/$(basename "$py")"
