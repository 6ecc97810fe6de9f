#!/usr/bin/env bash
# The test command (README, .ci/run): makes sure the browser test has Debian's chromium, then
# runs the whole cargo test suite. Without root and without chromium, set RETRACE_SKIP_BROWSER=1
# to skip the one browser test knowingly.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1 && [ "${RETRACE_SKIP_BROWSER:-}" != "1" ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing chromium for the HTML report's browser test"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium is missing: install it (apt-get install chromium) or set RETRACE_SKIP_BROWSER=1" >&2
  fi
fi
cargo test --locked "$@"
