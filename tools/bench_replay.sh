#!/usr/bin/env bash
# Benchmark of `retrace replay` against `retrace mock --fixed-timing 50,10` (both release builds,
# separate processes, loopback only). Bounded: every run has a fixed request count.
#
#  1. Fidelity: 100-token outputs at 100/500/1000 concurrent streams (closed loop: all requests
#     due at t=0, --max-concurrency C, 2*C requests, at most 2000). Reports mean TTFT (true value:
#     50 ms), ITL mean and std (true: 10 ms, 0), and the replayer's CPU time.
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
# Usage: tools/bench_replay.sh [OUTDIR]   (build first: cargo build --release)
# Env: RATE_SECONDS (default 5), CONCURRENCIES (default "100 500 1000"), AIPERF.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/retrace}
OUT=${1:-$(mktemp -d /tmp/bench_replay.XXXX)}
RATE_SECONDS=${RATE_SECONDS:-5}
CONCURRENCIES=${CONCURRENCIES:-"100 500 1000"}
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN" mock --listen "127.0.0.1:$PORT" --fixed-timing 50,10 --max-num-seqs 100000 >"$OUT/mock.log" 2>&1 &
MOCK=$!
trap 'kill $MOCK 2>/dev/null || true' EXIT
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

timed() { # timed LOG cmd...: runs cmd, prints "user sys wall" seconds of it
  local log=$1; shift
  python3 - "$log" "$@" <<'PY'
import resource, subprocess, sys, time
log = open(sys.argv[1], "w")
t = time.monotonic()
subprocess.run(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT)
wall = time.monotonic() - t
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{r.ru_utime:.2f} {r.ru_stime:.2f} {wall:.2f}")
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

echo "== fidelity: mock --fixed-timing 50,10, 100-token outputs (truth: TTFT 50 ms, ITL 10 ms, std 0) =="
echo "   (mock_late: the mock's own emission lateness, mean/p99 ms, from its /metrics: what the server added)"
printf "%-8s %-6s %-10s %-10s %-10s %-10s %-8s %-14s %-12s\n" streams reqs mean_ttft p99_ttft mean_itl std_itl failed mock_late "cpu(u+s)/wall"
for C in $CONCURRENCIES; do
  N=$((2 * C)); [ $N -gt 2000 ] && N=2000
  # a fresh mock per level, so its lateness counters cover this run only
  P3=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$BIN" mock --listen "127.0.0.1:$P3" --fixed-timing 50,10 --max-num-seqs 100000 >"$OUT/mock_$C.log" 2>&1 &
  M3=$!
  for _ in $(seq 50); do curl -sf "http://127.0.0.1:$P3/v1/models" >/dev/null 2>&1 && break; sleep 0.1; done
  gen "$OUT/closed_$C.jsonl" $N 0 100
  T=$(timed "$OUT/closed_$C.log" "$BIN" replay "$OUT/closed_$C.jsonl" --target "http://127.0.0.1:$P3" \
      --model mock-llama --max-concurrency "$C" --result-json "$OUT/closed_$C.json")
  LATE=$(curl -s "http://127.0.0.1:$P3/metrics" | python3 -c '
import sys
s = c = p99 = 0.0
for l in sys.stdin:
    if l.startswith("retrace_mock_emit_lateness_seconds_sum"): s = float(l.split()[-1])
    if l.startswith("retrace_mock_emit_lateness_seconds_count"): c = float(l.split()[-1])
    if l.startswith("retrace_mock_emit_lateness_quantile_seconds") and "quantile=\"0.99\"" in l: p99 = float(l.split()[-1])
print(f"{(s / c * 1000 if c else 0):.2f}/{p99 * 1000:.2f}")')
  read -r U S W <<<"$T"
  read -r MT PT MI SI F <<<"$(field "$OUT/closed_$C.json" mean_ttft_ms p99_ttft_ms mean_itl_ms std_itl_ms failed)"
  printf "%-8s %-6s %-10s %-10s %-10s %-10s %-8s %-14s %-12s\n" "$C" "$N" "$MT" "$PT" "$MI" "$SI" "$F" "$LATE" "$(python3 -c "print(f'{($U+$S):.2f}/{$W:.2f}s')")"
  if [ -n "${AIPERF:-}" ]; then
    T=$(HF_HOME="$OUT/hf" HF_HUB_OFFLINE=1 timed "$OUT/aiperf_$C.log" timeout 600 "$AIPERF" profile --model mock-llama \
        --url "http://127.0.0.1:$P3" --endpoint-type completions --streaming --concurrency "$C" \
        --request-count "$N" --isl 100 --osl 100 --use-server-token-count --ui none --no-server-metrics \
        --tokenizer retrace/word-tokenizer --extra-inputs ignore_eos:true --artifact-dir "$OUT/aiperf_$C")
    read -r U S W <<<"$T"
    python3 - "$OUT/aiperf_$C/profile_export_aiperf.json" "$C" "$N" "$U" "$S" "$W" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    t, icl = d["time_to_first_token"], d["inter_chunk_latency"]
    fail = d.get("error_request_count", {}).get("avg", 0) if isinstance(d.get("error_request_count"), dict) else 0
    cpu = float(sys.argv[4]) + float(sys.argv[5])
    print(f"{'aiperf':<8} {sys.argv[3]:<6} {t['avg']:<10.3f} {t['p99']:<10.3f} {icl['avg']:<10.3f} {icl['std']:<10.3f} {fail:<8} {'-':<14} {cpu:.2f}/{float(sys.argv[6]):.2f}s")
except Exception as e:
    print(f"aiperf   (no result: {e}; see its log)")
PY
  fi
  kill $M3 2>/dev/null || true
done

echo
echo "== dispatch: open loop, 2-token outputs, ${RATE_SECONDS} s =="
printf "%-8s %-10s %-6s %-12s %-12s %-12s %-10s %-8s %-12s\n" rate dispatcher reqs p99_drift_ms max_drift_ms achieved_rps mean_ttft failed "cpu(u+s)/wall"
N=$((1000 * RATE_SECONDS))
gen "$OUT/open.jsonl" $N 1 2
for SPEED in 1 2; do
  for RT in normal realtime; do
    EXTRA=""; [ $RT = realtime ] && EXTRA="--realtime"
    T=$(timed "$OUT/open_${SPEED}_$RT.log" "$BIN" replay "$OUT/open.jsonl" --target "http://127.0.0.1:$PORT" \
        --model mock-llama --speed $SPEED $EXTRA --result-json "$OUT/open_${SPEED}_$RT.json")
    read -r U S W <<<"$T"
    read -r PD MD RR MT F <<<"$(field "$OUT/open_${SPEED}_$RT.json" p99_drift_ms max_drift_ms request_throughput mean_ttft_ms failed)"
    printf "%-8s %-10s %-6s %-12s %-12s %-12s %-10s %-8s %-12s\n" "$((1000 * SPEED))/s" "$RT" "$N" "$PD" "$MD" "$RR" "$MT" "$F" "$(python3 -c "print(f'{($U+$S):.2f}/{$W:.2f}s')")"
  done
done
echo
echo "== scale: 10,000 concurrent streams (mock --fixed-timing 50,1000, 5-token outputs) =="
PORT2=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN" mock --listen "127.0.0.1:$PORT2" --fixed-timing 50,1000 --max-num-seqs 100000 >"$OUT/mock2.log" 2>&1 &
MOCK2=$!
trap 'kill $MOCK $MOCK2 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$PORT2/v1/models" >/dev/null 2>&1 && break; sleep 0.1; done
gen "$OUT/scale.jsonl" 10000 0 5
T=$(timed "$OUT/scale.log" "$BIN" replay "$OUT/scale.jsonl" --target "http://127.0.0.1:$PORT2" \
    --model mock-llama --warm-connections 10000 --result-json "$OUT/scale.json")
read -r U S W <<<"$T"
printf "%-10s %-8s %-10s %-10s %-12s\n" completed failed peak mean_ttft "cpu(u+s)/wall"
read -r C F P MT <<<"$(field "$OUT/scale.json" completed failed max_concurrent_requests mean_ttft_ms)"
printf "%-10s %-8s %-10s %-10s %-12s\n" "$C" "$F" "$P" "$MT" "$(python3 -c "print(f'{($U+$S):.2f}/{$W:.2f}s')")"
if [ -n "${AIPERF:-}" ]; then
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
    if client == "retrace":
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
