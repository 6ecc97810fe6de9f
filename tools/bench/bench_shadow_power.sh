#!/usr/bin/env bash
# Statistical power of a paired shadow comparison against two unpaired replays (docs/shadow.md).
#
# Two mocks: the primary (--fixed-timing 50,10) and a candidate 2 ms slower in TTFT (52,10).
#   paired:   one recording through `record --shadow` (primary upstream, candidate shadow) of
#             NMAX requests; for each N, its first N records (`convert --head N`) judged by
#             `compare --shadow`;
#   unpaired: for each N, `replay --limit N` against the primary, then against the candidate, in
#             the same hour, judged by `compare A.json B.json`.
# For each N it prints whether median TTFT was called worse (the change significant at 99 % and
# above --min-effect), and the smallest N that was, for each way.
#
# MOCKS=batching runs both mocks on the continuous-batching cost model of `--profile fast`
# instead, the candidate with `--request-overhead-ms 2` (2 ms more before the engine queues each
# request): TTFT then varies with the prompt and the queue, as on a real server. PAIRED=replay
# makes the paired way `replay --shadow --limit N` (target primary, shadow candidate), judged
# by `compare --shadow`, for each N.
#
# Usage: tools/bench/bench_shadow_power.sh    (NS="10 20 40 80 160 320 640" RATE=20 TRACE=...
#        MOCKS=fixed|batching PAIRED=record|replay)
# Talks to 127.0.0.1 only; every run is bounded by its request count and a timeout.
set -euo pipefail
cd "$(dirname "$0")/../.."

NS=${NS:-10 20 40 80 160 320 640}
RATE=${RATE:-20}
TRACE=${TRACE:-traces/mooncake_conversation_1k.jsonl}
BASE=${BASE_PORT:-18300}
A=$((BASE + 1)); B=$((BASE + 2)); P=$((BASE + 3))
OUT=${OUT:-target/bench_shadow_power}
TGT=${CARGO_TARGET_DIR:-target}/release
cargo build --release --quiet --bin retrace
R="$TGT/retrace"
mkdir -p "$OUT"
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

MOCKS=${MOCKS:-fixed}; PAIRED=${PAIRED:-record}
case $MOCKS in
  fixed) MA=(--fixed-timing 50,10); MB=(--fixed-timing 52,10) ;;
  batching) MA=(--profile fast); MB=(--profile fast --request-overhead-ms 2) ;;
  *) echo "MOCKS=$MOCKS: give fixed or batching" >&2; exit 2 ;;
esac
timeout 3600 "$R" mock --listen 127.0.0.1:$A "${MA[@]}" 2>"$WORK/a.log" & PIDS+=($!)
timeout 3600 "$R" mock --listen 127.0.0.1:$B "${MB[@]}" 2>"$WORK/b.log" & PIDS+=($!)
sleep 1
NMAX=$(echo "$NS" | tr ' ' '\n' | sort -n | tail -1)
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# verdict FILE.json: "worse" / "same" / ... of the median_ttft_ms row (compare or compare --shadow)
verdict() {
  python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
cmp = d["shadows"][0]["comparison"] if "shadows" in d else d
row = next(r for r in cmp["rows"] if r["key"] == "median_ttft_ms")
print(row["verdict"], "%+.2f" % (row["abs_change"] or 0))
PY
}

echo "mocks: $MOCKS (${MA[*]} against ${MB[*]}); paired way: $PAIRED" >&2
: >"$OUT/power.txt"
if [ "$PAIRED" = replay ]; then
echo "== paired: for each N, one replay --shadow (target the primary, shadow the candidate)" >&2
for n in $NS; do
  timeout 1800 "$R" replay "$TRACE" --target http://127.0.0.1:$A --shadow http://127.0.0.1:$B \
    --limit "$n" --request-rate "$RATE" --result-json "$WORK/s$n.json" >/dev/null 2>"$WORK/s$n.log"
  timeout 600 "$R" compare --shadow "$WORK/s$n.json" --format json >"$WORK/p$n.json" || true
  echo "paired $n $(verdict "$WORK/p$n.json")" | tee -a "$OUT/power.txt"
done
else
echo "== paired: $NMAX requests at $RATE req/s through record --shadow" >&2
timeout 3600 "$R" record --listen 127.0.0.1:$P --upstream http://127.0.0.1:$A \
  --shadow http://127.0.0.1:$B --out "$WORK/rec" --admin none 2>"$WORK/rec.log" & REC=$!
PIDS+=($REC)
sleep 1
timeout 1800 "$R" replay "$TRACE" --target http://127.0.0.1:$P --limit "$NMAX" --request-rate "$RATE" \
  --result-json "$WORK/through.json" >/dev/null 2>"$WORK/through.log"
kill -INT "$REC"; wait "$REC" 2>/dev/null || true
REC_FILES=("$WORK"/rec/*.trace.zst)
timeout 600 "$R" convert "${REC_FILES[@]}" -o "$WORK/rec.trace.zst" 2>/dev/null
for n in $NS; do
  timeout 600 "$R" convert "$WORK/rec.trace.zst" --head "$n" -o "$WORK/p$n.trace.zst" 2>/dev/null
  timeout 600 "$R" compare --shadow "$WORK/p$n.trace.zst" --format json >"$WORK/p$n.json" || true
  echo "paired $n $(verdict "$WORK/p$n.json")" | tee -a "$OUT/power.txt"
done
fi

echo "== unpaired: for each N, a replay against the primary, then one against the candidate" >&2
for n in $NS; do
  for side in a b; do
    port=$A; [ $side = b ] && port=$B
    timeout 1800 "$R" replay "$TRACE" --target http://127.0.0.1:$port --limit "$n" --request-rate "$RATE" \
      --detailed --result-json "$WORK/u$n$side.json" >/dev/null 2>"$WORK/u$n$side.log"
  done
  timeout 600 "$R" compare "$WORK/u${n}a.json" "$WORK/u${n}b.json" --format json >"$WORK/u$n.json" || true
  echo "unpaired $n $(verdict "$WORK/u$n.json")" | tee -a "$OUT/power.txt"
done

python3 - "$OUT/power.txt" <<'PY'
import sys
first = {}
for line in open(sys.argv[1]):
    way, n, verdict, change = line.split()
    if verdict == "worse" and way not in first:
        first[way] = int(n)
for way in ("paired", "unpaired"):
    print(f"{way}: smallest N called worse: {first.get(way, 'none of those tried')}")
if "paired" in first and "unpaired" in first:
    print(f"unpaired / paired: {first['unpaired'] / first['paired']:.1f}x")
PY
