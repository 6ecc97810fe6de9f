# Shared by tools/bench_record.sh and tools/bench_record_h2.sh (sourced, not run): the build, the
# scratch directory and its cleanup, and the two processes every round talks to: the scripted SSE
# upstream (bench_record upstream) and `retrace record` in front of it. Uses the caller's OUT, TGT,
# UP, REC, ADM, TTFT_MS, ITL_MS, TOKENS; sets WORK, PIDS, B and REC_PID.

bench_setup() {
  cargo build --release --quiet --bin retrace --example bench_record
  mkdir -p "$OUT"
  WORK=$(mktemp -d)
  PIDS=()
  trap bench_cleanup EXIT
}

bench_cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}

start_upstream_and_recorder() {
  B="$TGT/examples/bench_record"
  "$B" upstream --listen 127.0.0.1:$UP --ttft-ms "$TTFT_MS" --itl-ms "$ITL_MS" --tokens "$TOKENS" --lifetime-s 3600 &
  PIDS+=($!)
  RUST_LOG=warn "$TGT/retrace" record --listen 127.0.0.1:$REC --upstream http://127.0.0.1:$UP \
    --out "$WORK/traces" --admin 127.0.0.1:$ADM 2>"$WORK/retrace.log" &
  REC_PID=$!
  PIDS+=($REC_PID)
}
