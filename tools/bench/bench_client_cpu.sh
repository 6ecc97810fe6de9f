#!/usr/bin/env bash
# Client CPU of `retrace replay` beside `vllm bench serve` at C streams: the same workload (random
# prompts of ISL tokens, OSL streamed tokens each, ignore_eos, closed loop at C in flight) against
# the same kind of server, a fresh `retrace mock --fixed-timing 50,10` per run. Each client runs
# twice per round, with N1 and N2 requests; the marginal user and system CPU per request,
# (cpu(N2) - cpu(N1)) / (N2 - N1), cancels start-up (Python's imports, the trace read) and
# shutdown. Clients alternate order round by round; medians over ROUNDS rounds, with the ratio
# retrace / vllm of the medians. STRACE=1 adds one `strace -c -f` run of each client at N2
# (syscall counts and their system time), which shows where system time goes. BIN_B=PATH adds a
# second retrace build as client `retrace-b` (an A/B of builds in the same run); VLLM=none leaves
# vllm out.
# Usage: tools/bench/bench_client_cpu.sh   (build first: cargo build --release)
# Env: C (default 100), N1 (default 200), N2 (default 1000), ISL (64), OSL (128), ROUNDS (5),
#      VLLM (the vllm command; default: tools/venv/vllm.sh installs it, several GB),
#      TOKENIZER_JSON (default ../shared/realserver-llamacpp/tokenizer.json).
# Loopback only; bounded by N2 requests a run and a 600 s limit on every client.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/retrace}
C=${C:-100}; N1=${N1:-200}; N2=${N2:-1000}; ISL=${ISL:-64}; OSL=${OSL:-128}; ROUNDS=${ROUNDS:-5}
TOKENIZER_JSON=${TOKENIZER_JSON:-../shared/realserver-llamacpp/tokenizer.json}
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
VLLM=${VLLM:-$(tools/venv/vllm.sh)}
CLIENTS=(retrace)
[ -n "${BIN_B:-}" ] && CLIENTS+=(retrace-b)
[ "$VLLM" != none ] && CLIENTS+=(vllm)
T=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$T"' EXIT
mkdir -p "$T/tok"
cp "$TOKENIZER_JSON" "$T/tok/tokenizer.json"
cat >"$T/tok/tokenizer_config.json" <<'JSON'
{"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}
JSON
for n in "$N1" "$N2"; do
  python3 - "$T/t$n.jsonl" "$n" "$ISL" "$OSL" <<'PY'
import json, sys
path, n, isl, osl = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
with open(path, "w") as f:
    for i in range(n):
        f.write(json.dumps({"timestamp": 0, "input_length": isl, "output_length": osl, "hash_ids": [i]}) + "\n")
PY
done
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
mock() { # starts a fresh mock; sets URL and MOCK
  local p; p=$(port)
  "$BIN" mock --listen "127.0.0.1:$p" --model tiny-llama --fixed-timing 50,10 --max-num-seqs 100000 \
    >"$T/mock.log" 2>&1 &
  MOCK=$!; URL="http://127.0.0.1:$p"
  for _ in $(seq 100); do curl -sf "$URL/v1/models" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "mock not up" >&2; exit 1
}
# run CLIENT N [WRAPPER...]: prints "user sys" CPU seconds of the client process and its children
run() {
  local client=$1 n=$2; shift 2
  mock
  local cmd
  if [ "$client" = vllm ]; then
    cmd=("$VLLM" bench serve --backend vllm --base-url "$URL" --model tiny-llama --tokenizer "$T/tok"
      --dataset-name random --random-input-len "$ISL" --random-output-len "$OSL" --random-range-ratio 0
      --ignore-eos --num-prompts "$n" --max-concurrency "$C" --request-rate inf --seed 1
      --disable-tqdm)
  else
    local bin=$BIN
    [ "$client" = retrace-b ] && bin=$BIN_B
    cmd=("$bin" replay "$T/t$n.jsonl" --target "$URL" --model tiny-llama --max-concurrency "$C"
      --result-json "$T/r.json")
  fi
  timeout 600 /usr/bin/time -f "%U %S" -o "$T/time" "$@" "${cmd[@]}" >"$T/$client.log" 2>&1 \
    || { echo "$client failed:" >&2; tail -20 "$T/$client.log" >&2; exit 1; }
  kill "$MOCK"; wait "$MOCK" 2>/dev/null || true
  if [ "$client" = vllm ]; then
    grep -q "Successful requests: *$n\b" "$T/$client.log" || { echo "vllm: not all $n ok" >&2; tail -30 "$T/$client.log" >&2; exit 1; }
  else
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["completed"] == int(sys.argv[2]) and d["failed"] == 0, (d["completed"], d["failed"]); print(sys.argv[3], d["mean_ttft_ms"], d["std_itl_ms"])' \
      "$T/r.json" "$n" "$client" >>"$T/fidelity.txt"
  fi
  cat "$T/time"
}
echo "# bench_client_cpu $(date -u +%Y-%m-%dT%H:%MZ): $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $C streams, ISL $ISL, OSL $OSL, N1 $N1, N2 $N2, $ROUNDS rounds; clients ${CLIENTS[*]}"
[ "$VLLM" != none ] && echo "# vllm $("$(dirname "$VLLM")/python" -c 'import importlib.metadata as m; print(m.version("vllm"))')"
echo "round client user_n1 sys_n1 user_n2 sys_n2 marginal_user_ms_per_req marginal_sys_ms_per_req"
for r in $(seq "$ROUNDS"); do
  order=("${CLIENTS[@]}")
  [ $((r % 2)) -eq 0 ] && order=($(printf '%s\n' "${CLIENTS[@]}" | tac))
  for c in "${order[@]}"; do
    read -r u1 s1 <<<"$(run "$c" "$N1")"
    read -r u2 s2 <<<"$(run "$c" "$N2")"
    python3 -c 'import sys; r,c,u1,s1,u2,s2,d=sys.argv[1:]; u1,s1,u2,s2,d=map(float,(u1,s1,u2,s2,d)); print(r,c,u1,s1,u2,s2,f"{(u2-u1)/d*1000:.3f}",f"{(s2-s1)/d*1000:.3f}")' \
      "$r" "$c" "$u1" "$s1" "$u2" "$s2" "$((N2 - N1))"
  done
done | tee "$T/rows.txt"
python3 - "$T/rows.txt" "$T/fidelity.txt" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1]) if l[0].isdigit()]
med = {}
for c in dict.fromkeys(r[1] for r in rows):
    mine = [r for r in rows if r[1] == c]
    med[c] = (st.median(float(r[6]) for r in mine), st.median(float(r[7]) for r in mine),
              st.median(float(r[4]) + float(r[5]) for r in mine))
    print(f"{c}: median marginal CPU per request: user {med[c][0]:.3f} ms, system {med[c][1]:.3f} ms, "
          f"total {med[c][0] + med[c][1]:.3f} ms; whole run at N2 {med[c][2]:.2f} s")
fid = [l.split() for l in open(sys.argv[2])]
for c in dict.fromkeys(f[0] for f in fid):
    mine = [f for f in fid if f[0] == c]
    print(f"{c}: median over its runs: mean TTFT {st.median(float(f[1]) for f in mine):.2f} ms, "
          f"ITL std {st.median(float(f[2]) for f in mine):.3f} ms (truth 50 and 0)")
r = med["retrace"]
for peer in (c for c in med if c != "retrace"):
    v = med[peer]
    print(f"retrace / {peer}: user {r[0] / v[0]:.2f}, system {r[1] / v[1]:.2f}, "
          f"total {(r[0] + r[1]) / (v[0] + v[1]):.2f}")
PY
if [ -n "${STRACE:-}" ]; then
  for c in "${CLIENTS[@]}"; do
    echo "## strace -c -f, $c, $N2 requests"
    run "$c" "$N2" strace -c -f -o "$T/strace_$c.txt" >/dev/null
    head -25 "$T/strace_$c.txt"
  done
fi
