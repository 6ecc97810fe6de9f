#!/usr/bin/env bash
# Instructions per parse of response bodies and SSE chunks (callgrind, only the parse loop counted),
# for one or more builds of the `bench_chunk` example side by side (tools/bench/bench_chunk.rs).
# Usage: tools/bench/bench_chunk_cpu.sh [BENCH_CHUNK_BIN ...]   (default: the release build of this tree)
#        N=20000 tools/bench/bench_chunk_cpu.sh target/baseline-bench_chunk target/release/examples/bench_chunk
# "chunk" is openai::parse_chunk (replay and the recorder's stream events), "body" the recorder's
# reader of a non-streamed body. Needs valgrind. No network; bounded (N parses per sample).
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "valgrind not found: apt-get install -y valgrind" >&2; exit 1; }
N=${N:-10000}
BINS=("$@")
if [ ${#BINS[@]} -eq 0 ]; then
  cargo build --release --quiet --example bench_chunk
  BINS=("${CARGO_TARGET_DIR:-target}/release/examples/bench_chunk")
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
printf '| sample | what |'; for b in "${BINS[@]}"; do printf ' %s |' "$b"; done; echo
printf '|---|---|'; for _ in "${BINS[@]}"; do printf -- '---|'; done; echo
for s in small vllm_body vllm_body_plain vllm_event vllm_usage; do
  for w in body chunk; do
    printf '| %s | %s |' "$s" "$w"
    for b in "${BINS[@]}"; do
      valgrind --tool=callgrind --callgrind-out-file="$T/cg" --toggle-collect="bench_chunk::measure_$w" \
        "$b" "$s" "$w" --n "$N" >/dev/null 2>"$T/log"
      ir=$(callgrind_annotate "$T/cg" 2>/dev/null | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,)
      printf ' %s |' "$(( ir / N ))"
    done
    echo
  done
done
