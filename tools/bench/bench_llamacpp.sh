#!/usr/bin/env bash
# Server-side truth against a real llama.cpp `llama-server` (../shared/realserver-llamacpp/, built
# here under LCPP): replay a slice of a shipped Mooncake trace with --scrape-metrics and print, per
# run, the prefix-cache hit rate three ways: achieved by the server's own counters
# (Δllamacpp:prompt_tokens_cached_total / Δ(prompt_tokens_total + prompt_tokens_cached_total)), summed
# from the per-response `timings.cache_n`, and theoretical (vLLM's block rule over the trace's hash
# ids at --server-block-size SERVER_BLOCK), beside the TTFT breakdown the `timings` give (server TTFT
# = prompt_ms; llama.cpp reports no queue time, so a wait in its queue is in "unattributed").
#
# Each run restarts the server (a cold cache, counters at 0). The server runs with llama.cpp's
# default 8 HTTP threads (THREADS_HTTP), the setting under which a "before" scrape taken after the
# warm connections timed out. Needs the real server; never run by CI or tests.
#
# Usage: tools/bench/bench_llamacpp.sh [OUTDIR]    (build first: cargo build --release)
# Env: LCPP (required: a copy of ../shared/realserver-llamacpp/ set up with its install.sh; its start.sh/stop.sh), PORT (8090), N (100 requests), SPEED (4),
#      TRACE (traces/mooncake_conversation_1k.jsonl, a Mooncake JSONL: its first N rows are scaled
#      from 512 to BLOCK tokens per hash id, lengths with them, so prompts fit the 4,096-token
#      slots; a row that would still not fit its slot, SLOT tokens with MAX_TOKENS of output, is
#      left out, so the theoretical rate counts only what the server can serve), BLOCK (32),
#      SERVER_BLOCK (1: llama.cpp reuses any common prefix, token by token, up to L - 1 tokens,
#      which is vLLM's rule at block size 1), MAX_TOKENS (16, caps every request's output),
#      SLOT (4096), RUNS (3), THREADS_HTTP (8), BIN (target/release/retrace)
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/retrace}
LCPP=${LCPP:?set LCPP to a copy of ../shared/realserver-llamacpp/ set up with its install.sh}
PORT=${PORT:-8090}
N=${N:-100}
SPEED=${SPEED:-4}
TRACE=${TRACE:-traces/mooncake_conversation_1k.jsonl}
BLOCK=${BLOCK:-32}
SERVER_BLOCK=${SERVER_BLOCK:-1}
MAX_TOKENS=${MAX_TOKENS:-16}
SLOT=${SLOT:-4096}
RUNS=${RUNS:-3}
OUT=${1:-$(mktemp -d /tmp/bench_llamacpp.XXXX)}
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
[ -x "$LCPP/start.sh" ] || { echo "no $LCPP/start.sh (build ../shared/realserver-llamacpp first)" >&2; exit 2; }
mkdir -p "$OUT"
trap '"$LCPP/stop.sh" "$PORT" >/dev/null 2>&1 || true' EXIT
SLICE="$OUT/slice.jsonl"
python3 - "$TRACE" "$N" "$BLOCK" "$(( SLOT - MAX_TOKENS ))" >"$SLICE" <<'PY'
import json, math, sys
path, n, block, fits = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
kept = 0
with open(path) as f:
    for line in f:
        if kept == n:
            break
        r = json.loads(line)
        for k in ("input_length", "output_length"):
            r[k] = max(1, math.ceil(r[k] * block / 512))
        if r["input_length"] <= fits:
            print(json.dumps(r))
            kept += 1
PY

echo "# bench_llamacpp $(date -u +%Y-%m-%dT%H:%MZ): first $N fitting requests of $TRACE at speed $SPEED, block $BLOCK, server block $SERVER_BLOCK, max_tokens $MAX_TOKENS, llama-server --threads-http ${THREADS_HTTP:-8}"
printf '%-4s %5s %-9s %6s %6s %9s %9s %9s %9s %9s %9s\n' run ok family before failed achieved per_resp theory ttft_ms srv_ttft unattr
for run in $(seq "$RUNS"); do
  "$LCPP/stop.sh" "$PORT" >/dev/null 2>&1 || true
  THREADS_HTTP=${THREADS_HTTP:-8} "$LCPP/start.sh" "$PORT" >"$OUT/start$run.log"
  "$BIN" replay "$SLICE" --target "http://127.0.0.1:$PORT" --limit "$N" --speed "$SPEED" \
    --block-size "$BLOCK" --server-block-size "$SERVER_BLOCK" \
    --extra-body "{\"max_tokens\":$MAX_TOKENS}" --scrape-metrics --detailed \
    --result-json "$OUT/run$run.json" >"$OUT/run$run.txt" 2>&1 || true
  python3 - "$OUT/run$run.json" "$run" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
sm = r.get("server_metrics") or {}
pc = sm.get("prefix_cache") or {}
per = r.get("server_prefix_cache") or {}
pct = lambda x: "n/a" if x is None else f"{100 * x:.2f}%"
ms = lambda x: "n/a" if x is None else f"{x:.2f}"
print(f"{sys.argv[2]:<4} {r['completed']:>5} {str(sm.get('family')):<9} {str(sm.get('before_ok')):>6} "
      f"{sm.get('failed_scrapes', 'n/a'):>6} {pct(pc.get('hit_rate')):>9} {pct(per.get('hit_rate')):>9} "
      f"{pct(pc.get('theoretical_hit_rate')):>9} {ms(r.get('mean_ttft_ms')):>9} "
      f"{ms(r.get('mean_server_ttft_ms')):>9} {ms(r.get('mean_unattributed_ms')):>9}")
EOF
done
echo "# console output and result files: $OUT"
