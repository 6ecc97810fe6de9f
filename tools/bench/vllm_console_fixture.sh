#!/usr/bin/env bash
# Captures the real `vllm bench serve` console block and its `--save-result --save-detailed` file
# for the layout tests: the vLLM 0.32 client (random dataset, --max-concurrency, --request-rate,
# --goodput, three percentiles, probes) against `retrace mock --profile fast` on loopback.
# Writes fixtures/vllm/bench_serve_console_block.txt (the "Serving Benchmark Result" block,
# verbatim) and fixtures/vllm/bench_serve_result_random.json. Not run by CI.
#
# Usage: tools/bench/vllm_console_fixture.sh [OUTDIR]   (build first: cargo build --release)
# Env: VLLM (the vllm command; default: tools/venv/vllm.sh installs it), TOKENIZER_JSON (default
#      ../shared/realserver-llamacpp/tokenizer.json).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/retrace}
OUT=${1:-$(mktemp -d /tmp/vllm_console_fixture.XXXX)}
TOKENIZER_JSON=${TOKENIZER_JSON:-../shared/realserver-llamacpp/tokenizer.json}
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
VLLM=${VLLM:-$(tools/venv/vllm.sh)}
mkdir -p "$OUT/tok" "$OUT/res"
cp "$TOKENIZER_JSON" "$OUT/tok/tokenizer.json"
cat >"$OUT/tok/tokenizer_config.json" <<'JSON'
{"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}
JSON
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { for _ in $(seq 100); do curl -sf "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "not up: $1" >&2; return 1; }
up=$(port)
"$BIN" mock --listen "127.0.0.1:$up" --model tiny-llama --profile fast \
  --tokenizer "$OUT/tok/tokenizer.json" >"$OUT/mock.log" 2>&1 &
mock=$!
trap 'kill "$mock" 2>/dev/null || true' EXIT
wait_up "http://127.0.0.1:$up/v1/models"
timeout 600 "$VLLM" bench serve --backend openai --endpoint /v1/completions \
  --base-url "http://127.0.0.1:$up" --model tiny-llama --tokenizer "$OUT/tok" \
  --dataset-name random --random-input-len 64 --random-output-len 16 --num-prompts 40 \
  --request-rate 20 --max-concurrency 4 --goodput ttft:50 --metric-percentiles 50,90,99 \
  --probe-request-rate 2 --seed 1 --save-result --save-detailed --result-dir "$OUT/res" \
  --result-filename result.json >"$OUT/bench.log" 2>&1
# The block: from its title rule to the closing rule of 50 '=' (trailing spaces kept).
awk '/^=+ Serving Benchmark Result =+$/{on=1} on{print} on && /^={50}$/{exit}' "$OUT/bench.log" \
  >fixtures/vllm/bench_serve_console_block.txt
cp "$OUT/res/result.json" fixtures/vllm/bench_serve_result_random.json
echo "vllm $("$(dirname "$VLLM")/python" -c 'import importlib.metadata as m; print(m.version("vllm"))'); outputs in $OUT"
