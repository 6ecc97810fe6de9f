#!/usr/bin/env bash
# Where the replayer's CPU goes at C steady streams against `retrace mock --fixed-timing 50,10`
# (100-token outputs, the fidelity benchmark's steady scenario): `perf record -g` of the replay
# process, then the share of its samples in user space, in the kernel, in socket reads
# (`recvmsg`), in the ACKs those reads send (`__tcp_transmit_skb` under `tcp_recvmsg`), in the
# loopback peer's processing of those ACKs (`process_backlog`: on loopback the receiving side of
# our ACK, i.e. the mock's TCP stack, runs in our thread; across a network it runs on the
# server), in `epoll_wait`, and per thread. Also the run's CPU (the result's client_cpu) and wall.
# Loopback only, bounded (3*C requests).
# Usage: tools/bench/bench_replay_profile.sh [C]   (default 1000; build first: cargo build --release)
# Needs: perf (Debian linux-perf) and permission to use it (root, or perf_event_paranoid <= 1).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/retrace}
C=${1:-1000}
command -v perf >/dev/null || { echo "perf is needed (apt-get install -y linux-perf)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 2; }
T=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$T"' EXIT
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
python3 - "$T/steady.jsonl" "$C" <<'PY'
import json, sys
path, c = sys.argv[1], int(sys.argv[2])
with open(path, "w") as f:
    for i in range(3 * c):
        f.write(json.dumps({"timestamp": int(i * 1040 / c), "input_length": 100, "output_length": 100, "hash_ids": [i]}) + "\n")
PY
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN" mock --listen "127.0.0.1:$PORT" --fixed-timing 50,10 --max-num-seqs 100000 >"$T/mock.log" 2>&1 &
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1 && break; sleep 0.1; done
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $C steady streams, $((3 * C)) requests"
perf record -q -o "$T/perf.data" -F 2000 -g -- "$BIN" replay "$T/steady.jsonl" --target "http://127.0.0.1:$PORT" \
  --model mock-llama --result-json "$T/r.json" >"$T/replay.log" 2>&1
python3 - "$T/r.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"run CPU {d['client_cpu']['run_s']:.2f} s over {d['duration']:.2f} s = {d['client_cpu']['run_s'] / d['duration']:.3f} cores; "
      f"ITL std {d['std_itl_ms']:.3f} ms, mean TTFT {d['mean_ttft_ms']:.2f} ms, failed {d['failed']}")
PY
perf report -i "$T/perf.data" --children --sort sym -g none 2>/dev/null >"$T/children.txt"
perf report -i "$T/perf.data" --no-children --sort dso -g none 2>/dev/null >"$T/dso.txt"
perf report -i "$T/perf.data" --no-children --sort comm -g none 2>/dev/null >"$T/comm.txt"
python3 - "$T" <<'PY'
import re, sys
t = sys.argv[1]
def rows(name):
    out = []
    for l in open(f"{t}/{name}"):
        m = re.match(r"\s*([\d.]+)%\s+(?:([\d.]+)%\s+)?(.*)", l)
        if m and not l.lstrip().startswith("#"):
            out.append((float(m.group(1)), m.group(3).strip()))
    return out
kids = {}
for pct, sym in rows("children.txt"):
    sym = re.sub(r"^\[[k.]\]\s+", "", sym)
    kids.setdefault(sym, pct)
kernel = sum(p for p, s in rows("dso.txt") if "kernel" in s)
print(f"  kernel {kernel:.1f} %, user space {100 - kernel:.1f} % of the replayer's samples")
for label, sym in [("socket reads (recvmsg, all of it)", "__sys_recvmsg"),
                   ("  TCP transmits: the ACKs those reads send (+ requests)", "__tcp_transmit_skb"),
                   ("    loopback peer receiving them (process_backlog)", "process_backlog"),
                   ("epoll_wait", "do_epoll_wait"),
                   ("futex", "do_futex"),
                   ("sched_yield", "__x64_sys_sched_yield")]:
    print(f"  {label:<52} {kids.get(sym, 0.0):5.1f} %")
print("  per thread:", ", ".join(f"{s} {p:.1f} %" for p, s in rows("comm.txt")))
PY
