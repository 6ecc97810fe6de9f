#!/usr/bin/env bash
# Overhead of `retrace record`, side by side with nginx (proxy_buffering off) and a direct baseline,
# all in one run against the same fixed-timing SSE upstream (tools/bench/bench_record.rs).
#
# Targets: direct, floor-epoll, retrace, nginx, and floor (not in the default set); TARGETS="direct floor-epoll
# retrace nginx" runs a subset.
#   floor-epoll: the latency floor of any proxy hop, tools/bench/fwd_floor.rs (example fwd_floor
#     --mode epoll): a plain TCP forwarder, no HTTP parsing, no recording, one upstream connection
#     per client connection, one thread over epoll (TCP_NODELAY both sides). Whatever it adds
#     over direct (the second socket hop, the wake-up of the proxy, the client woken from another
#     CPU) any proxy adds; "over floor" in the summary is a proxy's latency minus the floor's.
#   floor: the same forwarder with one blocking thread per direction. At 1,000 streams (25,000
#     chunks/s on one core) it is above floor-epoll (one thread switch per chunk instead of one
#     wake-up per burst of chunks, see tools/bench/bench_record.md), and its 2,000 threads raise
#     the load average while it runs.
# retrace-a: a second recorder of this build with retrace's flags, so that retrace against
#   retrace-a is an A/A pair: the same-run noise band that a difference of retrace-b is read against.
# retrace-b: a second retrace recorder for A/B comparisons in one run, interleaved round by round:
#   REC_B_BIN (another build, default the same binary), REC_B_ARGS (extra flags), REC_B_ENV
#   (environment assignments, e.g. "RUST_LOG=debug"). SHADOW=up gives retrace-b a `--shadow` to a
#   second upstream of its own (SHADOW_TTFT_MS, SHADOW_ITL_MS; default the upstream's timing),
#   SHADOW=down a `--shadow` to a closed port; the summary then adds retrace-b's shadow counters
#   and both recorders' peak RSS. SHADOW_NICE=19 runs that second upstream at the lowest priority,
#   standing in for a shadow on another machine (its own readings are then not the primary's).
# Every proxy target (floors included) goes through every phase, pinned alike under PIN=1.
# Measures, per target, interleaved over ROUNDS rounds:
#   - client TTFT and ITL at CONC concurrent streams (REQS requests of TOKENS tokens each);
#   - small non-streamed requests per second (SMALL_CONC connections for SMALL_S seconds);
#   - memory per idle open stream: proxy RSS with IDLE idle streams open minus RSS before, / IDLE.
# "Added" latency = proxy percentile - direct percentile of the same round.
#
# Usage: tools/bench/bench_record.sh            (defaults: CONC=1000 REQS=3000 TTFT_MS=50 ITL_MS=10 TOKENS=100)
#        CONC=100 REQS=1000 ROUNDS=3 tools/bench/bench_record.sh
# Needs: nginx (apt-get install -y nginx-light), python3. Talks to 127.0.0.1 only; every load
# phase is bounded in requests and time. Results: printed, and kept in $OUT (default target/bench_record).
set -euo pipefail
cd "$(dirname "$0")/../.."

CONC=${CONC:-1000}
REQS=${REQS:-3000}
TTFT_MS=${TTFT_MS:-50}
ITL_MS=${ITL_MS:-10}
TOKENS=${TOKENS:-100}
ROUNDS=${ROUNDS:-2}
# SPREAD_MS: spread the load connections' first measured requests over this many ms (one stream
# lifetime, TTFT_MS + TOKENS*ITL_MS, gives a steady state of CONC streams in flight; 0: a burst).
SPREAD_MS=${SPREAD_MS:-0}
SMALL_CONC=${SMALL_CONC:-64}
SMALL_S=${SMALL_S:-5}
IDLE=${IDLE:-1000}
BASE=${BASE_PORT:-18100}
UP=$((BASE + 1)); REC=$((BASE + 2)); NGX=$((BASE + 3)); ADM=$((BASE + 4)); REC2=$((BASE + 5)); ADM2=$((BASE + 6))
FLR=$((BASE + 7)); FLR2=$((BASE + 8)); FLR3=$((BASE + 9)); REC3=$((BASE + 10)); ADM3=$((BASE + 11))
REC4=$((BASE + 13)); ADM4=$((BASE + 14))
FLOOR_SPIN_US=${FLOOR_SPIN_US:-50}
TARGETS=${TARGETS:-direct floor-epoll retrace nginx}
PROXIES=$(echo "$TARGETS" | tr ' ' '\n' | grep -v '^direct$' | tr '\n' ' ')
TGT=${CARGO_TARGET_DIR:-target}/release
OUT=${OUT:-target/bench_record}

command -v nginx >/dev/null || { echo "nginx not found: apt-get install -y nginx-light" >&2; exit 1; }
. tools/bench/bench_record_common.sh
bench_setup
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

start_upstream_and_recorder

SUP=$((BASE + 12))
SHADOW_ARGS=
case "${SHADOW:-}" in
  up)
    ${SHADOW_NICE:+nice -n "$SHADOW_NICE"} $GEN "$TGT/examples/bench_record" upstream --listen 127.0.0.1:$SUP --ttft-ms "${SHADOW_TTFT_MS:-$TTFT_MS}" \
      --itl-ms "${SHADOW_ITL_MS:-$ITL_MS}" --tokens "$TOKENS" --lifetime-s 3600 &
    PIDS+=($!)
    SHADOW_ARGS="--shadow http://127.0.0.1:$SUP" ;;
  down) SHADOW_ARGS="--shadow http://127.0.0.1:9" ;;
  "") ;;
  *) echo "SHADOW=$SHADOW: expected up or down" >&2; exit 2 ;;
esac
REC3_PID=
if [[ " $TARGETS " == *" retrace-b "* ]]; then
  # shellcheck disable=SC2086
  env RUST_LOG=warn ${REC_B_ENV:-} $PRX "${REC_B_BIN:-$TGT/retrace}" record --listen 127.0.0.1:$REC3 \
    --upstream http://127.0.0.1:$UP --out "$WORK/traces-b" --admin 127.0.0.1:$ADM3 ${REC_B_ARGS:-} $SHADOW_ARGS \
    2>"$WORK/retrace-b.log" &
  REC3_PID=$!
  PIDS+=($REC3_PID)
fi
REC4_PID=
if [[ " $TARGETS " == *" retrace-a "* ]]; then
  start_recorder a $REC4 $ADM4
  REC4_PID=$!
fi
FLR_PID=; FLR2_PID=; FLR3_PID=
if [[ " $TARGETS " == *" floor-spin "* ]]; then
  $PRX "$TGT/examples/fwd_floor" --listen 127.0.0.1:$FLR3 --upstream 127.0.0.1:$UP --mode epoll --spin-us "$FLOOR_SPIN_US" --lifetime-s 3600 2>"$WORK/floor-spin.log" &
  FLR3_PID=$!
  PIDS+=($FLR3_PID)
fi
if [[ " $TARGETS " == *" floor "* ]]; then
  $PRX "$TGT/examples/fwd_floor" --listen 127.0.0.1:$FLR --upstream 127.0.0.1:$UP --lifetime-s 3600 2>"$WORK/floor.log" &
  FLR_PID=$!
  PIDS+=($FLR_PID)
fi
if [[ " $TARGETS " == *" floor-epoll "* ]]; then
  $PRX "$TGT/examples/fwd_floor" --listen 127.0.0.1:$FLR2 --upstream 127.0.0.1:$UP --mode epoll --lifetime-s 3600 2>"$WORK/floor-epoll.log" &
  FLR2_PID=$!
  PIDS+=($FLR2_PID)
fi

write_nginx_conf "worker_processes $NGX_WORKERS;
worker_rlimit_nofile 65535;
master_process on;" \
  "worker_connections 20000; multi_accept on;" 2048 "127.0.0.1:$NGX backlog=4096"
$PRX nginx -c "$WORK/nginx.conf" -p "$WORK/nginx" &
NGX_PID=$!
PIDS+=($NGX_PID)

for port in $UP $REC $NGX ${FLR_PID:+$FLR} ${FLR2_PID:+$FLR2} ${FLR3_PID:+$FLR3} ${REC3_PID:+$REC3} ${REC4_PID:+$REC4}; do
  for _ in $(seq 1 100); do
    curl -s -o /dev/null "http://127.0.0.1:$port/small" -d '{}' && break
    sleep 0.1
  done
done

url() {
  case $1 in
    direct) echo "http://127.0.0.1:$UP$2" ;;
    retrace) echo "http://127.0.0.1:$REC$2" ;;
    retrace-a) echo "http://127.0.0.1:$REC4$2" ;;
    retrace-b) echo "http://127.0.0.1:$REC3$2" ;;
    nginx) echo "http://127.0.0.1:$NGX$2" ;;
    floor) echo "http://127.0.0.1:$FLR$2" ;;
    floor-epoll) echo "http://127.0.0.1:$FLR2$2" ;;
    floor-spin) echo "http://127.0.0.1:$FLR3$2" ;;
  esac
}

RES="$OUT/results.jsonl"
: >"$RES"
rss_kb() { # total VmRSS of a process and its children
  local total=0 p
  for p in "$1" $(ps -o pid= --ppid "$1" 2>/dev/null); do
    total=$((total + $(awk '/VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)))
  done
  echo "$total"
}

cpu_ticks() { # utime+stime (clock ticks) of a process and its children
  local total=0 p
  for p in "$1" $(ps -o pid= --ppid "$1" 2>/dev/null); do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
  done
  echo "$total"
}
sched_counts() { # "minor_faults major_faults involuntary_switches" of a process's threads and its
  # children's: a round whose tail latency jumps can be checked against faults and preemptions
  local mn=0 mj=0 nv=0 p t a b
  for p in "$1" $(ps -o pid= --ppid "$1" 2>/dev/null); do
    for t in /proc/"$p"/task/*; do
      read -r a b <<<"$(awk '{print $10, $12}' "$t/stat" 2>/dev/null || echo "0 0")"
      mn=$((mn + ${a:-0})); mj=$((mj + ${b:-0}))
      nv=$((nv + $(awk '/^nonvoluntary_ctxt_switches/ {print $2}' "$t/status" 2>/dev/null || echo 0)))
    done
  done
  echo "$mn $mj $nv"
}
# A recorder's CPU ticks by thread role, as "io record shadow other": its I/O threads
# (retrace-io-*), the recording writer (retrace-record-*: the writer, and /tokenize counts when
# on), the shadow copies' thread (retrace-shadow), and the rest. Thread names are read as the
# kernel keeps them (15 characters).
role_ticks() {
  local io=0 rec=0 sh=0 oth=0 t c n
  for t in /proc/"$1"/task/*; do
    c=$(cat "$t/comm" 2>/dev/null) || continue
    n=$(awk '{print $14 + $15}' "$t/stat" 2>/dev/null || echo 0)
    case $c in retrace-io-*) io=$((io + n)) ;; retrace-record-*) rec=$((rec + n)) ;;
      retrace-shadow*) sh=$((sh + n)) ;; *) oth=$((oth + n)) ;; esac
  done
  echo "$io $rec $sh $oth"
}
# The VM's stolen time so far (jiffies, all CPUs; /proc/stat's 8th cpu field): time the hypervisor
# ran something else while this machine had work. A 10 ms steal tick during a phase can alone
# make its tail latency jump, for every target alike.
steal_ticks() { awk '/^cpu /{print $9; exit}' /proc/stat; }
proxy_pid() { case $1 in retrace) echo "$REC_PID" ;; retrace-a) echo "$REC4_PID" ;; retrace-b) echo "$REC3_PID" ;; nginx) echo "$NGX_PID" ;;
  floor) echo "$FLR_PID" ;; floor-epoll) echo "$FLR2_PID" ;; floor-spin) echo "$FLR3_PID" ;; *) echo "" ;; esac; }
# retrace's own per-chunk forwarding delay histogram (admin endpoint), as "le=count;..." text.
fwd_hist() {
  local port; case $1 in retrace-a) port=$ADM4 ;; retrace-b) port=$ADM3 ;; *) port=$ADM ;; esac
  curl -s "http://127.0.0.1:$port/metrics" | grep '^retrace_record_forward_delay_seconds_bucket' | tr -d '"' | tr '\n' ';'
}
measure() { # kind target command... ; appends one JSON line with the proxy's CPU ticks, page
  # faults and involuntary context switches over the phase
  local kind=$1 t=$2; shift 2
  local pid c0=0 c1=0 line h0="" h1=""
  pid=$(proxy_pid "$t")
  local s0="0 0 0" s1="0 0 0" mn0 mj0 nv0 mn1 mj1 nv1 st0 st1 ro0="0 0 0 0" ro1="0 0 0 0" roles=""
  [ -n "$pid" ] && c0=$(cpu_ticks "$pid") && s0=$(sched_counts "$pid")
  [[ "$t" == retrace* ]] && ro0=$(role_ticks "$pid")
  st0=$(steal_ticks)
  [[ "$t" == retrace* ]] && h0=$(fwd_hist "$t")
  line=$("$@")
  st1=$(steal_ticks)
  [ -n "$pid" ] && c1=$(cpu_ticks "$pid") && s1=$(sched_counts "$pid")
  [[ "$t" == retrace* ]] && h1=$(fwd_hist "$t") && ro1=$(role_ticks "$pid")
  read -r mn0 mj0 nv0 <<<"$s0"; read -r mn1 mj1 nv1 <<<"$s1"
  if [[ "$t" == retrace* ]]; then
    local a b c d e f g k
    read -r a b c d <<<"$ro0"; read -r e f g k <<<"$ro1"
    roles="\"role_ticks\":{\"io\":$((e - a)),\"record\":$((f - b)),\"shadow\":$((g - c)),\"other\":$((k - d))},"
  fi
  echo "{\"kind\":\"$kind\",\"round\":$r,\"cpu_ticks\":$((c1 - c0)),\"minflt\":$((mn1 - mn0)),\"majflt\":$((mj1 - mj0)),\"nvcsw\":$((nv1 - nv0)),\"steal_ticks\":$((st1 - st0)),\"fwd0\":\"$h0\",\"fwd1\":\"$h1\",$roles${line#\{}" >>"$RES"
  echo "$line" >&2
}

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/loadavg.txt" >&2
echo "== idle streams: $IDLE open streams per proxy (measured first, on fresh processes)" >&2
for t in $PROXIES; do
  pid=$(proxy_pid "$t")
  before=$(rss_kb "$pid")
  $GEN "$B" idle --url "$(url $t /idle)" --streams "$IDLE" --hold-s 6 >"$WORK/idle-$t.txt" &
  IDLE_PID=$!
  for _ in $(seq 1 100); do grep -q idle_streams_open "$WORK/idle-$t.txt" 2>/dev/null && break; sleep 0.1; done
  sleep 1
  during=$(rss_kb "$pid")
  opened=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['idle_streams_open'])" "$WORK/idle-$t.txt")
  wait "$IDLE_PID" || true
  echo "{\"kind\":\"idle\",\"label\":\"$t\",\"streams\":$opened,\"rss_before_kb\":$before,\"rss_during_kb\":$during}" >>"$RES"
  echo "$t: rss $before kB -> $during kB with $opened idle streams" >&2
done

echo "== streams: $CONC concurrent, $REQS requests, TTFT ${TTFT_MS} ms, ITL ${ITL_MS} ms, $TOKENS tokens, spread ${SPREAD_MS} ms; $ROUNDS rounds; PIN=${PIN:-0}" >&2
# Warm-up (connections, pools) at low load.
for t in $TARGETS; do $GEN "$B" stream --url "$(url $t /v1/completions)" --concurrency 20 --requests 40 --label warm >/dev/null; done
for r in $(seq 1 "$ROUNDS"); do
  for t in $TARGETS; do
    measure stream "$t" $GEN "$B" stream --url "$(url $t /v1/completions)" --concurrency "$CONC" --requests "$REQS" --spread-ms "$SPREAD_MS" --label "$t"
  done
done

echo "== small non-streamed requests: $SMALL_CONC connections, ${SMALL_S}s each" >&2
for r in $(seq 1 "$ROUNDS"); do
  for t in $TARGETS; do
    measure small "$t" $GEN "$B" small --url "$(url $t /small)" --concurrency "$SMALL_CONC" --seconds "$SMALL_S" --label "$t"
  done
done

if [ -n "$SHADOW_ARGS" ] && [ -n "$REC3_PID" ]; then
  curl -s "http://127.0.0.1:$ADM3/metrics" | grep '^retrace_record_shadow' | grep -v ' 0$' >"$OUT/shadow-metrics.txt" || true
  echo "retrace-b shadow counters (non-zero):" >&2; cat "$OUT/shadow-metrics.txt" >&2
fi
for p in "$REC_PID" ${REC4_PID:+"$REC4_PID"} ${REC3_PID:+"$REC3_PID"}; do
  echo "peak RSS of pid $p: $(awk '/VmHWM/ {print $2, $3}' "/proc/$p/status")" >&2
done
kill -TERM "$REC_PID" ${REC4_PID:+"$REC4_PID"} ${REC3_PID:+"$REC3_PID"}
wait "$REC_PID" ${REC4_PID:+"$REC4_PID"} ${REC3_PID:+"$REC3_PID"} 2>/dev/null || true
grep -h "retrace record:" "$WORK/retrace.log" | sed 's/, files:.*//' >&2 || true
grep -h "retrace record:" "$WORK/retrace.log" | sed 's/, files:.*//' >"$OUT/retrace-summary.txt" || true
if [ "${SHADOW:-}" = up ] && [ -n "$REC3_PID" ]; then
  # The shadow upstream has the primary's timing unless SHADOW_TTFT_MS/SHADOW_ITL_MS say otherwise:
  # the paired changes are then what the copies' own path adds to a shadow's readings.
  timeout 300 "$TGT/retrace" compare --shadow "$WORK"/traces-b/* >"$OUT/shadow-compare.txt" 2>&1 || true
  echo "compare --shadow of retrace-b's recording:" >&2; cat "$OUT/shadow-compare.txt" >&2
fi

python3 - "$RES" "$OUT/summary.md" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
TARGETS = ["direct", "floor", "floor-epoll", "floor-spin", "retrace", "retrace-a", "retrace-b", "nginx"]
out = []
st = [r for r in rows if r["kind"] == "stream"]
if st:
    c = st[0]
    out.append(f"Streams: {c['concurrency']} concurrent, TTFT/ITL in ms at the client (median over rounds of each percentile).\n")
    out.append("| target | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | added TTFT p50 | added TTFT p99 | added ITL p99 | errors |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    def med(t, k, q):
        return statistics.median(r[k][q] for r in st if r["label"] == t)
    for t in TARGETS:
        if not any(r["label"] == t for r in st):
            continue
        add = lambda k, q: med(t, k, q) - med("direct", k, q)
        errs = sum(r["errors"] for r in st if r["label"] == t)
        out.append(f"| {t} | {med(t,'ttft_ms','p50'):.3f} | {med(t,'ttft_ms','p99'):.3f} | {med(t,'itl_ms','p50'):.3f} | {med(t,'itl_ms','p99'):.3f} | {add('ttft_ms','p50'):+.3f} | {add('ttft_ms','p99'):+.3f} | {add('itl_ms','p99'):+.3f} | {errs} |")
    # What each proxy adds beyond the floor forwarder's hop (the part a proxy can still remove).
    for floor in [f for f in ["floor", "floor-epoll"] if any(r["label"] == f for r in st)]:
        out.append(f"\nOver `{floor}` (proxy percentile − {floor} percentile, ms; the floor's own row is what any forwarding hop adds over direct):\n")
        out.append("| target | over floor TTFT p50 | over floor TTFT p99 | over floor ITL p99 |")
        out.append("|---|---|---|---|")
        for t in TARGETS:
            if t in ("direct", floor) or not any(r["label"] == t for r in st):
                continue
            over = lambda k, q: med(t, k, q) - med(floor, k, q)
            out.append(f"| {t} | {over('ttft_ms','p50'):+.3f} | {over('ttft_ms','p99'):+.3f} | {over('itl_ms','p99'):+.3f} |")
HZ = 100  # USER_HZ: /proc/<pid>/stat clock ticks
cpu = []
for kind in ["stream", "small"]:
    for t in TARGETS[1:]:
        rs = [r for r in rows if r["kind"] == kind and r["label"] == t and r["requests"]]
        if rs:
            # stream runs send one unmeasured warm-up request per connection too
            sent = lambda r: r["requests"] + (r["concurrency"] if kind == "stream" else 0)
            per = lambda ticks, r: ticks * 1e6 / HZ / sent(r)
            us = statistics.median(per(r["cpu_ticks"], r) for r in rs)
            # A recorder's split by thread role; "-" for the others.
            split = " | ".join(
                f"{statistics.median(per(r['role_ticks'][k], r) for r in rs):.1f}"
                if all("role_ticks" in r for r in rs) else "-"
                for k in ["io", "record", "shadow", "other"])
            cpu.append(f"| {kind} | {t} | {us:.1f} | {split} |")
if cpu:
    out.append("\nProxy CPU time per request (user+system, all threads/workers; median over rounds). A recorder's")
    out.append("total is split by thread: I/O threads (forwarding and taps), the recording writer, the shadow")
    out.append("copies' thread, and the rest (each column its own median, so they need not add up):\n")
    out.append("| phase | proxy | CPU µs per request | I/O threads | recording | shadow copies | other |")
    out.append("|---|---|---|---|---|---|---|")
    out.extend(cpu)
sm = [r for r in rows if r["kind"] == "small"]
if sm:
    out.append("\n| target | small requests/s | p50 ms | p99 ms | errors |")
    out.append("|---|---|---|---|---|")
    for t in TARGETS:
        rs = [r for r in sm if r["label"] == t]
        if rs:
            out.append(f"| {t} | {statistics.median(r['rps'] for r in rs):.0f} | {statistics.median(r['latency_ms']['p50'] for r in rs):.3f} | {statistics.median(r['latency_ms']['p99'] for r in rs):.3f} | {sum(r['errors'] for r in rs)} |")
sys.path.insert(0, "tools/bench")
from bench_record_fwd import table as fwd_table
out.extend(fwd_table(st, "admin histogram over each streaming phase", "writes observed"))
idl = [r for r in rows if r["kind"] == "idle"]
if idl:
    out.append("\n| proxy | idle streams | RSS before (KiB) | RSS with streams (KiB) | KiB per idle stream |")
    out.append("|---|---|---|---|---|")
    for r in idl:
        per = (r["rss_during_kb"] - r["rss_before_kb"]) / max(r["streams"], 1)
        out.append(f"| {r['label']} | {r['streams']} | {r['rss_before_kb']} | {r['rss_during_kb']} | {per:.1f} |")
text = "\n".join(out)
print(text)
open(sys.argv[2], "w").write(text + "\n")
PY
