#!/usr/bin/env bash
# The real `vllm bench serve` client as the recorded traffic: its openai (completions) and
# openai-chat backends, random dataset, through `retrace record` in front of `retrace mock
# --profile fast`. Then: inspect the recording (side requests: /tokenize, /detokenize, /metrics),
# replay it against a fresh mock (with the tokenizer, so chat requests without stored bodies are
# rebuilt), and `compare RECORDING REPLAY` (faithful or not, latency agreement).
#
# Usage: tools/bench/bench_vllm_client.sh [OUTDIR]   (build first: cargo build --release)
# Env: N (prompts per backend, default 40), RATE (req/s, default 20), TOKENIZER_JSON (default
#      ../shared/realserver-llamacpp/tokenizer.json, vocab 4096 byte-level BPE), VLLM (the vllm
#      command; default: tools/venv/vllm.sh installs it, several GB), SERVER=URL SERVER_MODEL=NAME:
#      a real server instead of the mocks (recorded and replayed against it, e.g. llama-server
#      from ../shared/realserver-llamacpp/start.sh). Loopback only; bounded by N.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/retrace}
OUT=${1:-$(mktemp -d /tmp/bench_vllm_client.XXXX)}
N=${N:-40}
RATE=${RATE:-20}
TOKENIZER_JSON=${TOKENIZER_JSON:-../shared/realserver-llamacpp/tokenizer.json}
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
VLLM=${VLLM:-$(tools/venv/vllm.sh)}
mkdir -p "$OUT/rec" "$OUT/tok" "$OUT/res"
cp "$TOKENIZER_JSON" "$OUT/tok/tokenizer.json"
# vllm's client loads the tokenizer with transformers; a chat template is needed for openai-chat.
cat >"$OUT/tok/tokenizer_config.json" <<'JSON'
{"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
 "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"}
JSON
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { for _ in $(seq 100); do curl -sf "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "not up: $1" >&2; return 1; }
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
px=$(port); MODEL=${SERVER_MODEL:-tiny-llama}
if [ -n "${SERVER:-}" ]; then
  upstream=$SERVER
else
  up=$(port); upstream="http://127.0.0.1:$up"
  "$BIN" mock --listen "127.0.0.1:$up" --model "$MODEL" --profile fast --tokenizer "$OUT/tok/tokenizer.json" >"$OUT/mock1.log" 2>&1 & PIDS+=($!); m1=$!
fi
wait_up "$upstream/v1/models"
"$BIN" record --listen "127.0.0.1:$px" --upstream "$upstream" --out "$OUT/rec" --admin none \
  >"$OUT/record.log" 2>&1 & PIDS+=($!); rp=$!
wait_up "http://127.0.0.1:$px/v1/models"
bench() { # backend endpoint result-name
  timeout 600 "$VLLM" bench serve --backend "$1" --endpoint "$2" --base-url "http://127.0.0.1:$px" \
    --model "$MODEL" --tokenizer "$OUT/tok" --dataset-name random --random-input-len 64 \
    --random-output-len 16 --num-prompts "$N" --request-rate "$RATE" --seed 1 \
    --save-result --save-detailed --result-dir "$OUT/res" --result-filename "$3" >"$OUT/$3.log" 2>&1
}
bench openai /v1/completions vllm-openai.json
bench openai-chat /v1/chat/completions vllm-chat.json
kill -INT "$rp"; wait "$rp" || true
[ -z "${SERVER:-}" ] && { kill "$m1"; wait "$m1" 2>/dev/null || true; }
rec=$(ls "$OUT"/rec/*.trace.zst | head -1)
echo "# bench_vllm_client $(date -u +%Y-%m-%dT%H:%MZ): vllm bench serve $("$(dirname "$VLLM")/python" -c 'import importlib.metadata as m; print(m.version("vllm"))'), $N prompts per backend at $RATE req/s, through retrace record, ${SERVER:-mock --profile fast}"
echo "## inspect RECORDING"
"$BIN" inspect "$rec" | grep -E "^(requests|endpoints|auxiliary|input length|output length)"
if [ -n "${SERVER:-}" ]; then
  target=$SERVER
else
  fresh=$(port); target="http://127.0.0.1:$fresh"
  "$BIN" mock --listen "127.0.0.1:$fresh" --model "$MODEL" --profile fast --tokenizer "$OUT/tok/tokenizer.json" >"$OUT/mock2.log" 2>&1 & PIDS+=($!); m2=$!
  wait_up "$target/v1/models"
fi
"$BIN" replay "$rec" --target "$target" --tokenizer "$OUT/tok/tokenizer.json" \
  --prompt-mode text --detailed --result-json "$OUT/res/replay.json" >"$OUT/replay.txt" 2>&1 || true
[ -z "${SERVER:-}" ] && { kill "$m2"; wait "$m2" 2>/dev/null || true; }
grep -E "^retrace: (text prompts|left out)" "$OUT/replay.txt" || true
echo "## compare RECORDING REPLAY (workload)"
"$BIN" compare "$rec" "$OUT/res/replay.json" | sed -n '/^Workload/,/Latency agreement/p'
echo "## requests by endpoint in the replay"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["requests_by_endpoint"], "left out:", r["left_out"])' "$OUT/res/replay.json"
echo "# outputs in $OUT"
