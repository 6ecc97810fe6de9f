#!/usr/bin/env bash
# `retrace record` at 10,000 concurrent streams: the load client speaks HTTP/2 with prior
# knowledge (h2c) to the proxy, so the proxy holds few client sockets and one pooled HTTP/1.1
# upstream socket per stream, and the upstream (tools/bench/bench_record.rs) holds its sockets in its
# own process. Side by side in one run: direct (h2c client -> upstream), retrace, and nginx
# (h2c listener, proxy_buffering off, HTTP/1.1 keep-alive upstream).
#
# Measures:
#   - memory per idle open stream: proxy RSS with STREAMS streams open (upstream sent headers and
#     nothing else) minus RSS before, / STREAMS;
#   - STREAMS concurrent streams (TOKENS events each, TTFT_MS then one every ITL_MS): client TTFT and
#     ITL percentiles, errors, the proxy's CPU per request, and retrace's own per-chunk forwarding
#     delay (upstream socket read -> client socket write completed; admin histogram
#     retrace_record_forward_delay_seconds, difference over the phase).
#
# Usage: tools/bench/bench_record_h2.sh                   (STREAMS=10000 TTFT_MS=50 ITL_MS=200 TOKENS=20)
#        STREAMS=2000 ROUNDS=1 tools/bench/bench_record_h2.sh
# Needs: nginx (apt-get install -y nginx-light), python3, a hard fd limit above STREAMS + a few
# hundred. Talks to 127.0.0.1 only; every phase is bounded in requests and time.
set -euo pipefail
cd "$(dirname "$0")/../.."

STREAMS=${STREAMS:-10000}
TTFT_MS=${TTFT_MS:-50}
ITL_MS=${ITL_MS:-200}
TOKENS=${TOKENS:-20}
ROUNDS=${ROUNDS:-2}
H2_CONNS=${H2_CONNS:-8}
BASE=${BASE_PORT:-18300}
UP=$((BASE + 1)); REC=$((BASE + 2)); NGX=$((BASE + 3)); ADM=$((BASE + 4))
TGT=${CARGO_TARGET_DIR:-target}/release
OUT=${OUT:-target/bench_record_h2}
TARGETS=${TARGETS:-direct retrace nginx}

ulimit -n "$(ulimit -Hn)"
if [ "$(ulimit -n)" -le "$((STREAMS + 200))" ]; then
  echo "open-file limit $(ulimit -n) is too low for $STREAMS streams" >&2
  exit 1
fi
. tools/bench/bench_record_common.sh
bench_setup

start_upstream_and_recorder
NGX_PID=""
if command -v nginx >/dev/null && [[ " $TARGETS " == *" nginx "* ]]; then
  NGX_CONNS=$(( STREAMS * 2 + 1000 < $(ulimit -Hn) - 100 ? STREAMS * 2 + 1000 : $(ulimit -Hn) - 100 ))
  write_nginx_conf "worker_processes $NGX_WORKERS;
worker_rlimit_nofile $(ulimit -Hn);
master_process on;" \
    "worker_connections $NGX_CONNS; multi_accept on;" "$STREAMS" "127.0.0.1:$NGX http2 backlog=4096" \
    "http2_max_concurrent_streams $STREAMS;"
  $PRX nginx -c "$WORK/nginx.conf" -p "$WORK/nginx" &
  NGX_PID=$!
  PIDS+=($NGX_PID)
else
  TARGETS=${TARGETS// nginx/}
fi

for port in $UP $REC; do
  for _ in $(seq 1 100); do
    curl -s -o /dev/null "http://127.0.0.1:$port/small" -d '{}' && break
    sleep 0.1
  done
done
sleep 0.5

url() {
  case $1 in
    direct) echo "http://127.0.0.1:$UP$2" ;;
    retrace) echo "http://127.0.0.1:$REC$2" ;;
    nginx) echo "http://127.0.0.1:$NGX$2" ;;
  esac
}
rss_kb() {
  local total=0 p
  for p in "$1" $(ps -o pid= --ppid "$1" 2>/dev/null); do
    total=$((total + $(awk '/VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)))
  done
  echo "$total"
}
cpu_ticks() {
  local total=0 p
  for p in "$1" $(ps -o pid= --ppid "$1" 2>/dev/null); do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
  done
  echo "$total"
}
proxy_pid() { case $1 in retrace) echo "$REC_PID" ;; nginx) echo "$NGX_PID" ;; *) echo "" ;; esac; }
fwd_hist() { curl -s "http://127.0.0.1:$ADM/metrics" | grep '^retrace_record_forward_delay_seconds_bucket' | tr -d '"' | tr '\n' ';'; }

RES="$OUT/results.jsonl"
: >"$RES"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/loadavg.txt" >&2

echo "== idle: $STREAMS open h2c streams per proxy" >&2
for t in $TARGETS; do
  [ "$t" = direct ] && continue
  pid=$(proxy_pid "$t")
  before=$(rss_kb "$pid")
  $GEN "$B" idle --url "$(url $t /idle)" --streams "$STREAMS" --hold-s 8 --h2 --h2-conns "$H2_CONNS" >"$WORK/idle-$t.txt" &
  IDLE_PID=$!
  for _ in $(seq 1 300); do grep -q idle_streams_open "$WORK/idle-$t.txt" 2>/dev/null && break; sleep 0.1; done
  sleep 1
  during=$(rss_kb "$pid")
  opened=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['idle_streams_open'])" "$WORK/idle-$t.txt")
  wait "$IDLE_PID" || true
  echo "{\"kind\":\"idle\",\"label\":\"$t\",\"streams\":$opened,\"rss_before_kb\":$before,\"rss_during_kb\":$during}" >>"$RES"
  echo "$t: rss $before kB -> $during kB with $opened idle streams" >&2
  sleep 2
done

echo "== streams: $STREAMS concurrent h2c streams, TTFT ${TTFT_MS} ms, ITL ${ITL_MS} ms, $TOKENS tokens; $ROUNDS rounds" >&2
for t in $TARGETS; do $GEN "$B" stream --url "$(url $t /v1/completions)" --concurrency 50 --requests 100 --warmup 0 --h2 --h2-conns "$H2_CONNS" --label warm >/dev/null; done
for r in $(seq 1 "$ROUNDS"); do
  for t in $TARGETS; do
    pid=$(proxy_pid "$t"); c0=0; c1=0; h0=""; h1=""
    [ -n "$pid" ] && c0=$(cpu_ticks "$pid")
    [ "$t" = retrace ] && h0=$(fwd_hist)
    line=$($GEN "$B" stream --url "$(url $t /v1/completions)" --concurrency "$STREAMS" --requests "$STREAMS" --warmup 0 --h2 --h2-conns "$H2_CONNS" --label "$t")
    [ -n "$pid" ] && c1=$(cpu_ticks "$pid")
    [ "$t" = retrace ] && h1=$(fwd_hist)
    echo "{\"kind\":\"stream\",\"round\":$r,\"cpu_ticks\":$((c1 - c0)),\"fwd0\":\"$h0\",\"fwd1\":\"$h1\",${line#\{}" >>"$RES"
    echo "$line" >&2
    sleep 2
  done
done

kill -TERM "$REC_PID"
wait "$REC_PID" 2>/dev/null || true
grep -h "retrace record:" "$WORK/retrace.log" | sed 's/, files:.*//' | tee "$OUT/retrace-summary.txt" >&2 || true

python3 - "$RES" "$OUT/summary.md" <<'PY'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out = []
idl = [r for r in rows if r["kind"] == "idle"]
if idl:
    out.append("| proxy | idle h2c streams | RSS before (KiB) | RSS with streams (KiB) | KiB per idle stream |")
    out.append("|---|---|---|---|---|")
    for r in idl:
        per = (r["rss_during_kb"] - r["rss_before_kb"]) / max(r["streams"], 1)
        out.append(f"| {r['label']} | {r['streams']} | {r['rss_before_kb']} | {r['rss_during_kb']} | {per:.1f} |")
st = [r for r in rows if r["kind"] == "stream"]
def med(t, k, q):
    return statistics.median(r[k][q] for r in st if r["label"] == t)
if st:
    out.append(f"\n{st[0]['concurrency']} concurrent h2c streams; client TTFT/ITL in ms (median over rounds of each percentile):\n")
    out.append("| target | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | added TTFT p50 | added TTFT p99 | added ITL p99 | completed | errors | proxy CPU µs/request |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for t in ["direct", "retrace", "nginx"]:
        rs = [r for r in st if r["label"] == t]
        if not rs:
            continue
        has_direct = any(r["label"] == "direct" for r in st)
        add = (lambda k, q: f"{med(t, k, q) - med('direct', k, q):+.3f}") if has_direct else (lambda k, q: "n/a")
        cpu = statistics.median(r["cpu_ticks"] * 1e6 / 100 / max(r["requests"], 1) for r in rs) if t != "direct" else None
        out.append(f"| {t} | {med(t,'ttft_ms','p50'):.3f} | {med(t,'ttft_ms','p99'):.3f} | {med(t,'itl_ms','p50'):.3f} | {med(t,'itl_ms','p99'):.3f} | {add('ttft_ms','p50')} | {add('ttft_ms','p99')} | {add('itl_ms','p99')} | {statistics.median(r['requests'] for r in rs):.0f} | {sum(r['errors'] for r in rs)} | {'' if cpu is None else f'{cpu:.1f}'} |")
sys.path.insert(0, "tools/bench")
from bench_record_fwd import table as fwd_table
out.extend(fwd_table(st, "from the admin histogram", "chunks observed"))
text = "\n".join(out)
print(text)
open(sys.argv[2], "w").write(text + "\n")
PY
