#!/usr/bin/env bash
# Native trace format benchmark (release build). Usage: tools/bench/bench_trace.sh [MOONCAKE_JSONL]
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo run --release --quiet --example bench_trace -- "${1:-../shared/traces/mooncake_conversation_trace.jsonl}"
