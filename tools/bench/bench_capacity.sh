#!/usr/bin/env bash
# Does `retrace capacity` find a known capacity, how long does it take against a fixed ladder of
# rates, does it give the same answer twice, and what does it say of a real server?
#
# Ground truth: `retrace mock` with the continuous-batching engine and a cost model whose
# capacity is known: at most 8 running sequences, every scheduler step 20 ms whatever it holds
# (no per-token, per-sequence or per-request cost). A request of 10 output tokens holds a slot
# for 10 steps (200 ms), so the mock serves at most 8 / (10 · 0.02 s) = 40 requests/s. The trace
# is generated: N evenly spaced requests at RATE req/s (default 600 at 10 req/s), 16 prompt
# tokens, 10 output tokens, each its own hash id; so the sustained capacity is 40 / 10 = 4.0×
# the trace. A finite step absorbs a slight overload: at a factor just above it the queue grows
# at δ req/s and adds δ·T/μ to the last TTFTs of a stretch T (warm-up + step, the queue grows
# from the step's start), μ = 40 req/s. With p99_ttft_ms<=300 and a base TTFT of about 40 ms
# (the step in progress, then the prefill step) the SLO holds while δ·T/μ ≤ 0.26 s, i.e. up to
# (40 + 0.26 · 40 / T) / 10 × the trace: 4.04× for T = 25 s. The script prints both truths
# (sustained and over T), checks μ by a replay of the whole trace at twice the capacity
# (achieved req/s with a queue never empty) and prints the base TTFT of the search's 1× step.
#
# Sections (SECTIONS, default "truth repeat llamacpp"):
#   truth     one search (`retrace capacity` with --slo p99_ttft_ms<=300 --step STEP --warmup
#             WARMUP, defaults otherwise) and, in the same run, a GuideLLM-style ladder of 10
#             evenly spaced factors (0.8, 1.6, ..., 8.0: --speeds, same step and warm-up): the
#             answer, its bracket, the steps run and the wall seconds of each, side by side;
#   repeat    REPEATS - 1 more searches like truth's (default 2: three in all with truth's),
#             each against a fresh mock: do the answers agree within --precision?
#   llamacpp  one search against a real llama.cpp `llama-server` (../shared/realserver-llamacpp/,
#             set up with its install.sh under LCPP; started with its start.sh on a free port and
#             stopped with its stop.sh): a slice of the Mooncake conversation trace
#             (../shared/traces/mooncake_conversation_trace.jsonl, its first LCPP_ROWS rows,
#             lengths divided by 32 and hash ids kept, replayed with --block-size 16 so the
#             prefix structure stays; output lengths at least 2; rows that would not fit a
#             4,096-token slot left out), --tokenizer of the tiny model, LCPP_SLO, --step 10s
#             --warmup 2s --max-speed 16. The server runs with LCPP_ARGS (default --cache-ram 0:
#             no host-RAM prompt cache). llama.cpp has no POST /reset_prefix_cache, and every
#             step sends the trace's first copy with the trace's own hash ids: with its 8 GiB
#             host cache a step finds the prompts of earlier steps cached, and the search's
#             order biases the answer (the first factor that fails does so with a cold cache;
#             the lower factors bisected after it run warm and pass). Without that cache only
#             the 4 slots' last prompts outlive a step.
#             Skipped, with a message, when LCPP is not set.
#
# Each run gets a fresh mock on a port the kernel picks (--listen 127.0.0.1:0); llama-server
# gets a free port found by binding port 0. Loopback only. Every child is under `timeout`
# (llama-server itself is stopped by stop.sh on exit, by its pid file); everything started is
# stopped on exit. Needs the release build; never run by CI or tests.
#
# Usage: tools/bench/bench_capacity.sh [OUTDIR]   (build first: cargo build --release --locked)
# Env: BIN (target/release/retrace), SECTIONS, N (600), RATE (10), STEP (20: seconds),
#      WARMUP (5: seconds), REPEATS (3), LIMIT (900: seconds allowed to each capacity run),
#      LCPP (a root set up by ../shared/realserver-llamacpp/install.sh), LCPP_TRACE
#      (../shared/traces/mooncake_conversation_trace.jsonl), LCPP_ROWS (300), LCPP_SLO
#      (p99_ttft_ms<=1000,failure_rate<=0), LCPP_TOKENIZER
#      (../shared/realserver-llamacpp/tokenizer.json), LCPP_ARGS (--cache-ram 0; empty: the
#      server's defaults)
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/retrace}
SECTIONS=${SECTIONS:-truth repeat llamacpp}
N=${N:-600}
RATE=${RATE:-10}
STEP=${STEP:-20}
WARMUP=${WARMUP:-5}
REPEATS=${REPEATS:-3}
LIMIT=${LIMIT:-900}
SLO='p99_ttft_ms<=300'
LCPP_TRACE=${LCPP_TRACE:-../shared/traces/mooncake_conversation_trace.jsonl}
LCPP_ROWS=${LCPP_ROWS:-300}
LCPP_SLO=${LCPP_SLO:-p99_ttft_ms<=1000,failure_rate<=0}
LCPP_TOKENIZER=${LCPP_TOKENIZER:-../shared/realserver-llamacpp/tokenizer.json}
LCPP_ARGS=${LCPP_ARGS---cache-ram 0}
OUT=${1:-$(mktemp -d /tmp/bench_capacity.XXXX)}
[ -x "$BIN" ] || { echo "build first: cargo build --release --locked" >&2; exit 2; }
mkdir -p "$OUT"
# The engine of known capacity: 8 sequences, 20 ms a step, nothing else costs time.
MOCK_ARGS=(--max-num-seqs 8 --step-overhead-ms 20 --prefill-token-ms 0 --seq-ms 0
  --context-token-ms 0 --request-overhead-ms 0)
PIDS=()
LCPP_PORT=
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ -n "$LCPP_PORT" ]; then timeout 30 "$LCPP/stop.sh" "$LCPP_PORT" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
has() { case " $SECTIONS " in *" $1 "*) return 0;; *) return 1;; esac; }
now() { date +%s.%N; }
free_port() { timeout 10 python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# A fresh mock on a port of the kernel's choosing; sets MOCK_URL and MOCK_PID.
start_mock() {
  local log=$1
  timeout "$(( LIMIT * 2 ))" "$BIN" mock --listen 127.0.0.1:0 "${MOCK_ARGS[@]}" 2>"$log" &
  MOCK_PID=$!; PIDS+=("$MOCK_PID")
  MOCK_URL=
  for _ in $(seq 100); do
    MOCK_URL=$(sed -n 's/.* on \(http:\/\/127\.0\.0\.1:[0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "$MOCK_URL" ] && return 0
    sleep 0.05
  done
  echo "the mock did not start: $(cat "$log")" >&2; exit 2
}
stop_mock() { kill "$MOCK_PID" 2>/dev/null || true; wait "$MOCK_PID" 2>/dev/null || true; }

# One `retrace capacity` run: NAME TARGET TRACE ARGS...; its stdout in NAME.txt, stderr in
# NAME.err, result in NAME.json, wall seconds in NAME.wall.
capacity() {
  local name=$1 target=$2 trace=$3; shift 3
  local t0 rc=0
  t0=$(now)
  timeout "$LIMIT" "$BIN" capacity "$trace" --target "$target" --result-json "$OUT/$name.json" "$@" \
    >"$OUT/$name.txt" 2>"$OUT/$name.err" || rc=$?
  echo "$(now) - $t0" | bc >"$OUT/$name.wall"
  if [ "$rc" != 0 ] && [ "$rc" != 7 ]; then
    echo "retrace capacity ($name) exited $rc:" >&2; tail -5 "$OUT/$name.err" >&2
  fi
}

# answer, bracket, steps (given up early), wall seconds of a capacity result
summary() {
  timeout 30 python3 - "$OUT/$1.json" "$(cat "$OUT/$1.wall")" "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
wall, name = float(sys.argv[2]), sys.argv[3]
steps, cap = r["steps"], r["capacity"]
lo = cap["speed"]
fails = [s["speed"] for s in steps if not s["slo_met"] and (lo is None or s["speed"] > lo)]
hi = min(fails) if fails else None
gave_up = sum(1 for s in steps if (s["not_met_because"] or "").startswith("given up"))
fmt = lambda x: "-" if x is None else f"{x:g}"
print(f"{name:<10} answer {('at least ' if cap['at_least'] else '') + fmt(lo)}x"
      f"  bracket [{fmt(lo)}, {fmt(hi)})  steps {len(steps)} ({gave_up} given up early)"
      f"  wall {wall:.0f} s (steps {sum(s['wall_s'] for s in steps):.0f} s)"
      f"  limited by {cap['limited_by']}")
PY
}

echo "# bench_capacity $(date -u +%Y-%m-%dT%H:%MZ): sections '$SECTIONS'; load average $(cut -d' ' -f1-3 /proc/loadavg)"

if has truth || has repeat; then
  TRACE="$OUT/even.jsonl"
  timeout 30 python3 - "$N" "$RATE" >"$TRACE" <<'PY'
import json, sys
n, rate = int(sys.argv[1]), float(sys.argv[2])
for i in range(n):
    print(json.dumps({"timestamp": round(i * 1000 / rate), "input_length": 16,
                      "output_length": 10, "hash_ids": [i]}))
PY
  T=$(( STEP + WARMUP ))
  echo "# trace: $N requests every $(echo "scale=1; 1000 / $RATE" | bc) ms ($RATE req/s), 16 prompt / 10 output tokens, distinct hash ids"
  echo "# mock: ${MOCK_ARGS[*]}"
  timeout 30 python3 - "$RATE" "$T" <<'PY'
import sys
rate, T = float(sys.argv[1]), float(sys.argv[2])
mu = 8 / (10 * 0.020)
print(f"# truth: mu = 8 / (10 x 20 ms) = {mu:g} req/s = {mu / rate:g}x sustained; "
      f"over a stretch of T = {T:g} s with p99 TTFT <= 300 ms from ~40 ms: "
      f"({mu:g} + 0.26 x {mu:g} / {T:g}) / {rate:g} = {(mu + 0.26 * mu / T) / rate:.3f}x")
PY
fi

if has truth; then
  # μ measured: the whole trace at twice the capacity, the queue never empty after the start
  start_mock "$OUT/mock-mu.log"
  timeout 120 "$BIN" replay "$TRACE" --target "$MOCK_URL" --speed 8 --result-json "$OUT/mu.json" \
    >"$OUT/mu.txt" 2>&1
  stop_mock
  timeout 30 python3 - "$OUT/mu.json" "$RATE" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"# measured mu: {r['request_throughput']:.2f} req/s achieved at 8x ({r['completed']} completed, "
      f"{r['failed']} failed, over {r['duration']:.1f} s) = {r['request_throughput'] / float(sys.argv[2]):.2f}x")
PY
  start_mock "$OUT/mock-search1.log"
  capacity search1 "$MOCK_URL" "$TRACE" --slo "$SLO" --step "${STEP}s" --warmup "${WARMUP}s"
  stop_mock
  start_mock "$OUT/mock-ladder.log"
  capacity ladder "$MOCK_URL" "$TRACE" --slo "$SLO" --step "${STEP}s" --warmup "${WARMUP}s" \
    --speeds 0.8,1.6,2.4,3.2,4.0,4.8,5.6,6.4,7.2,8.0
  stop_mock
  timeout 30 python3 - "$OUT/search1.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["steps"][0]
print(f"# base TTFT (search's {s['speed']:g}x step): median {s['result']['median_ttft_ms']:.1f} ms, "
      f"p99 {s['result']['p99_ttft_ms']:.1f} ms")
PY
  echo "# search: retrace capacity TRACE --target MOCK --slo '$SLO' --step ${STEP}s --warmup ${WARMUP}s"
  echo "# ladder: the same with --speeds 0.8,1.6,2.4,3.2,4.0,4.8,5.6,6.4,7.2,8.0"
  summary search1
  summary ladder
  echo "## search1 table"; cat "$OUT/search1.txt"
  echo "## ladder table"; cat "$OUT/ladder.txt"
fi

if has repeat; then
  first=2
  has truth || first=1
  for i in $(seq "$first" "$REPEATS"); do
    start_mock "$OUT/mock-search$i.log"
    capacity "search$i" "$MOCK_URL" "$TRACE" --slo "$SLO" --step "${STEP}s" --warmup "${WARMUP}s"
    stop_mock
  done
  for i in $(seq "$REPEATS"); do
    [ -f "$OUT/search$i.json" ] && summary "search$i"
  done
  for i in $(seq "$first" "$REPEATS"); do echo "## search$i table"; cat "$OUT/search$i.txt"; done
fi

if has llamacpp; then
  if [ -z "${LCPP:-}" ] || [ ! -x "$LCPP/start.sh" ]; then
    echo "# llamacpp: skipped (set LCPP to a root set up by ../shared/realserver-llamacpp/install.sh)"
  else
    SLICE="$OUT/conversation-slice.jsonl"
    timeout 30 python3 - "$LCPP_TRACE" "$LCPP_ROWS" >"$SLICE" <<'PY'
import json, math, sys
path, n = sys.argv[1], int(sys.argv[2])
with open(path) as f:
    for i, line in enumerate(f):
        if i == n:
            break
        r = json.loads(line)
        r["input_length"] = max(1, math.ceil(r["input_length"] / 32))
        r["output_length"] = max(2, math.ceil(r["output_length"] / 32))
        if r["input_length"] + r["output_length"] <= 4096:
            print(json.dumps(r))
PY
    timeout 30 "$BIN" inspect "$SLICE" --trace-block-size 16 >"$OUT/slice-inspect.txt" 2>&1 || true
    LCPP_PORT=$(free_port)
    # shellcheck disable=SC2086
    timeout 120 "$LCPP/start.sh" "$LCPP_PORT" $LCPP_ARGS >"$OUT/llamacpp-start.log"
    timeout 10 "$LCPP/bin/llama-server" --version 2>&1 | grep -E '^version' | sed 's/^/# llama-server /' || true
    echo "# llamacpp: first $LCPP_ROWS rows of $LCPP_TRACE, lengths / 32, $(wc -l <"$SLICE") kept; start.sh PORT $LCPP_ARGS"
    sed -n "s|$OUT/||g; s/^/#   /p" "$OUT/slice-inspect.txt"
    echo "# search: retrace capacity SLICE --target LLAMA --tokenizer $LCPP_TOKENIZER --block-size 16 --slo '$LCPP_SLO' --step 10s --warmup 2s --max-speed 16"
    capacity llamacpp "http://127.0.0.1:$LCPP_PORT" "$SLICE" --tokenizer "$LCPP_TOKENIZER" \
      --block-size 16 --slo "$LCPP_SLO" --step 10s --warmup 2s --max-speed 16
    timeout 30 "$LCPP/stop.sh" "$LCPP_PORT" >/dev/null 2>&1 || true
    LCPP_PORT=
    summary llamacpp
    echo "## llamacpp table"; cat "$OUT/llamacpp.txt"
  fi
fi
echo "# load average at the end $(cut -d" " -f1-3 /proc/loadavg); console output and result files: $OUT"
