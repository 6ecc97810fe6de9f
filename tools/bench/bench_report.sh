#!/usr/bin/env bash
# HTML report benchmark (release build): a synthetic 100,000-request result -> report size, build
# time, and render time in headless Chromium (wall time of --dump-dom, minus an empty page's).
# Usage: tools/bench/bench_report.sh [OUT_DIR] [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-/tmp/retrace-bench-report}"
n="${2:-100000}"
cargo run --release --quiet --example bench_report -- "$out" "$n"
command -v chromium >/dev/null || { echo "chromium not installed (apt-get install -y chromium)"; exit 1; }
flags=(--headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update
       --disable-sync --no-first-run --disable-dev-shm-usage)
echo '<!DOCTYPE html><html><body>empty</body></html>' > "$out/empty.html"
render() { # page -> seconds of headless chromium --dump-dom (median of 3); checks the marker
  local ts=()
  for _ in 1 2 3; do
    local prof; prof=$(mktemp -d)
    local t0; t0=$(date +%s.%N)
    chromium "${flags[@]}" --user-data-dir="$prof" --dump-dom "file://$1" 2>/dev/null > "$out/dom.html"
    local t1; t1=$(date +%s.%N)
    rm -rf "$prof"
    ts+=("$(echo "$t1 - $t0" | bc)")
  done
  printf '%s\n' "${ts[@]}" | sort -n | sed -n 2p
}
empty=$(render "$out/empty.html")
for page in report compare; do
  t=$(render "$out/$page.html")
  if grep -q 'id="render-ok"' "$out/dom.html" && ! grep -q ' data-render-error="' "$out/dom.html"; then ok=ok; else ok="SCRIPT ERROR"; fi
  printf '%-8s %6.2f MB  chromium --dump-dom %.2f s (empty page %.2f s) render %s\n' \
    "$page" "$(echo "$(stat -c %s "$out/$page.html") / 1000000" | bc -l)" "$t" "$empty" "$ok"
done
prof=$(mktemp -d)
chromium "${flags[@]}" --user-data-dir="$prof" --window-size=1280,2600 --screenshot="$out/report.png" "file://$out/report.html" 2>/dev/null
rm -rf "$prof"
echo "screenshot: $out/report.png"
