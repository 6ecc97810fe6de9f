#!/usr/bin/env bash
# User-space instructions per small non-streamed request (callgrind), side by side in one run:
# `retrace record` (its own HTTP/1.1 loop) and nginx (one worker), each with one
# I/O thread / worker under valgrind, in front of the same upstream (tools/bench/bench_record.rs).
# Instruction counts are repeatable on a shared, loaded machine (unlike wall-clock numbers).
#
# Per target: start under callgrind, warm up (WARM_S s), zero the counters, run the small-request
# loop for SECS seconds at CONC connections, dump, and divide the program total by the requests
# the load generator completed. For retrace the total is split by thread: valgrind numbers
# threads in creation order, and `retrace record` starts the trace writer (thread 2) before its
# one I/O thread (thread 3); thread 1 only accepts.
#
# MODE=stream measures streams instead: REQS streamed completions of TOKENS events each (upstream
# TTFT 5 ms, one event every 2 ms) over CONC connections, instructions per stream.
#
# TARGETS picks what is measured (default "own nginx"); "before" is the own loop of
# another build, the binary named by BEFORE=path (e.g. a copy of target/release/retrace made
# before a change), so a change is measured side by side in one run. The callgrind files are
# kept in $OUT (callgrind.<target>.out*) for callgrind_annotate.
#
# Usage: tools/bench/bench_record_cpu.sh          (defaults: SECS=10 CONC=8 WARM_S=3)
#        MODE=stream CONC=20 REQS=400 tools/bench/bench_record_cpu.sh
#        TARGETS="before own nginx" BEFORE=target/baseline/retrace tools/bench/bench_record_cpu.sh
# Needs: valgrind, nginx (apt-get install -y valgrind nginx-light). Loopback only; bounded.
set -euo pipefail
cd "$(dirname "$0")/../.."

SECS=${SECS:-10}
CONC=${CONC:-8}
WARM_S=${WARM_S:-3}
BASE=${BASE_PORT:-18200}
UP=$((BASE + 1)); PX=$((BASE + 2))
TGT=${CARGO_TARGET_DIR:-target}/release
OUT=${OUT:-target/bench_record_cpu}
MODE=${MODE:-small}
TARGETS=${TARGETS:-own nginx}
BEFORE=${BEFORE:-}
REQS=${REQS:-400}
if [ "$MODE" = stream ]; then TTFT_MS=5; ITL_MS=2; TOKENS=${TOKENS:-100}; else TTFT_MS=1; ITL_MS=1; TOKENS=1; fi

command -v valgrind >/dev/null || { echo "valgrind not found: apt-get install -y valgrind" >&2; exit 1; }
command -v nginx >/dev/null || { echo "nginx not found: apt-get install -y nginx-light" >&2; exit 1; }
cargo build --release --quiet --bin retrace --example bench_record
mkdir -p "$OUT"
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
B="$TGT/examples/bench_record"
"$B" upstream --listen 127.0.0.1:$UP --ttft-ms $TTFT_MS --itl-ms $ITL_MS --tokens $TOKENS --lifetime-s 3600 &
PIDS+=($!)

. tools/bench/bench_record_common.sh   # write_nginx_conf only
write_nginx_conf "worker_processes 1;
master_process off;" "worker_connections 4096;" 256 "127.0.0.1:$PX"

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/loadavg.txt"
RES="$OUT/results.txt"
: >"$RES"
for t in $TARGETS; do
  bin="$TGT/retrace"
  if [ "$t" = before ]; then
    [ -x "$BEFORE" ] || { echo "TARGETS has before: set BEFORE=path to a retrace binary" >&2; exit 1; }
    bin=$BEFORE
  fi
  cg="$WORK/callgrind.$t.out"
  case $t in
    nginx) valgrind --tool=callgrind --callgrind-out-file="$cg" nginx -c "$WORK/nginx.conf" -p "$WORK/nginx" 2>"$WORK/vg-$t.log" & ;;
    *) RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$cg" --separate-threads=yes \
         "$bin" record --listen 127.0.0.1:$PX --upstream http://127.0.0.1:$UP \
         --out "$WORK/traces-$t" --admin none --io-threads 1 2>"$WORK/vg-$t.log" & ;;
  esac
  VPID=$!
  for _ in $(seq 1 300); do curl -s -o /dev/null "http://127.0.0.1:$PX/small" -d '{}' && break; sleep 0.1; done
  if [ "$MODE" = stream ]; then
    "$B" stream --url "http://127.0.0.1:$PX/v1/completions" --concurrency "$CONC" --requests "$CONC" --label warm >/dev/null
    callgrind_control -z "$VPID" >/dev/null 2>&1
    # --warmup 0: every request counted is a measured stream.
    line=$("$B" stream --url "http://127.0.0.1:$PX/v1/completions" --concurrency "$CONC" --requests "$REQS" --warmup 0 --label "$t")
  else
    "$B" small --url "http://127.0.0.1:$PX/small" --concurrency "$CONC" --seconds "$WARM_S" --label warm >/dev/null
    callgrind_control -z "$VPID" >/dev/null 2>&1
    line=$("$B" small --url "http://127.0.0.1:$PX/small" --concurrency "$CONC" --seconds "$SECS" --label "$t")
  fi
  callgrind_control -d "$VPID" >/dev/null 2>&1
  sleep 1
  kill -TERM "$VPID" 2>/dev/null || true
  wait "$VPID" 2>/dev/null || true
  reqs=$(python3 -c "import json,sys;print(json.loads(sys.argv[1])['requests'])" "$line")
  python3 - "$t" "$reqs" "$WORK" "$cg" >>"$RES" <<'PY'
import glob, re, subprocess, sys
t, reqs, work, cg = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
# The dump after zeroing ends in ".1" (per thread with --separate-threads: "-NN" suffixes).
files = [f for f in glob.glob(cg + "*") if re.search(r"\.1(-\d+)?$", f)]
total = 0
per_thread = {}
for f in files:
    out = subprocess.run(["callgrind_annotate", f], capture_output=True, text=True).stdout
    m = re.search(r"([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", out) or re.search(r"([\d,]+)\s+PROGRAM TOTALS", out)
    n = int(m.group(1).replace(",", "")) if m else 0
    total += n
    head = open(f, errors="replace").read(4000)
    name = re.search(r"^cmd: .*$", head, re.M)
    thr = re.search(r"^thread: (\d+)", head, re.M)
    per_thread[int(thr.group(1)) if thr else 1] = n
per = lambda k: f"{per_thread.get(k, 0) / max(reqs, 1):.0f}"
io, wr = (per(3), per(2)) if t != "nginx" else (f"{total / max(reqs, 1):.0f}", "-")
print(f"{t}\trequests={reqs}\tinstructions={total}\tper_request={total / max(reqs, 1):.0f}\tio={io}\twriter={wr}")
PY
  tail -1 "$RES"
  rm -f "$OUT"/callgrind."$t".out*
  cp "$cg"* "$OUT"/ 2>/dev/null || true
done
echo
echo "| target | requests | user-space instructions per $MODE request | of which I/O thread (nginx: its worker) | of which trace writer |"
echo "|---|---|---|---|---|"
awk -F'\t' '{split($2,a,"=");split($4,b,"=");split($5,c,"=");split($6,d,"=");printf "| %s | %s | %s | %s | %s |\n",$1,a[2],b[2],c[2],d[2]}' "$RES"
