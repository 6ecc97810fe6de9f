#!/usr/bin/env bash
# Does a replay reproduce what was recorded? Record a workload through `retrace record` in front
# of `retrace mock --profile fast` (the cost model: batching and prefix cache, so latency depends
# on arrival timing, lengths and prefix structure together), replay the recording against a fresh
# mock of the same profile, and let `retrace compare RECORDING REPLAY` say how well the recorded
# and the replayed TTFT, ITL and E2EL distributions agree (two-sample KS D; 0.05 is the target).
#
# The recorded client is `retrace replay` of a Mooncake slice (token-id prompts from its hash ids),
# sent through the proxy. Loopback only; bounded by N requests.
#
# Usage: tools/bench/bench_fidelity.sh [OUTDIR]   (build first: cargo build --release)
# Env: N (requests, default 400), SPEED (default 4), TRACE (default the shipped 1k Mooncake slice),
#      PROFILE (default fast), RUNS (default 3: independent record+replay pairs),
#      SERVER=URL SERVER_MODEL=NAME: a real server instead of the mock (e.g. llama-server from
#      ../shared/realserver-llamacpp/start.sh; recorded and replayed against the same server;
#      scale a Mooncake slice to its context with REPLAY_ARGS, e.g. "--block-size 32"),
#      RESTART="CMD": with SERVER, run between recording and replay so the replay meets a server
#      as fresh as the recording did (e.g. "LCPP/stop.sh 8090; LCPP/start.sh 8090"),
#      REPLAY_ARGS: extra flags for the recorded client,
#      NOISE=1: replay the recording a second time (after RESTART, or against another fresh mock)
#      and print the KS D between the two replays: the server's own run-to-run spread for the same
#      schedule, the floor the recording-vs-replay figures can be read against
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/retrace}
OUT=${1:-$(mktemp -d /tmp/bench_fidelity.XXXX)}
N=${N:-400}
SPEED=${SPEED:-4}
TRACE=${TRACE:-traces/mooncake_conversation_1k.jsonl}
PROFILE=${PROFILE:-fast}
RUNS=${RUNS:-3}
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { for _ in $(seq 100); do curl -sf "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "not up: $1" >&2; return 1; }
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT

echo "# bench_fidelity $(date -u +%Y-%m-%dT%H:%MZ): $N requests of $TRACE at speed $SPEED, ${SERVER:-mock --profile $PROFILE}, $RUNS runs"
printf '%-4s %8s %8s %8s %10s %10s %-12s %s\n' run ks_ttft ks_itl ks_e2el sched_p99 send_p99 verdict \
  "${NOISE:+replay-vs-replay ks ttft/itl/e2el}"
for run in $(seq "$RUNS"); do
  d="$OUT/run$run"; mkdir -p "$d/rec"
  px=$(port)
  if [ -n "${SERVER:-}" ]; then
    upstream=$SERVER; model=${SERVER_MODEL:?give SERVER_MODEL, the real server model name}
  else
    up=$(port); upstream="http://127.0.0.1:$up"; model=mock-llama
    "$BIN" mock --listen "127.0.0.1:$up" --profile "$PROFILE" >"$d/mock1.log" 2>&1 & PIDS+=($!); m1=$!
  fi
  wait_up "$upstream/v1/models"
  "$BIN" record --listen "127.0.0.1:$px" --upstream "$upstream" --out "$d/rec" --admin none \
    --block-size 512 >"$d/record.log" 2>&1 & PIDS+=($!); rp=$!
  wait_up "http://127.0.0.1:$px/v1/models"
  # shellcheck disable=SC2086
  "$BIN" replay "$TRACE" --target "http://127.0.0.1:$px" --model "$model" --limit "$N" --speed "$SPEED" \
    ${REPLAY_ARGS:-} >"$d/client.txt" 2>&1
  kill -INT "$rp"; wait "$rp" || true
  rec=$(ls "$d"/rec/*.trace.zst | head -1)
  target=$upstream
  if [ -n "${SERVER:-}" ] && [ -n "${RESTART:-}" ]; then
    bash -c "$RESTART" >"$d/restart.log" 2>&1
    wait_up "$upstream/v1/models"
  fi
  if [ -z "${SERVER:-}" ]; then
    kill "$m1"; wait "$m1" 2>/dev/null || true
    fresh=$(port); target="http://127.0.0.1:$fresh"
    "$BIN" mock --listen "127.0.0.1:$fresh" --profile "$PROFILE" >"$d/mock2.log" 2>&1 & PIDS+=($!); m2=$!
    wait_up "$target/v1/models"
  fi
  fresh_target() {
    if [ -n "${SERVER:-}" ]; then
      [ -n "${RESTART:-}" ] && { bash -c "$RESTART" >>"$d/restart.log" 2>&1; wait_up "$upstream/v1/models"; }
    else
      kill "$m2"; wait "$m2" 2>/dev/null || true
      fresh=$(port); target="http://127.0.0.1:$fresh"
      "$BIN" mock --listen "127.0.0.1:$fresh" --profile "$PROFILE" >"$d/mock3.log" 2>&1 & PIDS+=($!); m2=$!
      wait_up "$target/v1/models"
    fi
  }
  "$BIN" replay "$rec" --target "$target" --detailed --result-json "$d/replay.json" \
    >"$d/replay.txt" 2>&1
  rm -f "$d/replay2.json"
  if [ -n "${NOISE:-}" ]; then
    fresh_target
    "$BIN" replay "$rec" --target "$target" --detailed --result-json "$d/replay2.json" \
      >"$d/replay2.txt" 2>&1
  fi
  [ -z "${SERVER:-}" ] && { kill "$m2"; wait "$m2" 2>/dev/null || true; }
  "$BIN" compare "$rec" "$d/replay.json" --format json >"$d/compare.json"
  "$BIN" compare "$rec" "$d/replay.json" >"$d/compare.txt"
  python3 - "$d/compare.json" "$run" "$d/replay.json" "$d/replay2.json" <<'PY'
import bisect, json, os, sys
def ks(a, b):
    a, b = sorted(a), sorted(b)
    if not a or not b:
        return float("nan")
    return max(abs(bisect.bisect_right(a, x) / len(a) - bisect.bisect_right(b, x) / len(b)) for x in a + b)
def samples(path):
    r = json.load(open(path))
    ok = [not e for e in r["errors"]]
    pick = lambda v: [x for x, good in zip(v, ok) if good]
    return {"ttft": pick(r["ttfts"]), "itl": [x for l in pick(r["itls"]) for x in l], "e2el": pick(r["latencies"])}
noise = ""
if os.path.exists(sys.argv[4]):
    s1, s2 = samples(sys.argv[3]), samples(sys.argv[4])
    noise = "/".join(f"{ks(s1[k], s2[k]):.3f}" for k in ("ttft", "itl", "e2el"))
c = json.load(open(sys.argv[1]))
f = c["workload"]["fidelity"]
ks = f.get("latency_ks", {})
g = lambda k: f"{ks[k]:.3f}" if k in ks else "n/a"
sched = (f.get("schedule_error_ms") or {}).get("p99", float("nan"))
print(f'{sys.argv[2]:<4} {g("ttft"):>8} {g("itl"):>8} {g("e2el"):>8} {sched:>10.3f} {f["arrival_error_ms"]["p99"]:>10.3f} {"faithful" if f["faithful"] else "not faithful":<12} {noise}')
PY
done
echo "# outputs in $OUT (compare.txt per run)"
