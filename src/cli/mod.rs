//! Command-line interface: one clap `Args` struct per subcommand (doc comments are the help
//! text), the value parsers ([`values`]), and each `Args`' conversion to the options its engine
//! runs with. The engines know nothing of clap.

mod convert;
mod inspect;
mod mock;
mod record;
mod report;
mod synth;
pub mod values;

pub use convert::ConvertArgs;
pub use inspect::InspectArgs;
pub use mock::MockArgs;
pub use record::RecordArgs;
pub use report::{CompareArgs, MergeArgs, ReportArgs};
pub use synth::SynthArgs;

use crate::metrics::Api;
use crate::replay::http::request::PromptMode;
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
    /// Replay a trace against an OpenAI-compatible server (the embedded mock by default) at its
    /// own timing, with vLLM-exact latency metrics.
    Replay(ReplayArgs),
    /// Convert a trace between formats (native, Mooncake JSONL), with optional filters.
    Convert(ConvertArgs),
    /// Write a what-if trace from a recording: AIPerf's transforms (speedup, prefix and prompt
    /// length multipliers, prefix roots, max ISL/OSL) or, with --fit, a fitted model sampled anew.
    Synth(SynthArgs),
    /// Compare two runs (retrace results, vllm bench serve results, AIPerf exports, or traces): per-metric change
    /// with significance, paired per-request TTFT, workload, and `--fail-on` gating for CI.
    Compare(CompareArgs),
    /// Write one self-contained HTML report of a run (timeline, CDFs, throughput, breakdown).
    Report(ReportArgs),
    /// Merge replay result files (e.g. the shards of `replay --shard I/N`) into one result.
    ///
    /// Example: `retrace merge shard-0.json shard-1.json shard-2.json -o all.json`
    ///
    /// Histograms are added (lossless), counts and tokens summed, `duration` is the longest
    /// input's (shards run concurrently), per-request arrays concatenated. Statistics are
    /// recomputed from the per-request data when every input was `--detailed` (then they equal one
    /// process's), else from the merged histograms (`merged_from_histograms: true`). Inputs must
    /// share trace, seed, speed, endpoint, model and prompt mode. Details: docs/scale-out.md.
    /// AIPerf per-request exports (`profile_export.jsonl`) merge into one such export: every
    /// record, ordered by send time (docs/compare.md).
    Merge(MergeArgs),
    /// Run a simulated vLLM-compatible inference engine (no GPU): batching, prefix cache, faults.
    ///
    /// Example: `retrace mock --listen 127.0.0.1:8000 --model mock-llama --fixed-timing 50,10`
    ///
    /// Serves /v1/completions, /v1/chat/completions, /v1/models, /tokenize, /health and /metrics
    /// in vLLM 0.32's shapes. Without --fixed-timing a continuous-batching scheduler times each
    /// step with a cost model chosen by --profile: `llama8b` (default; a lone 137-token prompt
    /// gets ~70 ms TTFT, ~8 ms TPOT; a 7k-token prompt ~0.4 s) or `fast`
    /// (≈200k prefill tokens/s: Mooncake-size prompts at trace speed; replay's embedded target),
    /// e.g. `retrace mock --profile fast`. The --request-overhead-ms, --step-overhead-ms,
    /// --prefill-token-ms, --seq-ms,
    /// --context-token-ms and --max-num-batched-tokens flags override the profile. Faults by
    /// seeded rates (--fault-*) or per request with the header `x-mock-fault` (e.g.
    /// `status=503`, `stall-first=500`, `reset-after=3`). Details: docs/mock.md.
    Mock(MockArgs),
    /// Record live traffic: a transparent proxy in front of an OpenAI-compatible server.
    Record(Box<RecordArgs>),
}

/// Example: `retrace replay traces/mooncake_conversation_1k.jsonl --speed 4 --result-json out.json`
///
/// Without `--target` the embedded simulated engine is started on a loopback port. Exit status:
/// 0 done, 2 error, 3 run invalid (`--max-drift-ms` exceeded, or more than 10% of the workload
/// left out), 5 every request failed, 6 nothing to send (every request left out), 130 / 143
/// interrupted by SIGINT / SIGTERM (the result, marked invalid, holds what was measured; a
/// second signal exits at once).
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// Trace file (any format `retrace inspect` reads); several recordings (a rotated set, or
    /// several proxies) are merged by wall clock.
    #[arg(required = true, num_args = 1..)]
    pub trace: Vec<PathBuf>,
    /// Server base URL, `http://` or `https://`, e.g. `http://127.0.0.1:8000` (default: the
    /// embedded mock).
    #[arg(long, value_name = "URL")]
    pub target: Option<String>,
    /// CA (PEM) of an `https://` target (default: the system bundle).
    ///
    /// Verification is never turned off.
    #[arg(long, value_name = "FILE")]
    pub target_ca: Option<PathBuf>,
    /// Model name to send (default: the first model the target lists at /v1/models).
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// API to call with synthesised prompts (default: each request's recorded endpoint;
    /// completions for traces that do not say, such as Mooncake).
    #[arg(long, value_enum)]
    pub endpoint: Option<Api>,
    /// Time compression: 2 replays twice as fast (default 1).
    #[arg(long, value_name = "X")]
    pub speed: Option<f64>,
    /// Replay only the first N requests (default: all).
    ///
    /// With --shard, the shards split the trace's first N. With the embedded mock and neither
    /// --limit nor --speed, the first 45 s of the trace.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Cap on requests in flight; waiting time is reported as client queue time.
    #[arg(long, value_name = "C")]
    pub max_concurrency: Option<usize>,
    /// Tokens per hash id (default: the trace's, 512 for Mooncake).
    #[arg(long, value_name = "N")]
    pub block_size: Option<u32>,
    /// Hugging Face tokenizer.json of the target model (vocabulary, special tokens, text mode).
    #[arg(long, value_name = "FILE", conflicts_with = "vocab_size")]
    pub tokenizer: Option<PathBuf>,
    /// Vocabulary size without a tokenizer (default 4096).
    ///
    /// Ids below 16 are never used.
    #[arg(long, value_name = "N")]
    pub vocab_size: Option<u32>,
    /// How prompts are sent.
    #[arg(long, value_enum, default_value_t = PromptMode::TokenIds)]
    pub prompt_mode: PromptMode,
    /// Seed of prompt synthesis (same seed, same prompts, in any process).
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// Write the result (vLLM keys + ours + histograms) to this JSON file.
    #[arg(long, value_name = "FILE")]
    pub result_json: Option<PathBuf>,
    /// Add per-request arrays to the result file.
    #[arg(long)]
    pub detailed: bool,
    /// Also write the run's self-contained HTML report (`retrace report`).
    ///
    /// With --detailed it has the per-request timeline and time series.
    #[arg(long, value_name = "FILE")]
    pub report_html: Option<PathBuf>,
    /// Extra request header `K=V` (repeatable).
    #[arg(long, value_name = "K=V")]
    pub header: Vec<String>,
    /// Environment variable holding the API key (sent as `Authorization: Bearer`; never printed).
    #[arg(long, value_name = "VAR")]
    pub api_key_env: Option<String>,
    /// JSON object merged into every request body (its keys win).
    #[arg(long, value_name = "JSON")]
    pub extra_body: Option<String>,
    /// Mark the run invalid (exit 3) when p99 send drift exceeds D ms.
    ///
    /// Send drift is actual send − intended time, less any --max-concurrency slot wait.
    #[arg(long, value_name = "D")]
    pub max_drift_ms: Option<f64>,
    /// Service-level objectives for goodput, as vLLM: `ttft:MS tpot:MS e2el:MS` (any subset).
    #[arg(long, value_name = "METRIC:MS", num_args = 1..)]
    pub goodput: Vec<String>,
    /// Percentiles to report, comma-separated.
    #[arg(long, value_name = "LIST", default_value = "99")]
    pub percentiles: String,
    /// Replay recorded bodies with their own max_tokens/ignore_eos.
    #[arg(long)]
    pub keep_original_limits: bool,
    /// Also re-issue a recording's side requests (`/tokenize`, `GET /v1/models`, `/metrics`,
    /// ...) verbatim; by default they are left out of the workload and counted.
    #[arg(long)]
    pub include_aux: bool,
    /// Leave out requests that failed in the recording (by default they are sent as recorded,
    /// so they fail again the same way).
    #[arg(long)]
    pub skip_recorded_failures: bool,
    /// Skip (and count) malformed rows of the trace instead of stopping at the first.
    ///
    /// They count as workload left out (more than 10% makes the run invalid).
    #[arg(long)]
    pub skip_bad: bool,
    /// Total time limit per request, seconds.
    #[arg(long, value_name = "S", default_value_t = 3600.0)]
    pub timeout_s: f64,
    /// Limit on silence (no headers, no body bytes) per request, seconds.
    #[arg(long, value_name = "S", default_value_t = 300.0)]
    pub idle_timeout_s: f64,
    // Tuning knobs: hidden from --help, documented in docs/tuning.md.
    /// Keep-alive connections to open before the clock starts (default: --max-concurrency, else
    /// 128; never more than the number of requests; 0 = none).
    #[arg(long, value_name = "N", hide = true)]
    pub warm_connections: Option<usize>,
    /// When a response's bytes count as received (plain `http://` targets): `kernel` (the
    /// kernel's receive timestamp of each socket read) or `read` (when the replayer read them).
    #[arg(
        long,
        default_value = "kernel",
        value_name = "kernel|read",
        hide = true
    )]
    pub rx_stamp: String,
    /// Threads that read streamed plain `http://` response bodies (`auto`: one per CPU, at most
    /// 4; `0`: every body is read by its request's task).
    #[arg(long, default_value = "auto", value_name = "N|auto", hide = true)]
    pub reader_threads: String,
    /// With reader threads and `--rx-stamp kernel`: how long a reader thread waits after a wake-up
    /// before it looks again, so one wake-up reads many streams.
    #[arg(long, default_value_t = 500, value_name = "US", hide = true)]
    pub read_batch_us: u64,
    /// Replay only arrivals in START..END of trace time (e.g. `600s..1200s`, `..90s`).
    #[arg(long, value_name = "START..END", help_heading = "Workload shaping")]
    pub window: Option<String>,
    /// Repeat the trace K times back to back (hash ids kept: later loops hit the cache).
    #[arg(long = "loop", value_name = "K", help_heading = "Workload shaping")]
    pub loop_count: Option<u32>,
    /// Overlay K copies of the trace, each shifted by 1/K of its span: K times the load, same
    /// burst shape.
    #[arg(long, value_name = "K", help_heading = "Workload shaping")]
    pub overlay: Option<u32>,
    /// Give each overlaid copy its own hash ids (no prefix sharing between copies).
    #[arg(long, help_heading = "Workload shaping")]
    pub overlay_distinct: bool,
    /// Cap idle gaps between arrivals at D (e.g. `5s`).
    #[arg(long, value_name = "D", help_heading = "Workload shaping")]
    pub max_gap: Option<String>,
    /// Replace the trace's timing by gamma gaps at R requests/s (`inf`: all at once).
    ///
    /// As `vllm bench serve --request-rate` does.
    #[arg(long, value_name = "R", help_heading = "Workload shaping")]
    pub request_rate: Option<f64>,
    /// Gamma shape of the gaps: 1 = Poisson, < 1 burstier, > 1 more regular.
    #[arg(
        long,
        value_name = "B",
        default_value_t = 1.0,
        help_heading = "Workload shaping"
    )]
    pub burstiness: f64,
    /// Ramp the request rate from --ramp-up-start-rps to --ramp-up-end-rps over the run.
    #[arg(
        long,
        value_name = "linear|exponential",
        help_heading = "Workload shaping"
    )]
    pub ramp_up: Option<String>,
    /// Request rate at the start of --ramp-up.
    #[arg(long, value_name = "R", help_heading = "Workload shaping")]
    pub ramp_up_start_rps: Option<f64>,
    /// Request rate at the end of --ramp-up.
    #[arg(long, value_name = "R", help_heading = "Workload shaping")]
    pub ramp_up_end_rps: Option<f64>,
    /// Replay shard I of N (0-based): a deterministic 1/N of the requests.
    ///
    /// Sessions are kept whole, arrival times as in the whole trace.
    #[arg(long, value_name = "I/N", help_heading = "Workload shaping")]
    pub shard: Option<String>,
    /// Print the planned schedule's summary (requests, duration, rates, tokens) and exit.
    #[arg(long)]
    pub dry_run: bool,
    /// Send a turn only when its session's previous turn finished, plus its think time.
    ///
    /// Session-ordered replay of a multi-turn trace: a turn waits for the previous turn of its
    /// session (failed or not) plus its think time (/ --speed); first turns keep their planned
    /// times. Reports how far turns drifted from their recorded arrivals.
    #[arg(long, help_heading = "Workload shaping")]
    pub sessions: bool,
    /// Read the server's Prometheus metrics during the run (default URL: the target's /metrics).
    ///
    /// Before, every second during, and after the run: achieved prefix-cache hit rate beside the
    /// trace's theoretical one, running/waiting requests and KV-cache usage over time (console +
    /// result file). Another URL with `--scrape-metrics=http://host:port/metrics`.
    #[arg(long, value_name = "URL", num_args = 0..=1, require_equals = true, help_heading = "Server metrics")]
    pub scrape_metrics: Option<Option<String>>,
    /// The server's KV-cache block size in tokens (vLLM `--block-size`).
    ///
    /// For the theoretical prefix-cache hit count that --scrape-metrics reports, when the
    /// server does not publish its own (vLLM's `vllm:cache_config_info` does).
    #[arg(
        long,
        value_name = "TOKENS",
        default_value_t = 16,
        help_heading = "Server metrics"
    )]
    pub server_block_size: u32,
    /// Also send small probe requests at R per second, reported separately.
    ///
    /// Probes (8-token fresh prompt, 1 output token) go beside the workload, outside
    /// --max-concurrency; their TTFT and E2E latency show how much the workload slows unrelated
    /// traffic, never mixed into the metrics.
    #[arg(long, value_name = "R", help_heading = "Workload shaping")]
    pub probe_request_rate: Option<f64>,
    /// Start the clock (t0) at this wall-clock time: Unix seconds or RFC 3339.
    ///
    /// E.g. `2026-11-29T22:00:00Z`. Shards started separately then replay one timeline together
    /// (machine clocks synced by NTP). Bodies and connections are prepared before it; a time more
    /// than 5 s in the past is refused.
    #[arg(long, value_name = "TIME", help_heading = "Workload shaping")]
    pub start_at: Option<String>,
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
