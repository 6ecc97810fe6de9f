#!/usr/bin/env bash
# Benchmark of `retrace mock` (loopback only, bounded): emission lateness at 1,000 concurrent
# streams in --fixed-timing 50,10, SSE events/s and CPU, and memory with 10,000 open streams.
# Usage: tools/bench/bench_mock.sh [extra retrace-mock args, e.g. --realtime]   (builds release first)
# The machine's load average is printed with each result: on a shared machine other work
# delays the mock's threads; `--realtime` (SCHED_FIFO, needs CAP_SYS_NICE) shields it.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --bin retrace --example bench_mock
B=target/release/examples/bench_mock
R=target/release/retrace
X="${*:-}"
# 1,000 streams x 100 tokens at 10 ms: ~100k events/s offered (the accuracy target).
$B --retrace $R --mock-args "$X" --label accuracy-1000 --streams 1000 --tokens 100 --ttft 50 --itl 10 --secs 10
# 500 streams: ~50k events/s offered (the throughput-at-one-core target).
$B --retrace $R --mock-args "$X" --label throughput-500 --streams 500 --tokens 100 --ttft 50 --itl 10 --secs 10
# 10,000 open streams (1 event/s each, 20 s streams) for memory.
$B --retrace $R --mock-args "$X" --label memory-10000 --streams 10000 --tokens 20 --ttft 50 --itl 1000 --secs 20
