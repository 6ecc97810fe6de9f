#!/usr/bin/env bash
# Does AIPerf load our Mooncake export of a recording, and replay it?
#
#  1. `retrace mock` (fixed timing) with `retrace record` in front of it.
#  2. A short workload through the recorder: `retrace replay` of a generated Mooncake trace (shared
#     prefixes, open loop, so responses end out of arrival order), plus what real clients add:
#     GET /v1/models, /tokenize, /metrics, a non-streamed chat request and an unknown model (404).
#  3. `retrace convert REC -o export.jsonl`; checked: sorted, no zero-length rows, side requests and
#     the failed request left out.
#  4. AIPerf 0.13 (its own venv, tools/venv/aiperf.sh) replays export.jsonl against a fresh mock:
#     --custom-dataset-type mooncake_trace --fixed-schedule --use-server-token-count.
#  5. `retrace compare` reads AIPerf's two exports (aggregate vs per-request: the same figures).
#  Prints whether AIPerf loaded the file, how many requests it completed, and how its prompt
#  lengths (as the server counted them) compare with the export's.
#
# Not part of CI (AIPerf is a ~1.2 GB install). Offline: the tokenizer reaches AIPerf through a
# private Hugging Face cache folder with HF_HUB_OFFLINE=1 (it will not load a plain local path).
# Env: RETRACE_BIN (default target/release/retrace, built if missing), TOKENIZER (a
# tokenizer.json; default ../shared/realserver-llamacpp/tokenizer.json if present, else a generated
# word-level one), REQUESTS (default 40), OUT (work dir, default a fresh temporary one),
# AIPERF_VENV (default tools/venv/.aiperf).
# AIPerf's exports stay in OUT/aiperf/: profile_export.jsonl (per request) and
# profile_export_aiperf.json (aggregate), the fixtures/aiperf/ files `compare` reads.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${RETRACE_BIN:-target/release/retrace}"
REQUESTS="${REQUESTS:-40}"
OUT="${OUT:-$(mktemp -d /tmp/retrace-aiperf-export.XXXXXX)}"
mkdir -p "$OUT"
if [ ! -x "$BIN" ]; then
  echo "== building $BIN (cargo build --release)"
  cargo build --release --locked
fi
echo "== AIPerf venv (tools/venv/aiperf.sh)"
PY="$(tools/venv/aiperf.sh "${AIPERF_VENV:-tools/venv/.aiperf}")"
AIPERF="$(dirname "$PY")/aiperf"
echo "aiperf $("$AIPERF" --version 2>/dev/null | tail -1), python $("$PY" -c 'import sys; print(sys.version.split()[0])')"

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() {
  for _ in $(seq 100); do curl -sf "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "not up: $1" >&2
  return 1
}

# The tokenizer, as a Hugging Face cache entry `retrace/tok` (AIPerf) and a file (the mock).
REV=0123456789abcdef0123456789abcdef01234567
SNAP="$OUT/hf/hub/models--retrace--tok/snapshots/$REV"
mkdir -p "$SNAP" "$OUT/hf/hub/models--retrace--tok/refs"
printf %s "$REV" >"$OUT/hf/hub/models--retrace--tok/refs/main"
TOKENIZER="${TOKENIZER:-}"
if [ -z "$TOKENIZER" ] && [ -f ../shared/realserver-llamacpp/tokenizer.json ]; then
  TOKENIZER=../shared/realserver-llamacpp/tokenizer.json
fi
if [ -n "$TOKENIZER" ]; then
  cp "$TOKENIZER" "$SNAP/tokenizer.json"
else
  TOKENIZER="generated word-level"
  python3 - "$SNAP" <<'PY'
import json, sys
vocab = {"<s>": 0, "</s>": 1, "<unk>": 2}
for a in "abcdefghijklmnopqrstuvwxyz":
    for b in "abcdefgh":
        vocab["\u0120" + a + b] = len(vocab)
sp = lambda i, s: {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                   "normalized": False, "special": True}
bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
json.dump({"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [sp(0, "<s>"), sp(1, "</s>"), sp(2, "<unk>")],
           "normalizer": None, "pre_tokenizer": bl, "post_processor": None, "decoder": bl,
           "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}},
          open(sys.argv[1] + "/tokenizer.json", "w"))
PY
fi
printf '{"tokenizer_class": "PreTrainedTokenizerFast"}\n' >"$SNAP/tokenizer_config.json"
printf '{"model_type": "llama"}\n' >"$SNAP/config.json"
echo "tokenizer: $TOKENIZER"

start_mock() { # port log
  "$BIN" mock --listen "127.0.0.1:$1" --model mock-llama --fixed-timing 20,5 --max-model-len 200000 \
    --tokenizer "$SNAP/tokenizer.json" >"$2" 2>&1 &
  PIDS+=($!)
  wait_up "http://127.0.0.1:$1/v1/models"
}

echo "== 1. record: retrace record in front of retrace mock --fixed-timing 20,5"
UP=$(free_port)
start_mock "$UP" "$OUT/mock_record.log"
RP=$(free_port)
"$BIN" record --listen "127.0.0.1:$RP" --upstream "http://127.0.0.1:$UP" --out "$OUT/rec" \
  --tokenizer "$SNAP/tokenizer.json" --admin none >"$OUT/record.log" 2>&1 &
REC=$!
PIDS+=($REC)
wait_up "http://127.0.0.1:$RP/v1/models"
REC_URL="http://127.0.0.1:$RP"

echo "== 2. workload: $REQUESTS requests (retrace replay of a generated trace) + side requests"
python3 - "$OUT/workload.jsonl" "$REQUESTS" <<'PY'
import json, random, sys
random.seed(7)
rows, t, nid = [], 0.0, 1000
groups = [[g * 10 + k for k in range(2)] for g in range(4)]   # 4 shared 2-block prefixes
for i in range(int(sys.argv[2])):
    t += random.expovariate(1 / 80.0)                         # ~12 req/s
    prefix = groups[i % 4][: 1 + i % 2]
    own = random.randint(1, 2)
    ids = prefix + list(range(nid, nid + own)); nid += own
    tail = random.randint(1, 511)                             # a partial last block
    rows.append({"timestamp": int(t), "input_length": 512 * (len(ids) - 1) + tail,
                 "output_length": random.randint(8, 48), "hash_ids": ids})
open(sys.argv[1], "w").write("".join(json.dumps(r) + "\n" for r in rows))
PY
curl -sf "$REC_URL/v1/models" >/dev/null
curl -sf "$REC_URL/tokenize" -H 'content-type: application/json' \
  -d '{"model": "mock-llama", "prompt": "hello world"}' >/dev/null
timeout 120 "$BIN" replay "$OUT/workload.jsonl" --target "$REC_URL" --model mock-llama \
  --result-json "$OUT/record_client.json" >"$OUT/record_client.log" 2>&1
curl -sf "$REC_URL/metrics" >/dev/null
curl -sf "$REC_URL/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model": "mock-llama", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 12, "ignore_eos": true}' >/dev/null
[ "$(curl -s -o /dev/null -w '%{http_code}' "$REC_URL/v1/completions" -H 'content-type: application/json' \
  -d '{"model": "no-such-model", "prompt": "hi", "max_tokens": 4}')" = 404 ]
kill -INT "$REC"
wait "$REC" || true
tail -1 "$OUT/record.log"
TRACE=$(ls "$OUT"/rec/*.trace.zst)
"$BIN" inspect "$TRACE" | grep -E '^(requests|endpoints|auxiliary|  errors)' || true

echo "== 3. export: retrace convert REC -o export.jsonl"
"$BIN" convert "$TRACE" -o "$OUT/export.jsonl" 2>&1 | tail -3
python3 - "$OUT/export.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ts = [r["timestamp"] for r in rows]
zero = sum(1 for r in rows if r["input_length"] == 0 or r["output_length"] == 0)
print(f"export: {len(rows)} rows, sorted by timestamp: {ts == sorted(ts)}, zero-length rows: {zero}, "
      f"input tokens {sum(r['input_length'] for r in rows)}, span {ts[-1] - ts[0]} ms")
PY

echo "== 4. AIPerf replays export.jsonl (mooncake_trace, fixed schedule) against a fresh mock"
AP=$(free_port)
start_mock "$AP" "$OUT/mock_aiperf.log"
set +e
HF_HOME="$OUT/hf" HF_HUB_OFFLINE=1 timeout 600 "$AIPERF" profile --model mock-llama \
  --url "http://127.0.0.1:$AP" --endpoint-type completions --streaming \
  --input-file "$OUT/export.jsonl" --custom-dataset-type mooncake_trace --fixed-schedule \
  --use-server-token-count --ui none --no-server-metrics --tokenizer retrace/tok \
  --extra-inputs ignore_eos:true --artifact-dir "$OUT/aiperf" >"$OUT/aiperf.log" 2>&1
RC=$?
set -e
echo "aiperf exit status: $RC (log: $OUT/aiperf.log)"
python3 - "$OUT" "$RC" <<'PY'
import glob, json, sys
out, rc = sys.argv[1], int(sys.argv[2])
log = open(f"{out}/aiperf.log", errors="replace").read()
rows = [json.loads(l) for l in open(f"{out}/export.jsonl")]
files = glob.glob(f"{out}/aiperf/**/profile_export.jsonl", recursive=True)
if not files:
    errs = [l for l in log.splitlines() if "error" in l.lower()][-5:]
    print("AIPerf loaded the file: no (no profile_export.jsonl)")
    print("\n".join("  " + e.strip()[:300] for e in errs))
    sys.exit(0)
recs = [json.loads(l) for l in open(files[0])]
ok = [r for r in recs if not r.get("error")]
print(f"AIPerf loaded the file: yes ({len(rows)} rows); requests sent {len(recs)}, completed {len(ok)}, "
      f"failed {len(recs) - len(ok)}")
def metric(r, k):
    v = r.get("metrics", {}).get(k)
    return v.get("value") if isinstance(v, dict) else v
# Paired in send order (a fixed schedule sends in the export's order).
recs_by_send = sorted(recs, key=lambda r: r["metadata"].get("request_start_ns", 0))
rows_by_time = sorted(rows, key=lambda r: r["timestamp"])
from collections import Counter
d_in = Counter(metric(r, "input_sequence_length") - w["input_length"]
               for r, w in zip(recs_by_send, rows_by_time) if metric(r, "input_sequence_length") is not None)
d_out = Counter(metric(r, "output_sequence_length") - w["output_length"]
                for r, w in zip(recs_by_send, rows_by_time) if metric(r, "output_sequence_length") is not None)
fmt = lambda c: ", ".join(f"{k:+d}: {n}" for k, n in sorted(c.items()))
print(f"server-counted prompt length minus the export's, requests per difference: {fmt(d_in)}")
print(f"output length minus the export's, requests per difference: {fmt(d_out)}")
starts = sorted(r["metadata"]["request_start_ns"] for r in recs)
ts = sorted(r["timestamp"] * 1e6 for r in rows)
offs = [s - t for s, t in zip(starts, ts)]
dr = sorted((o - min(offs)) / 1e6 for o in offs)
print(f"AIPerf send drift vs the export's schedule (ms): p50 {dr[len(dr) // 2]:.1f}, "
      f"p99 {dr[int(0.99 * (len(dr) - 1))]:.1f}, max {dr[-1]:.1f}")
for f in glob.glob(f"{out}/aiperf/**/profile_export_aiperf.json", recursive=True):
    s = json.load(open(f))
    def avg(k):
        v = s.get(k)
        return f"{v['avg']:.1f}" if isinstance(v, dict) and "avg" in v else "-"
    print(f"AIPerf summary: request_count {s.get('request_count', {}).get('avg', '-')}, "
          f"TTFT avg {avg('time_to_first_token')} ms, ITL avg {avg('inter_token_latency')} ms "
          f"(mock: 20 ms, 5 ms)")
print(f"per-request export: {files[0]}")
PY
echo "== 5. retrace compare reads AIPerf's exports (aggregate vs per-request)"
AGG=$(find "$OUT/aiperf" -name profile_export_aiperf.json | head -1)
RECS=$(find "$OUT/aiperf" -name profile_export.jsonl | head -1)
if [ -n "$AGG" ] && [ -n "$RECS" ]; then
  "$BIN" compare "$AGG" "$RECS" | grep -E '^(baseline|candidate|mean (TTFT|TPOT|ITL|E2EL)|request throughput)'
fi
echo "work dir: $OUT"
