#!/usr/bin/env bash
# Day-scale benchmark: memory and send drift of a replay far longer than the body window, and
# inspect/convert throughput of multi-million-row traces (release build, loopback only).
#
#  1. Replay: a generated N-request Mooncake-shaped trace (default 1,000,000; ISL drawn from the
#     Mooncake conversation trace's input lengths, divided by ISL_DIV so the run stays short;
#     OSL tokens each; one arrival every GAP_MS of trace time) replayed at --speed SPEED against
#     `retrace mock --fixed-timing 50,1` (a separate process). Then the first 12,000 rows of the
#     same trace, same flags, in the same run: the send-drift baseline. Reports peak RSS of the
#     replayer, p99 send drift of both runs, and the body builder's minimum lead and late count.
#  2. Trace I/O: a ROWS-row BurstGPT-shaped CSV (default 5,000,000) and the same rows as a native
#     trace: `inspect` and `convert` of each, peak RSS and rows/s; then ROWS rows as a set of 4
#     native recordings merged by wall clock (`inspect A B C D`, `convert A B C D`); then `inspect`
#     of a 2 M-request fitted trace with more distinct hash ids than inspect keeps exactly.
#
# Usage: tools/bench/bench_dayscale.sh [OUTDIR]   (build first: cargo build --release)
# Env: N, ISL_DIV (default 64), OSL (default 2), GAP_MS (default 1), SPEED (default 4), ROWS,
#      SOURCE (the conversation trace; default ../shared/traces/mooncake_conversation_trace.jsonl, relative to the repository root),
#      SECTIONS (default "replay io": which parts run).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/retrace}
OUT=${1:-$(mktemp -d /tmp/bench_dayscale.XXXX)}
N=${N:-1000000}
ISL_DIV=${ISL_DIV:-64}
OSL=${OSL:-2}
GAP_MS=${GAP_MS:-1}
SPEED=${SPEED:-4}
ROWS=${ROWS:-5000000}
SOURCE=${SOURCE:-../shared/traces/mooncake_conversation_trace.jsonl}
SECTIONS=${SECTIONS:-"replay io"}
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# peak RSS (MiB) and wall seconds of a command: "rss_mib wall_s"
measure() { # measure LOG cmd...
  local log=$1; shift
  /usr/bin/time -f '%M %e' -o "$log.time" "$@" >"$log" 2>&1
  awk '{printf "%.0f %s\n", $1/1024, $2}' "$log.time"
}

if [[ " $SECTIONS " == *" replay "* ]]; then
echo "== generating traces in $OUT"
python3 - "$SOURCE" "$OUT/day.jsonl" "$N" "$ISL_DIV" "$OSL" "$GAP_MS" <<'PY'
import json, random, sys
src, path, n, div, osl, gap = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
isl = [json.loads(l)["input_length"] for l in open(src) if l.strip()]
rng = random.Random(7)
nid = 1
with open(path, "w") as f:
    for i in range(n):
        L = max(1, rng.choice(isl) // div)
        blocks = (L + 511) // 512
        ids = [0] + list(range(nid, nid + blocks - 1))  # one shared system-prompt block
        nid += blocks - 1
        f.write(json.dumps({"timestamp": int(i * gap), "input_length": L, "output_length": osl, "hash_ids": ids}) + "\n")
PY
head -n 12000 "$OUT/day.jsonl" >"$OUT/day_12k.jsonl"

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN" mock --listen "127.0.0.1:$PORT" --fixed-timing 50,1 --max-num-seqs 1000000 >"$OUT/mock.log" 2>&1 &
MOCK=$!
trap 'kill $MOCK 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1 && break; sleep 0.1; done

replay() { # replay NAME TRACE
  measure "$OUT/$1.log" "$BIN" replay "$2" --target "http://127.0.0.1:$PORT" \
    --speed "$SPEED" --result-json "$OUT/$1.json"
}
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(" ".join(str(d.get(k, d.get("body_builder", {}).get(k))) for k in sys.argv[2:]))' "$@"; }

echo "== replay: $N requests (ISL/$ISL_DIV, OSL $OSL, every $GAP_MS ms, --speed $SPEED)"
printf '%-8s %10s %8s %9s %12s %14s %6s %10s\n' run requests rss_mib wall_s completed p99_drift_ms late min_lead_ms
for run in day_12k day; do
  read -r rss wall < <(replay "$run" "$OUT/$run.jsonl")
  read -r done p99 late lead < <(field "$OUT/$run.json" completed p99_drift_ms late min_lead_ms)
  printf '%-8s %10s %8s %9s %12s %14s %6s %10s\n' "$run" "$(wc -l <"$OUT/$run.jsonl")" "$rss" "$wall" "$done" "$p99" "$late" "$lead"
done
kill $MOCK 2>/dev/null || true
fi

[[ " $SECTIONS " == *" io "* ]] || exit 0
echo "== trace I/O: $ROWS rows"
python3 - "$OUT/burst.csv" "$ROWS" <<'PY'
import random, sys
path, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(11)
with open(path, "w") as f:
    f.write("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n")
    t = 0.0
    for i in range(n):
        t += rng.expovariate(4.0)
        a, b = rng.randint(1, 4000), rng.randint(0, 800)
        f.write(f"{t:.3f},{'ChatGPT' if i % 5 else 'GPT-4'},{a},{b},{a+b},Conversation log\n")
PY
measure "$OUT/to_native.log" "$BIN" convert "$OUT/burst.csv" -o "$OUT/burst.trace.zst" >/dev/null
printf '%-22s %10s %8s %9s %12s\n' step rows rss_mib wall_s rows_per_s
for step in "inspect csv" "convert csv" "inspect native" "convert native"; do
  set -- $step
  src="$OUT/burst.csv"; [ "$2" = native ] && src="$OUT/burst.trace.zst"
  case $1 in
    inspect) read -r rss wall < <(measure "$OUT/$1_$2.log" "$BIN" inspect "$src") ;;
    convert) read -r rss wall < <(measure "$OUT/$1_$2.log" "$BIN" convert "$src" -o "$OUT/out_$2.jsonl") ;;
  esac
  printf '%-22s %10s %8s %9s %12.0f\n' "$step" "$ROWS" "$rss" "$wall" "$(python3 -c "print($ROWS/max($wall,0.01))")"
done
# A trace set: the same number of rows as 4 recordings of one period (Azure-shaped CSVs with
# wall-clock stamps, converted to native), inspected and converted as one merged stream.
python3 - "$OUT" "$ROWS" <<'PY'
import datetime, random, sys
out, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(12)
t0 = datetime.datetime(2026, 1, 1)
for k in range(4):
    with open(f"{out}/set{k}.csv", "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        t = rng.random()
        for _ in range(n // 4):
            t += rng.expovariate(1.0)
            stamp = (t0 + datetime.timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S.%f")
            f.write(f"{stamp}0,{rng.randint(1, 4000)},{rng.randint(1, 800)}\n")
PY
for k in 0 1 2 3; do "$BIN" convert "$OUT/set$k.csv" -o "$OUT/set$k.trace.zst" >/dev/null 2>&1; done
SET="$OUT/set0.trace.zst $OUT/set1.trace.zst $OUT/set2.trace.zst $OUT/set3.trace.zst"
read -r rss wall < <(measure "$OUT/inspect_set.log" "$BIN" inspect $SET)
printf '%-22s %10s %8s %9s %12.0f\n' "inspect 4-file set" "$ROWS" "$rss" "$wall" "$(python3 -c "print($ROWS/max($wall,0.01))")"
read -r rss wall < <(measure "$OUT/convert_set.log" "$BIN" convert $SET -o "$OUT/out_set.jsonl")
printf '%-22s %10s %8s %9s %12.0f\n' "convert 4-file set" "$ROWS" "$rss" "$wall" "$(python3 -c "print($ROWS/max($wall,0.01))")"
# Past inspect's exact bounds: a 2,000,000-request trace fitted to the conversation trace (new
# hash ids, about 30 M distinct: beyond the 8 M kept exactly, so the Bloom filter takes over).
"$BIN" synth "$SOURCE" -o "$OUT/big.trace.zst" --fit --requests 2000000 --seed 1 >/dev/null
read -r rss wall < <(measure "$OUT/inspect_big.log" "$BIN" inspect "$OUT/big.trace.zst")
printf '%-22s %10s %8s %9s %12.0f\n' "inspect 2M, 30M ids" 2000000 "$rss" "$wall" "$(python3 -c "print(2000000/max($wall,0.01))")"
grep -E "prefix blocks|block reuse|estimated" "$OUT/inspect_big.log" || true
echo "raw outputs: $OUT"
