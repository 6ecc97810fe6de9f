//! Command-line interface: one clap `Args` struct per subcommand; doc comments are the help text.
//! No logic lives here.

use crate::trace::import::Format;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// Record, replay, compare and simulate LLM inference traffic (vLLM, SGLang, OpenAI-compatible).
#[derive(Debug, Parser)]
#[command(name = "retrace", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once; boxing buys nothing
pub enum Command {
    /// Summarise a trace: rates, length distributions, prefix reuse, recorded latency.
    Inspect(InspectArgs),
    /// Convert a trace between formats (native, Mooncake JSONL), with optional filters.
    Convert(ConvertArgs),
    /// Run a simulated vLLM-compatible inference engine (no GPU): batching, prefix cache, faults.
    Mock(MockArgs),
    /// Record live traffic: a transparent proxy in front of an OpenAI-compatible server.
    Record(Box<RecordArgs>),
}

/// Summarise a trace.
///
/// Example: `retrace inspect traces/mooncake_conversation_1k.jsonl --cache-blocks 10000`
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// Trace file (native, Mooncake, Azure, BurstGPT, session JSON, vLLM custom JSONL).
    pub file: PathBuf,
    /// Print JSON (schema: docs/inspect-json.md) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also report the prefix hit rate with an LRU cache of this many blocks.
    #[arg(long, value_name = "N")]
    pub cache_blocks: Option<u64>,
    /// Force the input format instead of detecting it.
    #[arg(long, value_enum)]
    pub from: Option<Format>,
    /// Skip (and count) malformed rows instead of stopping at the first.
    #[arg(long)]
    pub skip_bad: bool,
}

/// Output formats `convert` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutFormat {
    /// retrace's native `*.trace.zst`.
    Native,
    /// Mooncake JSONL (ids compacted to 0..N-1; loads in vllm bench serve timed_trace, AIPerf, SGLang).
    Mooncake,
}

/// Convert a trace between formats.
///
/// Example: `retrace convert ../mooncake_trace.jsonl -o mooncake.trace.zst --window 0s..600s --speed 2`
#[derive(Debug, clap::Args)]
pub struct ConvertArgs {
    /// Input trace (any format `inspect` reads).
    pub input: PathBuf,
    /// Output file; `-` writes to stdout.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Input format (detected from content when absent).
    #[arg(long, value_enum)]
    pub from: Option<Format>,
    /// Output format (from the output name when absent: `.jsonl` → mooncake, else native).
    #[arg(long, value_enum)]
    pub to: Option<OutFormat>,
    /// Skip (and count) malformed rows instead of stopping at the first.
    #[arg(long)]
    pub skip_bad: bool,
    /// Keep arrivals in START..END of trace time (e.g. `60s..600s`, `..90s`); offsets restart at START.
    #[arg(long, value_name = "START..END")]
    pub window: Option<String>,
    /// Keep only the first N requests (after --window).
    #[arg(long, value_name = "N")]
    pub head: Option<usize>,
    /// Keep one request in K (after --head).
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub sample: usize,
    /// Bake in a speed factor: arrival offsets are divided by X (2 = twice as fast).
    #[arg(long, value_name = "X", default_value_t = 1.0)]
    pub speed: f64,
    /// Re-block hash ids to N tokens per id, a whole multiple of the trace's block size (e.g. a
    /// recording hashed at 16 exported as Mooncake's 512).
    #[arg(long, value_name = "N")]
    pub block_size: Option<u32>,
    /// zstd level for native output (1-22).
    #[arg(long, default_value_t = 19, value_parser = clap::value_parser!(i32).range(1..=22))]
    pub level: i32,
}

/// Run the simulated vLLM-compatible engine.
///
/// Example: `retrace mock --listen 127.0.0.1:8000 --model mock-llama --fixed-timing 50,10`
///
/// Serves /v1/completions, /v1/chat/completions, /v1/models, /tokenize, /health and /metrics in
/// vLLM 0.32's exact shapes. Without --fixed-timing, a continuous-batching scheduler times every
/// step with a cost model (defaults: a lone 137-token prompt gets ~70 ms TTFT and ~8 ms TPOT).
/// Per-request faults: header `x-mock-fault: status=503,stall-first=MS,stall-mid=N:MS,reset-after=N,slow-headers=MS`.
#[derive(Debug, clap::Args)]
pub struct MockArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: String,
    /// Served model name (requests naming another model get 404).
    #[arg(long, default_value = "mock-llama")]
    pub model: String,
    /// Exact timings whatever the load, bypassing the cost model: TTFT_MS,ITL_MS (e.g. 50,10).
    #[arg(long, value_name = "TTFT_MS,ITL_MS")]
    pub fixed_timing: Option<String>,
    /// Maximum number of sequences running in one batch.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Token budget of one scheduler step (decode tokens + prefill chunks).
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: u32,
    /// KV cache block size in tokens (prefix-cache granularity).
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
    /// KV cache capacity in tokens; unreferenced cached blocks are evicted LRU beyond it.
    #[arg(long, default_value_t = 1 << 20)]
    pub kv_cache_tokens: u64,
    /// Context length; a prompt of this many tokens or more gets HTTP 400.
    #[arg(long, default_value_t = 131072)]
    pub max_model_len: u32,
    /// Tokens carried by each SSE event after the first (as speculative decoding does).
    #[arg(long, default_value_t = 1, value_name = "K")]
    pub tokens_per_event: u32,
    /// Add vLLM's per-request `metrics` object (queue, TTFT, generation time, mean ITL, tokens/s).
    #[arg(long)]
    pub enable_per_request_metrics: bool,
    /// HF tokenizer.json for exact tokenization (default: the documented built-in scheme).
    #[arg(long, value_name = "tokenizer.json")]
    pub tokenizer: Option<PathBuf>,
    /// Seed for generated tokens, EOS positions and injected faults.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Per-token EOS probability after min_tokens when the request does not set ignore_eos.
    #[arg(long, default_value_t = 0.002)]
    pub eos_prob: f64,
    /// Cost model: fixed time of every scheduler step, ms.
    #[arg(long, default_value_t = 7.0)]
    pub step_overhead_ms: f64,
    /// Cost model: time per prefill token, ms.
    #[arg(long, default_value_t = 0.45)]
    pub prefill_token_ms: f64,
    /// Cost model: time per sequence in the step, ms.
    #[arg(long, default_value_t = 0.05)]
    pub seq_ms: f64,
    /// Cost model: time per context (KV) token attended in the step, ms.
    #[arg(long, default_value_t = 0.0068)]
    pub context_token_ms: f64,
    /// Fraction of requests answered with an error status (from --fault-status-codes).
    #[arg(long, default_value_t = 0.0)]
    pub fault_status_rate: f64,
    /// Statuses for --fault-status-rate, comma-separated.
    #[arg(long, default_value = "429,500,503", value_delimiter = ',')]
    pub fault_status_codes: Vec<u16>,
    /// Fraction of requests that stall --fault-stall-ms before their first token.
    #[arg(long, default_value_t = 0.0)]
    pub fault_stall_first_rate: f64,
    /// Fraction of requests that stall --fault-stall-ms after --fault-stall-after tokens.
    #[arg(long, default_value_t = 0.0)]
    pub fault_stall_mid_rate: f64,
    /// Length of an injected stall, ms.
    #[arg(long, default_value_t = 1000.0)]
    pub fault_stall_ms: f64,
    /// Tokens sent before a mid-stream stall.
    #[arg(long, default_value_t = 8)]
    pub fault_stall_after: u32,
    /// Fraction of requests whose connection is reset (TCP RST) after --fault-reset-after tokens.
    #[arg(long, default_value_t = 0.0)]
    pub fault_reset_rate: f64,
    /// Tokens sent before an injected reset.
    #[arg(long, default_value_t = 4)]
    pub fault_reset_after: u32,
    /// Fraction of requests whose response headers are delayed by --fault-slow-headers-ms.
    #[arg(long, default_value_t = 0.0)]
    pub fault_slow_headers_rate: f64,
    /// Delay of slow response headers, ms.
    #[arg(long, default_value_t = 1000.0)]
    pub fault_slow_headers_ms: f64,
    /// Emission clock: busy-wait this many microseconds before each deadline (more precision, more CPU).
    #[arg(long, default_value_t = 0)]
    pub spin_us: u64,
    /// Threads serving HTTP connections (the engine has its own thread besides).
    #[arg(long, default_value_t = 2)]
    pub io_threads: usize,
}

/// Put retrace inline in front of a server and record its traffic into native traces, without
/// changing a byte of it. Prompt and completion text are not stored unless `--bodies` says so;
/// credentials (Authorization, api-key, cookies) never reach a trace.
///
/// Example: `retrace record --listen 0.0.0.0:8000 --upstream http://127.0.0.1:8001 --out traces/`
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example:\n  retrace record --listen 0.0.0.0:8000 --upstream http://127.0.0.1:8001 --out traces/\n\nFiles: DIR/<name>-<start>-<seq>.trace.zst (written as .partial, renamed when closed).\nPrompt/completion text is not stored unless --bodies says so; credentials never are."
)]
pub struct RecordArgs {
    /// Address to accept clients on (HTTP/1.1 and HTTP/2; TLS with --tls-cert/--tls-key).
    #[arg(long, value_name = "ADDR")]
    pub listen: String,
    /// The server to forward to, e.g. `http://127.0.0.1:8001` or `https://llm.internal/prefix`.
    #[arg(long, value_name = "URL")]
    pub upstream: String,
    /// Directory for trace files `<name>-<start>-<seq>.trace.zst` (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// File name prefix of the trace files.
    #[arg(long, default_value = "retrace")]
    pub name: String,
    /// PEM certificate chain to terminate TLS (ALPN h2 and http/1.1); needs --tls-key.
    #[arg(long, value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate(s) to trust for an https upstream (default: the system bundle).
    #[arg(long, value_name = "PEM")]
    pub upstream_ca: Option<PathBuf>,
    /// Speak HTTP/2 to the upstream (h2c prior knowledge, or ALPN h2 over TLS).
    #[arg(long)]
    pub upstream_http2: bool,
    /// Limit for connecting to the upstream.
    #[arg(long, default_value = "10s", value_name = "DURATION")]
    pub connect_timeout: String,
    /// Limit from request arrival to the upstream's response headers (long: a queued
    /// non-streamed generation sends its headers at the end).
    #[arg(long, default_value = "15m", value_name = "DURATION")]
    pub headers_timeout: String,
    /// Longest silence between two response chunks before the response is cut.
    #[arg(long, default_value = "5m", value_name = "DURATION")]
    pub idle_timeout: String,
    /// Optional limit on a whole exchange (`none` by default: long generations are normal).
    #[arg(long, value_name = "DURATION")]
    pub total_timeout: Option<String>,
    /// On SIGINT/SIGTERM, how long in-flight streams may take to finish before the trace is closed.
    #[arg(long, default_value = "30s", value_name = "DURATION")]
    pub drain_timeout: String,
    /// Bodies to keep in the trace: none (default), request (prompts), full (prompts and outputs).
    #[arg(long, default_value = "none", value_name = "none|request|full")]
    pub bodies: String,
    /// File holding a secret key: block hashes become HMAC-SHA256, so a shared trace cannot be
    /// matched against guessed prompts.
    #[arg(long, value_name = "FILE")]
    pub hash_key_file: Option<PathBuf>,
    /// Hugging Face `tokenizer.json` for exact text-prompt blocks (token-id prompts are always
    /// exact; without it text is approximated as 4 bytes per token and the input length is taken
    /// from the server's usage).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Tokens per hash block (512 matches Mooncake traces).
    #[arg(long, default_value_t = 512)]
    pub block_size: u32,
    /// Records the writer may queue; beyond that records are dropped and counted, never traffic slowed.
    #[arg(long, default_value_t = 65536)]
    pub queue: usize,
    /// Captured body bytes the writer queue may hold (bounds memory when the disk is slow).
    #[arg(long, default_value = "512MiB", value_name = "SIZE")]
    pub queue_bytes: String,
    /// Bytes captured per request and per response body for recording (bodies are always
    /// forwarded whole).
    #[arg(long, default_value = "16MiB", value_name = "SIZE")]
    pub capture_max: String,
    /// Start a new trace file after this many compressed bytes.
    #[arg(long, default_value = "256MiB", value_name = "SIZE")]
    pub rotate_size: String,
    /// Start a new trace file after this long.
    #[arg(long, default_value = "1h", value_name = "DURATION")]
    pub rotate_interval: String,
    /// Admin endpoint (`/metrics`, `/healthz`); `none` turns it off.
    #[arg(long, default_value = "127.0.0.1:9464", value_name = "ADDR")]
    pub admin: String,
    /// Threads serving connections, each a single-threaded runtime (0: one per CPU).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub io_threads: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }
}
