#!/usr/bin/env bash
# `retrace synth` on the Mooncake conversation trace: synthesis speed, and a 10x what-if replayed
# against the mock with --scrape-metrics (achieved against theoretical prefix-cache hits).
#
#  1. synth --fit --scale-users 10 (ten times the users at ten times the rate, the same hour):
#     wall time → rows/s; the fitted trace's `inspect` beside the input's.
#  2. The AIPerf transforms on the same input (rows/s).
#  3. replay of the 10x trace's first LIMIT requests (default 3000: about 90 s of it) against
#     `retrace mock --fixed-timing 20,1` with a KV cache large enough to evict nothing, at the
#     trace's timing, --scrape-metrics: vllm:prefix_cache_hits_total against the hits an ideal
#     vLLM would have for what was sent (replay's theoretical figure).
#
# Env: RETRACE_BIN (default target/release/retrace), TRACE (default
# ../shared/traces/mooncake_conversation_trace.jsonl), LIMIT, OUT (work dir).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${RETRACE_BIN:-target/release/retrace}"
TRACE="${TRACE:-../shared/traces/mooncake_conversation_trace.jsonl}"
LIMIT="${LIMIT:-3000}"
OUT="${OUT:-$(mktemp -d /tmp/retrace-synth.XXXXXX)}"
mkdir -p "$OUT"
[ -x "$BIN" ] || cargo build --release --locked

secs() { python3 -c 'import sys,time; print(time.time())'; }
rows() { "$BIN" inspect "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["stats"]["requests"])'; }

echo "== synth --fit --scale-users 10 ($TRACE)"
t0=$(secs)
"$BIN" synth "$TRACE" -o "$OUT/x10.trace.zst" --fit --scale-users 10 --seed 1 --level 3
t1=$(secs)
n=$(rows "$OUT/x10.trace.zst")
python3 -c "print(f'fit + sample + write: {$n} rows in {$t1-$t0:.2f} s = {$n/($t1-$t0):,.0f} rows/s')"

echo "== transforms: --prefix-root-multiplier 4 --prompt-len-multiplier 2 --speedup 2"
t0=$(secs)
"$BIN" synth "$OUT/x10.trace.zst" -o "$OUT/tx.trace.zst" --prefix-root-multiplier 4 \
  --prompt-len-multiplier 2 --speedup 2 --level 3
t1=$(secs)
python3 -c "print(f'{$n} rows in {$t1-$t0:.2f} s = {$n/($t1-$t0):,.0f} rows/s')"

echo "== inspect: input, then the 10x trace"
"$BIN" inspect "$TRACE" --cache-blocks 10000
"$BIN" inspect "$OUT/x10.trace.zst" --cache-blocks 10000

echo "== replay of the first $LIMIT requests against the mock, --scrape-metrics"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN" mock --listen "127.0.0.1:$PORT" --fixed-timing 20,1 --kv-cache-tokens 1000000000 \
  >"$OUT/mock.log" 2>&1 &
MOCK=$!
trap 'kill $MOCK 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
"$BIN" replay "$OUT/x10.trace.zst" --target "http://127.0.0.1:$PORT" --limit "$LIMIT" \
  --scrape-metrics --result-json "$OUT/replay.json" 2>&1 | tee "$OUT/replay.txt" | \
  grep -iE "prefix|theoretical|requests|successful|duration|achieved" || true
echo "outputs in $OUT"
