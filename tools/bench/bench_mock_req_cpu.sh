#!/usr/bin/env bash
# CPU cost of `retrace mock` per request, in user-space instructions counted by callgrind
# (repeatable on a shared, noisy machine). Loopback only, bounded.
# Usage: tools/bench/bench_mock_req_cpu.sh [RETRACE_BIN ...]   (default: target/release/retrace)
# For each binary the mock runs under callgrind twice (`--fixed-timing 50,10`), loaded by the
# same binary's replayer (native) with 400 and with 1,200 requests of 100 prompt tokens and
# 2-token outputs, at most 50 in flight; reports (Ir(1200) - Ir(400)) / 800: the marginal
# instructions per request, its 2 events and stream end included, start-up cancelled out. This
# is the mock's serial cost when a burst of requests arrives at once (see docs/replay.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "valgrind is needed" >&2; exit 2; }
BINS=("$@")
[ ${#BINS[@]} -eq 0 ] && BINS=(target/release/retrace)
T=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$T"' EXIT
for n in 400 1200; do
  python3 - "$T/short$n.jsonl" $n <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        f.write(json.dumps({"timestamp": 0, "input_length": 100, "output_length": 2, "hash_ids": [i]}) + "\n")
PY
done
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for bin in "${BINS[@]}"; do
  abs=$(readlink -f "$bin")
  declare -A IR
  for n in 400 1200; do
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    valgrind --tool=callgrind --callgrind-out-file="$T/cg_$n.out" --log-file="$T/vg_$n.log" \
      "$abs" mock --listen "127.0.0.1:$PORT" --fixed-timing 50,10 --max-num-seqs 100000 >"$T/mock.log" 2>&1 &
    M=$!
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1 && break; sleep 0.2; done
    "$abs" replay "$T/short$n.jsonl" --target "http://127.0.0.1:$PORT" --model mock-llama \
      --max-concurrency 50 --result-json "$T/r.json" >/dev/null 2>&1
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["failed"] == 0, d["failed"]' "$T/r.json"
    kill -INT $M; wait $M || true
    IR[$n]=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$T/vg_$n.log")
  done
  echo "$bin: $(( (IR[1200] - IR[400]) / 800 )) instructions per request (Ir ${IR[400]} / ${IR[1200]})"
done
