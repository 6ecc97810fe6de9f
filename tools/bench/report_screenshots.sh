#!/usr/bin/env bash
# Screenshots of the HTML report and the compare page at 1400 px and 800 px wide, with a timeline
# hover (zoomed in, request ids shown) and a CDF hover, into tools/bench/results/. Two replays of
# traces/azure_conv_100.csv against `retrace mock` (per-request metrics, 3% error statuses, 5% mid-stream
# stalls): speed 4, then speed 8 with --max-concurrency 8, compared with a --fail-on gate. The page runs tests/it/report_check.js
# (the browser test's checks, which leave the hovers shown); its findings are printed and saved
# in OUT_DIR/report-screenshots.txt.
# Usage: tools/bench/report_screenshots.sh [OUT_DIR]   (needs chromium; builds the debug binary)
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-tools/bench/results}"
work=$(mktemp -d)
trap 'kill "${mock_pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
command -v chromium >/dev/null || { echo "chromium not installed (apt-get install -y chromium)"; exit 1; }
cargo build --quiet
bin=target/debug/retrace
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin" mock --listen "127.0.0.1:$port" --enable-per-request-metrics --fault-status-rate 0.03 \
  --fault-stall-mid-rate 0.05 --fault-stall-ms 300 --seed 1 >"$work/mock.log" 2>&1 &
mock_pid=$!
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
"$bin" replay traces/azure_conv_100.csv --target "http://127.0.0.1:$port" --speed 4 --detailed \
  --result-json "$work/base.json" >/dev/null
"$bin" replay traces/azure_conv_100.csv --target "http://127.0.0.1:$port" --speed 8 --max-concurrency 8 \
  --detailed --result-json "$work/cand.json" >/dev/null
# from inside the work folder, so the pages name the files, not a temporary path
bin_abs=$(realpath "$bin")
(cd "$work" && "$bin_abs" report base.json -o report.html)
(cd "$work" && "$bin_abs" compare base.json cand.json --fail-on "p99_ttft_ms>+25%,failure_rate>0.05" \
  --html compare.html >/dev/null) || true
flags=(--headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update
       --disable-sync --no-first-run --disable-dev-shm-usage --hide-scrollbars)
chrome() { local prof; prof=$(mktemp -d -p "$work"); timeout 120 chromium "${flags[@]}" --user-data-dir="$prof" "$@" 2>/dev/null; }
exec > >(tee "$out/report-screenshots.txt")
for page in report compare; do
  # the page with the check script appended after its own
  python3 - "$work/$page.html" tests/it/report_check.js "$work/$page-checked.html" <<'EOF'
import sys
page, check = open(sys.argv[1]).read(), open(sys.argv[2]).read()
i = page.rindex('</body>')
open(sys.argv[3], 'w').write(page[:i] + '<script>' + check + '</script>\n' + page[i:])
EOF
  for w in 1400 800; do
    dom=$(chrome --window-size="$w,1000" --dump-dom "file://$work/$page-checked.html")
    height=$(grep -o 'id="retrace-check" data-height="[0-9]*"' <<<"$dom" | grep -o '[0-9]*"$' | tr -d '"')
    echo "== $page at $w px ($height px tall)"
    python3 -c 'import sys, re, html; print(html.unescape(re.search(r"<pre id=\"retrace-check\"[^>]*>(.*?)</pre>", sys.stdin.read(), re.S).group(1)))' <<<"$dom"
    chrome --window-size="$w,$height" --screenshot="$(realpath "$out")/$page-$w.png" "file://$work/$page-checked.html"
    echo "   $out/$page-$w.png"
  done
done
