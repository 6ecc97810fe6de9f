#!/usr/bin/env bash
# Scale-out benchmark (docs/scale-out.md; figures in docs/benchmarks.md, "Scale-out").
#
#   tools/bench/bench_shards.sh [OUT_DIR]
#
# Sections (SECTIONS, default "ceiling shards"):
#   ceiling  one replay process's highest sustained request rate: an open-loop ladder of rates
#            against `retrace mock --fixed-timing 50,10`, RATE_SECONDS (default 4) per step, for
#            2-token and 64-token outputs (LADDERS, OUTPUTS:RATES, default
#            "2:500,1000,2000,4000,8000,16000 64:125,250,500,1000,2000,4000"). A step passes when
#            send drift p99 is below BOUND_MS (default 1), nothing failed and the process kept up
#            (achieved rate at least 97 % of a run that kept up: column `kept`); each ladder
#            stops at its first failing step.
#   shards   4 shards started together with --start-at, merged, against one process on the same
#            trace (TRACE, default traces/mooncake_conversation_1k.jsonl, at SPEED, default 3:
#            about 110 s of schedule a run),
#            each run against a fresh `retrace mock --profile fast` (continuous batching and a
#            prefix cache: latency depends on what arrives together, so misaligned shards would
#            show). A second single-process run is the noise band: `retrace compare ONE MERGED
#            --noise ONE_AGAIN`.
# BIN (default target/release/retrace). The client and the mock share this machine's cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/retrace}
OUT=${1:-$(mktemp -d /tmp/bench_shards.XXXX)}
SECTIONS=${SECTIONS:-"ceiling shards"}
RATE_SECONDS=${RATE_SECONDS:-4}
BOUND_MS=${BOUND_MS:-1}
TRACE=${TRACE:-traces/mooncake_conversation_1k.jsonl}
SPEED=${SPEED:-3}
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
has() { [[ " $SECTIONS " == *" $1 "* ]]; }
echo "bench_shards: $(date -u +%FT%TZ), $($BIN --version), load average $(cut -d" " -f1-3 /proc/loadavg), outputs in $OUT"

MOCK=""
trap '[ -n "$MOCK" ] && kill "$MOCK" 2>/dev/null || true' EXIT
mock_start() { # mock_start LOG ARGS...: a fresh mock; sets PORT and MOCK
  local log=$1; shift
  PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$BIN" mock --listen "127.0.0.1:$PORT" "$@" >"$log" 2>&1 &
  MOCK=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "mock did not start: $(cat "$log")" >&2; exit 1
}
mock_stop() { kill "$MOCK" 2>/dev/null || true; wait "$MOCK" 2>/dev/null || true; MOCK=""; }
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(" ".join(f"{d[k]:.3f}" if isinstance(d[k], float) else str(d[k]) for k in sys.argv[2:]))' "$@"; }

if has ceiling; then
  echo
  echo "== ceiling: one process, open loop, ${RATE_SECONDS} s per step, pass = p99 send drift < ${BOUND_MS} ms and no failure =="
  mock_start "$OUT/mock_ceiling.log" --fixed-timing 50,10 --max-num-seqs 100000
  printf "%-8s %-8s %-8s %-12s %-12s %-10s %-6s %-8s %-6s\n" outputs rate reqs p99_drift_ms max_drift_ms achieved kept failed pass
  for ladder in ${LADDERS:-2:500,1000,2000,4000,8000,16000 64:125,250,500,1000,2000,4000}; do
    OSL=${ladder%%:*} RATES=${ladder#*:}
    for RATE in ${RATES//,/ }; do
      N=$((RATE * RATE_SECONDS))
      F="$OUT/ceiling_${OSL}_${RATE}"
      # arrivals 1 ms apart, compressed by --speed to RATE per second
      python3 -c 'import json,sys
n, out = int(sys.argv[2]), int(sys.argv[3])
with open(sys.argv[1], "w") as f:
    for i in range(n):
        f.write(json.dumps({"timestamp": i, "input_length": 100, "output_length": out, "hash_ids": [i]}) + "\n")' "$F.jsonl" "$N" "$OSL"
      "$BIN" replay "$F.jsonl" --target "http://127.0.0.1:$PORT" --model mock-llama \
        --speed "$(python3 -c "print($RATE / 1000)")" --result-json "$F.json" >"$F.log" 2>&1 || true
      if [ ! -f "$F.json" ]; then # the run failed: its error is the log's last line
        printf "%-8s %-8s %-8s %s\n" "$OSL" "$RATE" "$N" "no result: $(tail -1 "$F.log")"; rm -f "$F.jsonl"; break
      fi
      read -r PD MD RR FL <<<"$(field "$F.json" p99_drift_ms max_drift_ms request_throughput failed)"
      # kept: achieved rate over the rate of a run that kept up (N requests over the schedule
      # plus one stream's life, 50 ms + (OSL-1) x 10 ms)
      KEPT=$(python3 -c "print(f'{$RR / ($N / ($RATE_SECONDS + 0.05 + ($OSL - 1) * 0.01)):.2f}')")
      OK=$(python3 -c "print('yes' if $PD < $BOUND_MS and $FL == 0 and $KEPT >= 0.97 else 'no')")
      printf "%-8s %-8s %-8s %-12s %-12s %-10s %-6s %-8s %-6s\n" "$OSL" "$RATE" "$N" "$PD" "$MD" "$RR" "$KEPT" "$FL" "$OK"
      rm -f "$F.jsonl"
      [ "$OK" = yes ] || break
    done
  done
  mock_stop
fi

if has shards; then
  echo
  echo "== shards: $TRACE at --speed $SPEED, one process twice, then 4 shards with --start-at; each against a fresh mock --profile fast =="
  one() { # one NAME [replay flags...]
    local name=$1; shift
    mock_start "$OUT/mock_$name.log" --profile fast --enable-per-request-metrics
    "$BIN" replay "$TRACE" --target "http://127.0.0.1:$PORT" --seed 0 --speed "$SPEED" --detailed \
      --result-json "$OUT/$name.json" "$@" >"$OUT/$name.log" 2>&1
    mock_stop
  }
  one whole
  one whole_again
  mock_start "$OUT/mock_shards.log" --profile fast --enable-per-request-metrics
  AT=$(( $(date +%s) + 10 ))
  PIDS=()
  for i in 0 1 2 3; do
    "$BIN" replay "$TRACE" --target "http://127.0.0.1:$PORT" --seed 0 --speed "$SPEED" --detailed \
      --shard "$i/4" --start-at "$AT" --result-json "$OUT/shard-$i.json" >"$OUT/shard-$i.log" 2>&1 &
    PIDS+=($!)
  done
  for p in "${PIDS[@]}"; do wait "$p"; done
  mock_stop
  "$BIN" merge "$OUT"/shard-{0,1,2,3}.json -o "$OUT/merged.json"
  python3 - "$OUT/whole.json" "$OUT/merged.json" "$OUT/whole_again.json" <<'PY'
import json, sys
runs = [(n, json.load(open(p))) for n, p in zip(["one process", "4 shards merged", "one process again"], sys.argv[1:])]
keys = ["num_prompts", "completed", "failed", "total_input_tokens", "total_output_tokens"]
lat = ["median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_e2el_ms", "p99_drift_ms"]
print(f"{'run':<20}" + "".join(f"{k:>20}" for k in keys + lat))
for n, d in runs:
    print(f"{n:<20}" + "".join(f"{d[k]:>20}" for k in keys) + "".join(f"{d[k]:>20.2f}" for k in lat))
same = all(runs[0][1][k] == runs[1][1][k] for k in keys)
print("counts and token totals equal:", "yes" if same else "NO")
PY
  "$BIN" compare "$OUT/whole.json" "$OUT/merged.json" --noise "$OUT/whole_again.json" | tee "$OUT/compare.txt"
fi
