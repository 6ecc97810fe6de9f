#!/usr/bin/env bash
# Benchmark of `retrace replay` against `retrace mock --fixed-timing 50,10` (both release builds,
# separate processes, loopback only). Bounded: every run has a fixed request count.
#
#  1. Fidelity: 100-token outputs at 100/500/1000 concurrent streams, two scenarios per level:
#     burst (2*C requests all due at t=0, --max-concurrency C, at most 2000) and steady (3*C
#     requests arriving uniformly, C per stream lifetime, so C streams are in flight with their
#     phases spread; measured on the middle third). Reports mean/p99 TTFT (true: 50 ms), ITL mean
#     and std (true: 10 ms, 0), the mock's lateness and the replayer's CPU during the run.
#     After retrace, the client floor (tools/bench/client_floor.rs, row `floor`: one epoll thread, one
#     stamped read per event, no HTTP parser or runtime) runs the same trace against a fresh mock:
#     what any client pays on this machine in the same minute. peak_cores: each client's highest
#     CPU rate over any 1 s window (the run average also counts the ramps up and down).
#     steal_ms: the VM's stolen time during that run (/proc/stat; 10 ms ticks): a run with steal
#     was stalled by the hypervisor, client and mock alike, and says little about either.
#  2. Dispatch: open loop at 1,000 and 2,000 requests/s (2-token outputs, 5 s): p99 send drift
#     and achieved request rate.
#  3. Scale: 10,000 streams in flight at once (a second mock with --fixed-timing 50,1000 and
#     5-token outputs, so the streams overlap for ~4 s): completed/failed and peak concurrency.
#
#  Peer (optional): with AIPERF=/path/to/aiperf (PyPI `aiperf`, ~1.2 GB venv), AIPerf runs the
#     same fidelity levels against the same fresh mock right after retrace (row `aiperf`; its
#     "inter_chunk_latency" is vLLM's ITL), and both replay a Mooncake trace slice exported by
#     `retrace convert --to mooncake` (section 4: send drift, exact prompt tokens, prefix hits). An offline tokenizer is made for it in a private
#     HF_HOME (a word-level tokenizer.json; AIPerf will not load a plain local path offline).
#
# Usage: tools/bench/bench_replay.sh [OUTDIR]   (build first: cargo build --release)
# Env: RATE_SECONDS (default 5), CONCURRENCIES (default "100 500 1000"), AIPERF,
#      SECTIONS (default "fidelity dispatch scale trace": which sections run),
#      REPLAY_ARGS (extra flags for retrace's fidelity runs, e.g. "--reader-threads 0"),
#      MOCK_BIN (the fidelity runs' mock binary, default BIN: an A/B of the client alone),
#      MOCK_ARGS (extra flags for the fidelity runs' mocks, e.g. "--realtime": the instrument's
#      emission under SCHED_FIFO, so that what is measured is the client).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/retrace}
MOCK_BIN=${MOCK_BIN:-$BIN}
# The client floor (tools/bench/client_floor.rs), run beside retrace in the fidelity section when built
# (cargo build --release --example client_floor); FLOOR= (empty) skips it.
FLOOR=${FLOOR-${CARGO_TARGET_DIR:-target}/release/examples/client_floor}
OUT=${1:-$(mktemp -d /tmp/bench_replay.XXXX)}
RATE_SECONDS=${RATE_SECONDS:-5}
CONCURRENCIES=${CONCURRENCIES:-"100 500 1000"}
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN" mock --listen "127.0.0.1:$PORT" --fixed-timing 50,10 --max-num-seqs 100000 >"$OUT/mock.log" 2>&1 &
MOCK=$!
trap 'kill $MOCK ${MPID:-} ${MOCK2:-} 2>/dev/null || true' EXIT
SECTIONS=${SECTIONS:-"fidelity dispatch scale trace"}
has() { [[ " $SECTIONS " == *" $1 "* ]]; }
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1 && break; sleep 0.1; done

gen() { # gen FILE N SPACING_MS OUTPUT_TOKENS
  python3 - "$@" <<'PY'
import json, sys
path, n, gap, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
with open(path, "w") as f:
    for i in range(n):
        f.write(json.dumps({"timestamp": int(i * gap), "input_length": 100, "output_length": out, "hash_ids": [i]}) + "\n")
PY
}

field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(" ".join(f"{d[k]:.3f}" if isinstance(d[k], float) else str(d[k]) for k in sys.argv[2:]))' "$@"; }

timed() { # timed LOG cmd...: runs cmd, prints "user sys wall peak steal" (seconds; peak: the
  # highest CPU rate, in cores, over any 1 s window of the run, sampled every 50 ms from /proc for
  # the process and its live descendants: the rate at full load, where a whole-run average also
  # counts the ramps up and down; steal: the VM's stolen time during the run in ms, /proc/stat's
  # steal ticks: the hypervisor ran something else while this machine had work, which stalls
  # client and server alike)
  local log=$1; shift
  python3 - "$log" "$@" <<'PY'
import os, resource, subprocess, sys, time
log = open(sys.argv[1], "w")
tick = os.sysconf("SC_CLK_TCK")
def tree_ticks(pid):
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])
            for t in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in open(f"/proc/{p}/task/{t}/children").read().split()]
        except (OSError, ValueError, IndexError):
            pass
    return total
def steal():
    return int(open("/proc/stat").readline().split()[8])
t = time.monotonic()
s0 = steal()
proc = subprocess.Popen(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT)
samples = []
while proc.poll() is None:
    samples.append((time.monotonic(), tree_ticks(proc.pid)))
    time.sleep(0.05)
wall = time.monotonic() - t
peak = 0.0
for i, (ta, ca) in enumerate(samples):
    for tb, cb in samples[i + 1:]:
        if tb - ta >= 1.0:
            peak = max(peak, (cb - ca) / tick / (tb - ta))
            break
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{r.ru_utime:.2f} {r.ru_stime:.2f} {wall:.2f} {peak:.2f} {(steal() - s0) * 1000 // tick}")
PY
}

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "${AIPERF:-}" ]; then
  SNAP="$OUT/hf/hub/models--retrace--word-tokenizer/snapshots/0123456789abcdef0123456789abcdef01234567"
  mkdir -p "$SNAP" "$OUT/hf/hub/models--retrace--word-tokenizer/refs"
  printf 0123456789abcdef0123456789abcdef01234567 >"$OUT/hf/hub/models--retrace--word-tokenizer/refs/main"
  python3 - "$SNAP" <<'PY'
import json, sys
d = sys.argv[1] + "/"
vocab = {"<s>": 0, "</s>": 1, "<unk>": 2}
for a in "abcdefghijklmnopqrstuvwxyz":
    for b in "abcdefgh":
        vocab["\u0120" + a + b] = len(vocab)
sp = lambda i, s: {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
json.dump({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [sp(0, "<s>"), sp(1, "</s>"), sp(2, "<unk>")],
           "normalizer": None, "pre_tokenizer": bl, "post_processor": None, "decoder": bl,
           "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}, open(d + "tokenizer.json", "w"))
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, open(d + "tokenizer_config.json", "w"))
json.dump({"model_type": "gpt2"}, open(d + "config.json", "w"))
PY
fi

if has fidelity; then
echo "== fidelity: mock --fixed-timing 50,10, 100-token outputs (truth: TTFT 50 ms, ITL 10 ms, std 0) =="
echo "   burst : 2C requests all due at t=0, --max-concurrency C (all C streams phase-aligned: C events"
echo "           due at the same instant every 10 ms; C requests reach the server at one instant)"
echo "   steady: 3C requests arriving uniformly, C per stream lifetime (1.04 s), open loop: C streams"
echo "           in flight with phases spread; measured on requests C..2C-1 (sent in the 2nd lifetime,"
echo "           which run while C others are in flight), whole run in brackets"
echo "   (mock_late: the mock's own emission lateness, mean/p99 ms, from its /metrics: what the server"
echo "    added; cpu: the client's CPU seconds during the run / wall seconds of the run, setup excluded"
echo "    (retrace: its result's client_cpu; AIPerf: whole process, setup included))"
printf "%-8s %-7s %-7s %-6s %-16s %-10s %-10s %-10s %-7s %-12s %-14s %-10s %s\n" streams scenario client reqs mean_ttft p99_ttft mean_itl std_itl failed mock_late "cpu_run/wall" peak_cores steal_ms
start_mock() { # start_mock: a fresh mock; sets MP (port) and MPID
  MP=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  # shellcheck disable=SC2086
  "$MOCK_BIN" mock --listen "127.0.0.1:$MP" --fixed-timing 50,10 --max-num-seqs 100000 --enable-per-request-metrics ${MOCK_ARGS:-} >"$OUT/mock_$1.log" 2>&1 &
  MPID=$!
  for _ in $(seq 50); do curl -sf "http://127.0.0.1:$MP/v1/models" >/dev/null 2>&1 && break; sleep 0.1; done
}
mock_late() {
  curl -s "http://127.0.0.1:$MP/metrics" | python3 -c '
import sys
s = c = p99 = 0.0
for l in sys.stdin:
    if l.startswith("retrace_mock_emit_lateness_seconds_sum"): s = float(l.split()[-1])
    if l.startswith("retrace_mock_emit_lateness_seconds_count"): c = float(l.split()[-1])
    if l.startswith("retrace_mock_emit_lateness_quantile_seconds") and "quantile=\"0.99\"" in l: p99 = float(l.split()[-1])
print(f"{(s / c * 1000 if c else 0):.2f}/{p99 * 1000:.2f}")'
}
# summary C SCENARIO CLIENT N RESULT LATE CPU WALL PEAK: one table row (window = requests C..2C-1 in steady)
summary() {
  python3 - "$@" <<'PY'
import json, sys
C, scen, client, n, path, late, cpu, wall, peak, steal = sys.argv[1:11]
C = int(C)
def stats(ttfts, itls):
    import statistics
    t = sorted(ttfts)
    p99 = t[min(len(t) - 1, int(round(0.99 * (len(t) - 1))))] if t else float("nan")
    flat = [x for v in itls for x in v]
    m = sum(flat) / len(flat) if flat else float("nan")
    sd = (sum((x - m) ** 2 for x in flat) / len(flat)) ** 0.5 if flat else float("nan")
    return sum(t) / len(t), p99, m, sd
try:
    if client in ("retrace", "floor"):
        d = json.load(open(path))
        ttfts = [x * 1e3 for x in d["ttfts"]]
        itls = [[x * 1e3 for x in v] for v in d["itls"]]
        order = sorted(range(len(ttfts)), key=lambda i: d["start_times"][i])
        failed = d["failed"]
    else:
        recs = [json.loads(l) for l in open(path)]
        recs.sort(key=lambda r: r["metadata"]["request_start_ns"])
        get = lambda r, k: (r.get("metrics", {}).get(k) or {}).get("value")
        ttfts = [get(r, "time_to_first_token") for r in recs]
        itls = [get(r, "inter_chunk_latency") or [] for r in recs]
        failed = sum(1 for t in ttfts if t is None)
        keep = [i for i, t in enumerate(ttfts) if t is not None]
        ttfts = [ttfts[i] for i in keep]
        itls = [itls[i] if isinstance(itls[i], list) else [itls[i]] for i in keep]
        order = list(range(len(ttfts)))
    whole = stats(ttfts, itls)
    if scen == "steady":
        w = order[C:2 * C]
        win = stats([ttfts[i] for i in w], [itls[i] for i in w])
        ttft = f"{win[0]:.2f} [{whole[0]:.2f}]"
        row = (ttft, f"{win[1]:.2f}", f"{win[2]:.3f}", f"{win[3]:.3f}")
    else:
        row = (f"{whole[0]:.2f}", f"{whole[1]:.2f}", f"{whole[2]:.3f}", f"{whole[3]:.3f}")
    print(f"{C:<8} {scen:<7} {client:<7} {n:<6} {row[0]:<16} {row[1]:<10} {row[2]:<10} {row[3]:<10} {failed:<7} {late:<12} {cpu + '/' + wall:<14} {peak:<10} {steal}")
except Exception as e:
    print(f"{C:<8} {scen:<7} {client:<7} (no result: {e}; see {path} and its log)")
PY
}
read -r -a RA <<<"${REPLAY_ARGS:-}"
for C in $CONCURRENCIES; do
  for SCEN in burst steady; do
    if [ $SCEN = burst ]; then
      N=$((2 * C)); [ $N -gt 2000 ] && N=2000
      gen "$OUT/${SCEN}_$C.jsonl" $N 0 100
      LIMIT=(--max-concurrency "$C")
    else
      N=$((3 * C))
      gen "$OUT/${SCEN}_$C.jsonl" $N "$(python3 -c "print(1040 / $C)")" 100
      LIMIT=()
    fi
    # a fresh mock per run, so its lateness counters cover this run only
    start_mock "${SCEN}_$C"
    T=$(timed "$OUT/${SCEN}_$C.log" "$BIN" replay "$OUT/${SCEN}_$C.jsonl" --target "http://127.0.0.1:$MP" \
        --model mock-llama "${LIMIT[@]}" "${RA[@]}" --detailed --result-json "$OUT/${SCEN}_$C.json")
    LATE=$(mock_late)
    read -r U S W PEAK STEAL <<<"$T"
    read -r CPU DUR <<<"$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); c=d["client_cpu"]["run_s"]; print("%.2f %.2fs" % (c, d["duration"]))' "$OUT/${SCEN}_$C.json")"
    summary "$C" $SCEN retrace "$N" "$OUT/${SCEN}_$C.json" "$LATE" "$CPU" "$DUR" "$PEAK" "$STEAL"
    kill $MPID 2>/dev/null || true; wait $MPID 2>/dev/null || true
    if [ -x "$FLOOR" ]; then
      start_mock "floor_${SCEN}_$C"
      FL=(); [ $SCEN = burst ] && FL=(--max-concurrency "$C")
      T=$(timed "$OUT/floor_${SCEN}_$C.log" "$FLOOR" --target "127.0.0.1:$MP" --trace "$OUT/${SCEN}_$C.jsonl" \
          --rx-stamp kernel "${FL[@]}" --out "$OUT/floor_${SCEN}_$C.json")
      LATE=$(mock_late)
      read -r U S W PEAK STEAL <<<"$T"
      read -r CPU DUR <<<"$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); c=d["client_cpu"]["run_s"]; print("%.2f %.2fs" % (c, d["duration"]))' "$OUT/floor_${SCEN}_$C.json")"
      summary "$C" $SCEN floor "$N" "$OUT/floor_${SCEN}_$C.json" "$LATE" "$CPU" "$DUR" "$PEAK" "$STEAL"
      kill $MPID 2>/dev/null || true; wait $MPID 2>/dev/null || true
    fi
    if [ -n "${AIPERF:-}" ]; then
      start_mock "aiperf_${SCEN}_$C"
      if [ $SCEN = burst ]; then
        MODE=(--concurrency "$C")
      else
        MODE=(--request-rate "$(python3 -c "print($C / 1.04)")" --arrival-pattern constant)
      fi
      T=$(HF_HOME="$OUT/hf" HF_HUB_OFFLINE=1 timed "$OUT/aiperf_${SCEN}_$C.log" timeout 600 "$AIPERF" profile --model mock-llama \
          --url "http://127.0.0.1:$MP" --endpoint-type completions --streaming "${MODE[@]}" \
          --request-count "$N" --isl 100 --osl 100 --use-server-token-count --ui none --no-server-metrics \
          --tokenizer retrace/word-tokenizer --extra-inputs ignore_eos:true --artifact-dir "$OUT/aiperf_${SCEN}_$C")
      LATE=$(mock_late)
      read -r U S W PEAK STEAL <<<"$T"
      summary "$C" $SCEN aiperf "$N" "$OUT/aiperf_${SCEN}_$C/profile_export.jsonl" "$LATE" \
        "$(python3 -c "print(f'{$U + $S:.2f}')")" "${W}s" "$PEAK" "$STEAL"
      kill $MPID 2>/dev/null || true; wait $MPID 2>/dev/null || true
    fi
  done
done

fi
if has dispatch; then
echo
echo "== dispatch: open loop, 2-token outputs, ${RATE_SECONDS} s =="
printf "%-8s %-10s %-6s %-12s %-12s %-12s %-10s %-8s %-12s\n" rate dispatcher reqs p99_drift_ms max_drift_ms achieved_rps mean_ttft failed "cpu(u+s)/wall"
N=$((1000 * RATE_SECONDS))
gen "$OUT/open.jsonl" $N 1 2
for SPEED in 1 2; do
  for RT in normal; do
    T=$(timed "$OUT/open_${SPEED}_$RT.log" "$BIN" replay "$OUT/open.jsonl" --target "http://127.0.0.1:$PORT" \
        --model mock-llama --speed $SPEED --result-json "$OUT/open_${SPEED}_$RT.json")
    read -r U S W _ <<<"$T"
    read -r PD MD RR MT F <<<"$(field "$OUT/open_${SPEED}_$RT.json" p99_drift_ms max_drift_ms request_throughput mean_ttft_ms failed)"
    printf "%-8s %-10s %-6s %-12s %-12s %-12s %-10s %-8s %-12s\n" "$((1000 * SPEED))/s" "$RT" "$N" "$PD" "$MD" "$RR" "$MT" "$F" "$(python3 -c "print(f'{($U+$S):.2f}/{$W:.2f}s')")"
  done
done
fi
if has scale; then
echo
echo "== scale: 10,000 concurrent streams (mock --fixed-timing 50,1000, 5-token outputs) =="
PORT2=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN" mock --listen "127.0.0.1:$PORT2" --fixed-timing 50,1000 --max-num-seqs 100000 >"$OUT/mock2.log" 2>&1 &
MOCK2=$!
trap 'kill $MOCK ${MPID:-} $MOCK2 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$PORT2/v1/models" >/dev/null 2>&1 && break; sleep 0.1; done
gen "$OUT/scale.jsonl" 10000 0 5
T=$(timed "$OUT/scale.log" "$BIN" replay "$OUT/scale.jsonl" --target "http://127.0.0.1:$PORT2" \
    --model mock-llama --warm-connections 10000 --result-json "$OUT/scale.json")
read -r U S W _ <<<"$T"
printf "%-10s %-8s %-10s %-10s %-12s\n" completed failed peak mean_ttft "cpu(u+s)/wall"
read -r C F P MT <<<"$(field "$OUT/scale.json" completed failed max_concurrent_requests mean_ttft_ms)"
printf "%-10s %-8s %-10s %-10s %-12s\n" "$C" "$F" "$P" "$MT" "$(python3 -c "print(f'{($U+$S):.2f}/{$W:.2f}s')")"
fi
if has trace && [ -n "${AIPERF:-}" ]; then
  echo
  echo "== trace: first 30 requests of traces/mooncake_conversation.trace.zst, exported to Mooncake JSONL =="
  echo "   (each client against its own fresh mock --fixed-timing 50,10 that tokenizes with the same"
  echo "    word-level tokenizer AIPerf uses, so both can send exact lengths; drift: send time minus the"
  echo "    trace's arrival offset, origin at the earliest send)"
  "$BIN" convert traces/mooncake_conversation.trace.zst --head 30 --to mooncake -o "$OUT/mc30.jsonl" >/dev/null 2>&1
  printf "%-8s %-6s %-12s %-12s %-14s %-12s\n" client reqs p50_drift_ms p99_drift_ms prompt_tokens prefix_hits
  for CLIENT in retrace aiperf; do
    P4=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$BIN" mock --listen "127.0.0.1:$P4" --model mock-llama --fixed-timing 50,10 --max-model-len 200000 \
      --tokenizer "$SNAP/tokenizer.json" >"$OUT/mock_trace_$CLIENT.log" 2>&1 &
    M4=$!
    for _ in $(seq 50); do curl -sf "http://127.0.0.1:$P4/v1/models" >/dev/null 2>&1 && break; sleep 0.1; done
    if [ $CLIENT = retrace ]; then
      "$BIN" replay "$OUT/mc30.jsonl" --target "http://127.0.0.1:$P4" --model mock-llama --detailed \
        --result-json "$OUT/trace_retrace.json" >"$OUT/trace_retrace.log" 2>&1
    else
      HF_HOME="$OUT/hf" HF_HUB_OFFLINE=1 timeout 600 "$AIPERF" profile --model mock-llama \
        --url "http://127.0.0.1:$P4" --endpoint-type completions --streaming --input-file "$OUT/mc30.jsonl" \
        --custom-dataset-type mooncake_trace --fixed-schedule --use-server-token-count --ui none \
        --no-server-metrics --tokenizer retrace/word-tokenizer --extra-inputs ignore_eos:true \
        --artifact-dir "$OUT/aiperf_trace" >"$OUT/trace_aiperf.log" 2>&1 || true
    fi
    curl -s "http://127.0.0.1:$P4/metrics" >"$OUT/trace_$CLIENT.metrics"
    kill $M4 2>/dev/null || true
    python3 - "$CLIENT" "$OUT" <<'PY'
import json, sys
client, out = sys.argv[1], sys.argv[2]
trace = [json.loads(l) for l in open(f"{out}/mc30.jsonl")]
ts = sorted(t["timestamp"] * 1e6 for t in trace)
try:
    if client in ("retrace", "floor"):
        d = json.load(open(f"{out}/trace_retrace.json"))
        starts = sorted(s * 1e9 for s in d["start_times"])
    else:
        recs = [json.loads(l) for l in open(f"{out}/aiperf_trace/profile_export.jsonl")]
        starts = sorted(r["metadata"]["request_start_ns"] for r in recs)
    offs = [s - t for s, t in zip(starts, ts)]
    base = min(offs)
    dr = sorted((o - base) / 1e6 for o in offs)
    m = {}
    for l in open(f"{out}/trace_{client}.metrics"):
        if l.startswith(("vllm:prompt_tokens_total", "vllm:prefix_cache_hits_total")):
            m[l.split("{")[0]] = int(float(l.split()[-1]))
    print(f"{client:<8} {len(starts):<6} {dr[len(dr) // 2]:<12.3f} {dr[int(0.99 * (len(dr) - 1))]:<12.3f} "
          f"{m.get('vllm:prompt_tokens_total', 0):<14} {m.get('vllm:prefix_cache_hits_total', 0):<12}")
except Exception as e:
    print(f"{client:<8} (no result: {e}; see {out}/trace_{client}.log)")
PY
  done
  echo "   trace input tokens: $(python3 -c "import json,sys; print(sum(json.loads(l)['input_length'] for l in open(sys.argv[1])))" "$OUT/mc30.jsonl")"
fi
echo
echo "results in $OUT"
