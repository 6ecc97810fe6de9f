#!/usr/bin/env bash
# This build against another, in one run: tools/bench/bench_replay.sh with each binary in turn,
# alternated round by round, then the median of each figure per binary and their ratio (B / A).
# Only the client differs: every round's mocks are B's (MOCK_BIN), and the client floor is off.
#
# Usage: A=path/to/other/retrace B=target/release/retrace ROUNDS=3 tools/bench/bench_ab.sh [OUTDIR]
# Env: CONCURRENCIES (default "100 500"), SECTIONS (default "fidelity dispatch"), RATE_SECONDS.
# Talks to 127.0.0.1 only; every run is bench_replay.sh's, bounded in requests.
set -euo pipefail
cd "$(dirname "$0")/../.."
A=${A:?set A to the other build of retrace}
B=${B:-target/release/retrace}
ROUNDS=${ROUNDS:-3}
OUT=${1:-$(mktemp -d /tmp/bench_ab.XXXX)}
export CONCURRENCIES=${CONCURRENCIES:-"100 500"} SECTIONS=${SECTIONS:-"fidelity dispatch"}
mkdir -p "$OUT"
echo "A: $A ($("$A" --version))"
echo "B: $B ($("$B" --version))"
for r in $(seq "$ROUNDS"); do
  for side in A B; do
    bin=$A; [ "$side" = B ] && bin=$B
    echo "round $r: $side (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    BIN=$bin MOCK_BIN=$B FLOOR='' timeout 900 tools/bench/bench_replay.sh "$OUT/$side$r" >"$OUT/$side$r.txt" 2>&1
  done
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def rows(path):
    got, section = {}, None
    for line in open(path):
        if line.startswith("== fidelity"): section = "fidelity"
        elif line.startswith("== dispatch"): section = "dispatch"
        elif line.startswith("=="): section = None
        t = line.split()
        if section == "fidelity" and len(t) > 3 and t[2] == "retrace" and t[0].isdigit():
            if t[5].startswith("["):  # steady: "window [whole]"
                del t[5]
            cpu = t[10].split("/")
            got[f"{t[0]} {t[1]}: mean TTFT ms"] = float(t[4])
            got[f"{t[0]} {t[1]}: p99 TTFT ms"] = float(t[5])
            got[f"{t[0]} {t[1]}: mean ITL ms"] = float(t[6])
            got[f"{t[0]} {t[1]}: client CPU s"] = float(cpu[0])
        if section == "dispatch" and len(t) > 8 and t[0].endswith("/s") and t[0][0].isdigit():
            got[f"{t[0]} open loop: p99 drift ms"] = float(t[3])
            cpu = t[8].split("/")
            got[f"{t[0]} open loop: client CPU s"] = float(cpu[0])
    return got
runs = {s: [rows(f"{out}/{s}{r}.txt") for r in range(1, rounds + 1)] for s in "AB"}
keys = [k for k in runs["B"][0] if all(k in x for s in "AB" for x in runs[s])]
print(f"\n{'figure':<36} {'A median':>10} {'B median':>10} {'B/A':>7}   (medians of {rounds} alternated rounds)")
for k in keys:
    a = statistics.median(x[k] for x in runs["A"])
    b = statistics.median(x[k] for x in runs["B"])
    ratio = f"{b / a:.2f}" if a else "-"
    print(f"{k:<36} {a:>10.3f} {b:>10.3f} {ratio:>7}")
PY
echo "runs in $OUT"
