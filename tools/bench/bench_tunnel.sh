#!/usr/bin/env bash
# Instructions the recorder spends on upgraded tunnels (WebSocket passthrough), measured with
# callgrind so the numbers repeat on a busy machine. The bench_tunnel example runs direct and
# through the recorder with the same client and upstream work, so proxied - direct is the
# proxy's cost (setup included). Three shapes per target separate the setup (recorder start and
# stop, handshake), the cost per 64-byte round trip and the cost per MiB echoed:
#   c = 10 round trips + 1 MiB,  a = N round trips + 1 MiB,  b = 10 round trips + M MiB
#   per round trip = (a - c) / (N - 10),  per MiB = (b - c) / (M - 1)
# Usage: tools/bench/bench_tunnel.sh [N] [M]   (defaults 2000, 16)
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-2000}
M=${2:-16}
cargo build --release --example bench_tunnel >/dev/null 2>&1
BIN=target/release/examples/bench_tunnel
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
ir() { # target round_trips mib
  TARGETS=$1 valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.$1.$2.$3.%p" "$BIN" 1 "$2" "$3" >/dev/null 2>&1
  grep -h '^summary:' "$OUT"/cg.$1.$2.$3.* | awk '{s+=$2} END {print s}'
}
declare -A A B C
for t in direct retrace; do
  C[$t]=$(ir $t 10 1)
  A[$t]=$(ir $t "$N" 1)
  B[$t]=$(ir $t 10 "$M")
done
echo "callgrind instructions, whole process minus the direct run ($N round trips of 64 B; $M MiB echoed)"
printf "%-8s %14s %16s %18s\n" engine setup per-round-trip per-MiB-echoed
for t in retrace; do
  c=$(( C[$t] - C[direct] )); a=$(( A[$t] - A[direct] )); b=$(( B[$t] - B[direct] ))
  printf "%-8s %14d %16d %18d\n" "$t" "$c" $(( (a - c) / (N - 10) )) $(( (b - c) / (M - 1) ))
done
