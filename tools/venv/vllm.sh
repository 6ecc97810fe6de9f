#!/usr/bin/env bash
# Creates (once) a venv with vLLM, for its `vllm bench serve` client (no GPU needed for the client),
# and prints the venv's `vllm` command. Heavy (several GB: torch and CUDA wheels); CI never runs it.
# Used by tools/bench/bench_vllm_client.sh. Usage: tools/venv/vllm.sh [VENV_DIR]   (default tools/venv/.vllm)
set -euo pipefail
cd "$(dirname "$0")/../.."
VLLM_VERSION=0.32.0
venv="${1:-tools/venv/.vllm}"
py="$venv/bin/python"
have() { [ -x "$venv/bin/vllm" ] && "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm') != '$VLLM_VERSION')" 2>/dev/null; }
if ! have; then
  python3 -m venv "$venv" >&2 || { echo "tools/venv/vllm.sh: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
  "$py" -m pip install --quiet --disable-pip-version-check "vllm==$VLLM_VERSION" >&2
  have || { echo "tools/venv/vllm.sh: $venv has no vllm $VLLM_VERSION" >&2; exit 1; }
fi
echo "$(cd "$venv/bin" && pwd)/vllm"
