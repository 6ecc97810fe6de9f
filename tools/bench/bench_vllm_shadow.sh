#!/usr/bin/env bash
# `record --shadow` against real vLLM 0.32 (CPU build, tiny random-weight Llama): two servers of
# the same build on this machine, the openai SDK's traffic (tools/bench/bench_vllm_shadow.py)
# through `retrace record --upstream A --shadow B`, then `compare --shadow` of the recording.
# ROUNDS rounds, each twice with the roles swapped (A primary then B primary), so what follows a
# server and what follows the role can be told apart. CONTROL=1 starts a third server C, sent
# every request as `--shadow-control`, and rotates the three roles over three runs a round.
# Per run: pairs, client cancels the recorder counted, output agreement, the paired shadow −
# primary changes and their verdicts (judged against the control's band with CONTROL=1).
#
# Usage: RETRACE_VLLM=DIR [ROUNDS=2] [CONTROL=0] [BIN=target/release/retrace] tools/bench/bench_vllm_shadow.sh
#   (DIR: a copy of ../shared/realserver-vllm/ after its install.sh; build first: cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${RETRACE_VLLM:?RETRACE_VLLM=DIR, a vLLM install made from ../shared/realserver-vllm/}"
ROUNDS=${ROUNDS:-2}
CONTROL=${CONTROL:-0}
BIN=${BIN:-target/release/retrace}
PY="$RETRACE_VLLM/venv-vllm/bin/python"   # the vLLM venv carries the openai SDK
WORK=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
A=$(free_port); B=$(free_port); C=
if [ "$CONTROL" = 1 ]; then C=$(free_port); fi
cleanup() {
  pkill -INT -f "$BIN record --listen 127.0.0.1:$REC " 2>/dev/null || true
  timeout 60 "$RETRACE_VLLM/stop.sh" "$A" >/dev/null 2>&1 || true
  timeout 60 "$RETRACE_VLLM/stop.sh" "$B" >/dev/null 2>&1 || true
  [ -z "$C" ] || timeout 60 "$RETRACE_VLLM/stop.sh" "$C" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
REC=$(free_port); ADM=$(free_port)
trap cleanup EXIT
for p in "$A" "$B" $C; do
  START_TIMEOUT=300 timeout 330 "$RETRACE_VLLM/start.sh" "$p" --block-size 32 >&2
done
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg), servers A=:$A B=:$B${C:+ C=:$C}"
printf '| run | primary | shadow | control | pairs | client cancels | agreement | TTFT mean | TTFT median | ITL mean | E2EL mean | E2EL median |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n'
if [ -n "$C" ]; then
  ORDERS=("A $A B $B C $C" "B $B C $C A $A" "C $C A $A B $B")
else
  ORDERS=("A $A B $B - -" "B $B A $A - -")
fi
run=0
for r in $(seq 1 "$ROUNDS"); do
  for order in "${ORDERS[@]}"; do
    set -- $order
    run=$((run + 1))
    out="$WORK/rec-$run"
    control=()
    [ "$6" = - ] || control=(--shadow-control "http://127.0.0.1:$6")
    "$BIN" record --listen "127.0.0.1:$REC" --upstream "http://127.0.0.1:$2" --shadow "http://127.0.0.1:$4" \
      "${control[@]}" --out "$out" --admin "127.0.0.1:$ADM" 2>"$WORK/rec-$run.log" &
    rec=$!
    for _ in $(seq 1 100); do curl -s -o /dev/null "http://127.0.0.1:$ADM/healthz" && break; sleep 0.1; done
    timeout 300 "$PY" tools/bench/bench_vllm_shadow.py "http://127.0.0.1:$REC" >/dev/null
    cancels=$(curl -s "http://127.0.0.1:$ADM/metrics" | awk '/^retrace_record_client_cancelled_total/ {print $2}')
    kill -INT "$rec"; timeout 60 tail --pid="$rec" -f /dev/null || true
    timeout 120 "$BIN" compare --shadow "$out"/*.trace.zst --format json | python3 -c '
import json, sys
run, p, s, c, cancels = sys.argv[1:6]
v = json.load(sys.stdin)["shadows"][0]
t, rows = v["target"], {r["key"]: r for r in v["comparison"]["rows"]}
ch = lambda k: "%+.2f ms (%s)" % (rows[k]["abs_change"], rows[k]["verdict"])
agree = "%d of %d" % (t["identical"], t["deterministic"])
print("| %s | %s | %s | %s | %d of %d | %s | %s | %s |" % (run, p, s, c, t["pairs"], t["copies"], cancels, agree,
      " | ".join(ch(k) for k in ["mean_ttft_ms", "median_ttft_ms", "mean_itl_ms", "mean_e2el_ms", "median_e2el_ms"])))
' "$run" "$1" "$3" "$5" "$cancels"
  done
done
