#!/usr/bin/env bash
# Creates (once) a venv with `kubernetes-validate` (PyPI; the Kubernetes OpenAPI schemas, bundled,
# so validation needs no cluster and no network) for the manifest test in tests/it/scale_out.rs,
# and prints the path of its `kubernetes-validate`. Idempotent: a venv that already has the pinned
# version is reused. Usage: tools/venv/k8s.sh [VENV_DIR]   (default tools/venv/.k8s)
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=1.37.0
venv="${1:-tools/venv/.k8s}"
bin="$venv/bin/kubernetes-validate"
have() { [ -x "$bin" ] && [ "$("$bin" --version 2>/dev/null)" = "$VERSION" ]; }
if ! have; then
  python3 -m venv "$venv" >&2 || { echo "tools/venv/k8s.sh: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "kubernetes-validate==$VERSION" >&2
  have || { echo "tools/venv/k8s.sh: $bin is not kubernetes-validate $VERSION" >&2; exit 1; }
fi
echo "$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
