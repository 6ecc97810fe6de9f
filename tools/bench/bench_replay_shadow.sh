#!/usr/bin/env bash
# Send drift of `replay --shadow` (two targets, every request due at the same instant on each)
# beside a single-target replay, in the same run: an open loop at RATE req/s for SECONDS s,
# 2-token outputs, against fresh `retrace mock --fixed-timing 50,10` servers (one per target).
# A third mode, `double`, is a single target at twice the rate (--speed 2): as many sends as the
# dual run makes, from one dispatcher. Rounds rotate the modes; prints each run's p99 / max send drift per side, then the
# medians over ROUNDS and the ratio dual / single of the p99 drift medians.
# With BIN_B (another build), a fourth mode `dual_b` is the dual run by that build, in the same
# rounds (A/B of the dual path).
# Usage: tools/bench/bench_replay_shadow.sh   (build first: cargo build --release)
# Env: RATE (default 1000), SECONDS_ (default 5), ROUNDS (default 3), BIN, BIN_B, MOCK_NICE (run
# the mocks at this nice value, e.g. 19: on these shared cores a mock woken by a send can then not
# preempt a dispatcher, as a server on another machine cannot; every mode alike).
# Loopback only; bounded by RATE × SECONDS_ requests a run and a 300 s limit on every replay.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/retrace}
RATE=${RATE:-1000}; SECS=${SECONDS_:-5}; ROUNDS=${ROUNDS:-3}
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
T=$(mktemp -d)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; rm -rf "$T"' EXIT
N=$((RATE * SECS))
python3 - "$T/open.jsonl" "$N" "$RATE" <<'PY'
import json, sys
path, n, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "w") as f:
    for i in range(n):
        f.write(json.dumps({"timestamp": i * 1000 // rate, "input_length": 100, "output_length": 2, "hash_ids": [i]}) + "\n")
PY
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
mock() { # mock VAR: a fresh mock, its URL in VAR (not in a subshell: its pid is kept to stop it)
  local p; p=$(port)
  ${MOCK_NICE:+nice -n "$MOCK_NICE"} "$BIN" mock --listen "127.0.0.1:$p" --fixed-timing 50,10 --max-num-seqs 100000 >/dev/null 2>&1 &
  PIDS+=($!)
  for _ in $(seq 50); do curl -sf "http://127.0.0.1:$p/v1/models" >/dev/null 2>&1 && break; sleep 0.1; done
  printf -v "$1" '%s' "http://127.0.0.1:$p"
}
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(" ".join(f"{d[k]:.3f}" for k in sys.argv[2:]))' "$@"; }
echo "# bench_replay_shadow $(date -u +%Y-%m-%dT%H:%MZ): $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# open loop, $RATE req/s for $SECS s ($N requests), 2-token outputs, $ROUNDS rounds, mocks at nice ${MOCK_NICE:-0}"
printf "%-6s %-7s %-8s %-14s %-14s %-10s %-10s\n" round mode side p99_drift_ms max_drift_ms mean_ttft failed
for r in $(seq "$ROUNDS"); do
  case $((r % 3)) in 1) order="single dual double" ;; 2) order="dual double single" ;; *) order="double single dual" ;; esac
  [ -n "${BIN_B:-}" ] && case $((r % 2)) in 1) order="$order dual_b" ;; *) order="dual_b $order" ;; esac
  for mode in $order; do
    mock A; mock B
    bin=$BIN; [ "$mode" = dual_b ] && bin=$BIN_B
    args=("$T/open.jsonl" --target "$A" --model mock-llama --detailed --result-json "$T/$mode.json")
    case $mode in dual*) args+=(--shadow "$B") ;; esac
    [ "$mode" = double ] && args+=(--speed 2)
    timeout 300 "$bin" replay "${args[@]}" >"$T/$mode.log" 2>&1 || { echo "replay failed:"; tail -5 "$T/$mode.log"; exit 1; }
    sides=("target:$T/$mode.json"); case $mode in dual*) sides+=("shadow:$T/$mode.shadow-1.json") ;; esac
    for s in "${sides[@]}"; do
      read -r PD MD MT F <<<"$(field "${s#*:}" p99_drift_ms max_drift_ms mean_ttft_ms failed)"
      printf "%-6s %-7s %-8s %-14s %-14s %-10s %-10s\n" "$r" "$mode" "${s%%:*}" "$PD" "$MD" "$MT" "$F" | tee -a "$T/rows"
    done
    kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; PIDS=()
  done
done
python3 - "$T/rows" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
def med(mode, side):
    v = [float(r[3]) for r in rows if r[1] == mode and r[2] == side]
    return statistics.median(v) if v else float("nan")
single, dual_t, dual_s = med("single", "target"), med("dual", "target"), med("dual", "shadow")
double = med("double", "target")
print(f"median p99 send drift ms: single {single:.3f}; dual: target {dual_t:.3f}, shadow {dual_s:.3f}; single at twice the rate {double:.3f}")
print(f"dual / single: target {dual_t / single:.2f}, shadow {dual_s / single:.2f}")
b_t, b_s = med("dual_b", "target"), med("dual_b", "shadow")
if b_t == b_t:
    print(f"BIN_B dual: target {b_t:.3f}, shadow {b_s:.3f}; dual / BIN_B dual: target {dual_t / b_t:.2f}, shadow {dual_s / b_s:.2f}")
PY
