#!/usr/bin/env bash
# CPU cost of `retrace replay` per streamed SSE event and per request, counted in user-space
# instructions by callgrind (repeatable on a shared, noisy machine, unlike wall-clock CPU time).
# Loopback only, bounded.
# Usage: tools/bench/bench_replay_cpu.sh [RETRACE_BIN ...]   (default: target/release/retrace)
# e.g.   tools/bench/bench_replay_cpu.sh /tmp/retrace-before target/release/retrace   (before vs after)
#        READERS="auto 0" tools/bench/bench_replay_cpu.sh   (one binary, each --reader-threads value in
#        turn, alternating per run so load drift hits both alike; default: the binary's default)
# For each binary, the replayer runs under callgrind against a `retrace mock --fixed-timing 50,20`
# (native, same binary) three times: R requests x T tokens with (R, T) = (40, 50), (40, 150) and
# (120, 50), at most 20 in flight (closed loop). Marginal instructions:
#   per event   = (Ir(40x150) - Ir(40x50)) / (40 x 100)          (requests and start-up cancel out)
#   per request = (Ir(120x50) - Ir(40x50)) / 80 - 51 x per-event  (its 51 events removed)
# Setup (trace read, bodies, connections) is in all three and cancels out. At 20 streams x 50
# events/s the replayer reads one event per socket read even under valgrind, as it does natively
# at 1,000 streams when it keeps up. The kernel's share (socket reads) is not counted.
# KEEP=DIR keeps the callgrind files (DIR/<binary name>_cg_<run><client>.out) for callgrind_annotate.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "valgrind is needed" >&2; exit 2; }
BINS=("$@")
[ ${#BINS[@]} -eq 0 ] && BINS=(target/release/retrace)
T=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$T"' EXIT
gen() { # gen FILE N OUTPUT_TOKENS
  python3 - "$@" <<'PY'
import json, sys
path, n, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "w") as f:
    for i in range(n):
        f.write(json.dumps({"timestamp": 0, "input_length": 100, "output_length": out, "hash_ids": [i]}) + "\n")
PY
}
gen "$T/a.jsonl" 40 50
gen "$T/b.jsonl" 40 150
gen "$T/c.jsonl" 120 50
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
read -r -a CL <<<"${READERS:-default}"
for bin in "${BINS[@]}"; do
  abs=$(readlink -f "$bin")
  PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$abs" mock --listen "127.0.0.1:$PORT" --fixed-timing 50,20 --max-num-seqs 100000 >"$T/mock.log" 2>&1 &
  M=$!
  for _ in $(seq 50); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1 && break; sleep 0.1; done
  declare -A IR
  for k in a b c; do
    for cl in "${CL[@]}"; do
      extra=()
      [ "$cl" != default ] && extra=(--reader-threads "$cl")
      valgrind --tool=callgrind --log-file="$T/vg_$k$cl.log" --callgrind-out-file="$T/cg_$k$cl.out" \
        "$abs" replay "$T/$k.jsonl" --target "http://127.0.0.1:$PORT" --model mock-llama \
        --max-concurrency 20 --result-json "$T/$k$cl.json" "${extra[@]}" >"$T/replay_$k$cl.log" 2>&1
      IR[$k$cl]=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$T/vg_$k$cl.log")
      python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["failed"] == 0, d["failed"]; assert d["completed"] > 0' "$T/$k$cl.json"
    done
  done
  kill $M 2>/dev/null || true
  wait $M 2>/dev/null || true
  for cl in "${CL[@]}"; do
    ev=$(( (IR[b$cl] - IR[a$cl]) / 4000 ))
    rq=$(( (IR[c$cl] - IR[a$cl]) / 80 - 51 * ev ))
    echo "$bin (reader threads $cl): $ev instructions per SSE event, $rq per request beyond its events (Ir ${IR[a$cl]} / ${IR[b$cl]} / ${IR[c$cl]})"
  done
  if [ -n "${KEEP:-}" ]; then
    for f in "$T"/cg_*.out; do cp "$f" "$KEEP/$(basename "$bin")_$(basename "$f")"; done
  fi
done
