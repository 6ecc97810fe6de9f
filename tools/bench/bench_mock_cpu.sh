#!/usr/bin/env bash
# CPU cost per SSE event of `retrace mock`, counted in user-space instructions by callgrind
# (repeatable on a shared, noisy machine, unlike wall-clock CPU time). Loopback only, bounded.
# Usage: tools/bench/bench_mock_cpu.sh [RETRACE_BIN ...]   (default: target/release/retrace)
# e.g.   tools/bench/bench_mock_cpu.sh /tmp/retrace-main target/release/retrace   (before vs after)
# For each binary it runs the mock under callgrind twice, driven by tools/bench/bench_mock.rs with 20
# streams x 100 tokens at --fixed-timing 50,20, for 2 s and for 6 s, and reports
# (Ir(6 s) - Ir(2 s)) / (events(6 s) - events(2 s)): the marginal instructions per event, with
# request handling amortized (1 request per 101 events) and start-up cancelled out. The kernel's
# share (the socket write itself, about 3-4 us per event on loopback here) is not counted: use
# tools/bench/bench_mock.sh's CPU figures (/proc) for the all-in cost.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "valgrind is needed" >&2; exit 2; }
cargo build --release --example bench_mock
B=target/release/examples/bench_mock
BINS=("$@")
[ ${#BINS[@]} -eq 0 ] && BINS=(target/release/retrace)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
for bin in "${BINS[@]}"; do
  abs=$(readlink -f "$bin")
  declare -A IR EV
  for secs in 2 6; do
    cat > "$T/wrap.sh" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind --log-file=$T/vg.log --callgrind-out-file=$T/cg.out "$abs" "\$@"
EOF
    chmod +x "$T/wrap.sh"
    out=$($B --retrace "$T/wrap.sh" --label cpu --streams 20 --tokens 100 --ttft 50 --itl 20 --secs $secs)
    # The mock's own count of events (tokens + ends), from its Ctrl-C summary line.
    EV[$secs]=$(echo "$out" | sed -n 's/.*retrace mock: \([0-9]*\) events.*/\1/p')
    IR[$secs]=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$T/vg.log")
  done
  per=$(( (IR[6] - IR[2]) / (EV[6] - EV[2]) ))
  echo "$bin: $per instructions per SSE event (Ir ${IR[2]} / ${IR[6]}, events ${EV[2]} / ${EV[6]})"
done
