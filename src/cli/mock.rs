//! `retrace mock`'s command line and its [`MockConfig`]. The flags' defaults are
//! [`MockConfig::default`]'s.

use crate::mock::{ApiKey, ConnTimeouts, CostModel, FaultConfig, MockConfig, Profile};
use anyhow::Context;
use std::path::PathBuf;

/// `--fault-status-codes`' default, comma-separated.
fn status_codes_text() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        let codes = FaultConfig::default().status_codes;
        codes
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// Run a simulated vLLM-compatible inference engine (no GPU): batching, prefix cache, faults.
///
/// Serves /v1/completions, /v1/chat/completions, /v1/models, /tokenize, /health and /metrics in
/// vLLM 0.32's shapes (and /detokenize, /reset_prefix_cache). Without --fixed-timing a
/// continuous-batching scheduler times each step with a cost model chosen by --profile:
/// `llama8b` (default; a lone 137-token prompt gets ~70 ms TTFT, ~8 ms TPOT; a 7k-token prompt
/// ~0.4 s) or `fast` (≈200k prefill tokens/s: Mooncake-size prompts at trace speed; replay's
/// embedded target). The cost-model flags override the profile. Faults by seeded rates
/// (--fault-*) or per request with the header `x-mock-fault` (e.g. `status=503`,
/// `stall-first=500`, `reset-after=3`). Details: docs/mock.md.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  # a vLLM-like server on 127.0.0.1:8000 that keeps up with the sample traces
  retrace mock --profile fast --enable-per-request-metrics
  # exact timing (TTFT 50 ms, a token every 10 ms); a key, as vLLM's --api-key
  retrace mock --listen 127.0.0.1:8001 --fixed-timing 50,10 --api-key sk-local")]
pub struct MockArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000", help_heading = "Server")]
    pub(crate) listen: String,
    /// Served model name (requests naming another model get 404).
    #[arg(long, default_value_t = MockConfig::default().model, help_heading = "Server")]
    pub(crate) model: String,
    /// Exact timings whatever the load, bypassing the cost model: TTFT_MS,ITL_MS (e.g. 50,10).
    #[arg(long, value_name = "TTFT_MS,ITL_MS", help_heading = "Engine")]
    pub(crate) fixed_timing: Option<String>,
    /// Maximum number of sequences running in one batch.
    #[arg(long, default_value_t = MockConfig::default().max_num_seqs, help_heading = "Engine", hide_short_help = true)]
    pub(crate) max_num_seqs: usize,
    /// Engine profile: cost model and step token budget. `llama8b` (default: the calibrated
    /// Llama-3.1-8B-like figures, ~70 ms TTFT / ~8 ms TPOT for a 137-token prompt) or `fast`
    /// (≈200k prefill tokens/s, 8,192-token steps; the embedded target of `retrace replay`).
    #[arg(long, default_value = Profile::DEFAULT.name, value_name = "NAME", help_heading = "Engine")]
    pub(crate) profile: String,
    /// Token budget of one scheduler step (decode tokens + prefill chunks) [default: from --profile].
    #[arg(long, help_heading = "Engine", hide_short_help = true)]
    pub(crate) max_num_batched_tokens: Option<u32>,
    /// KV cache block size in tokens (prefix-cache granularity).
    #[arg(long, default_value_t = MockConfig::default().block_size, help_heading = "Engine", hide_short_help = true)]
    pub(crate) block_size: u32,
    /// KV cache capacity in tokens; unreferenced cached blocks are evicted LRU beyond it.
    #[arg(long, default_value_t = MockConfig::default().kv_cache_tokens, help_heading = "Engine", hide_short_help = true)]
    pub(crate) kv_cache_tokens: u64,
    /// Context length; a prompt of this many tokens or more gets HTTP 400.
    #[arg(long, default_value_t = MockConfig::default().max_model_len, help_heading = "Server", hide_short_help = true)]
    pub(crate) max_model_len: u32,
    /// Tokens carried by each SSE event after the first (as speculative decoding does).
    #[arg(long, default_value_t = MockConfig::default().tokens_per_event, value_name = "K", help_heading = "Engine", hide_short_help = true)]
    pub(crate) tokens_per_event: u32,
    /// Add vLLM's per-request `metrics` object (queue, TTFT, generation time, mean ITL, tokens/s).
    #[arg(long, help_heading = "Server")]
    pub(crate) enable_per_request_metrics: bool,
    /// HF tokenizer.json for exact tokenization (default: the documented built-in scheme).
    #[arg(
        long,
        value_name = "tokenizer.json",
        help_heading = "Server",
        hide_short_help = true
    )]
    pub(crate) tokenizer: Option<PathBuf>,
    /// Answer 401 to every request under /v1 without `Authorization: Bearer KEY`, as vLLM's
    /// --api-key does (/health, /metrics, /tokenize and /detokenize stay open).
    #[arg(long, value_name = "KEY", help_heading = "Server")]
    pub(crate) api_key: Option<String>,
    /// Seed for generated tokens, EOS positions and injected faults.
    #[arg(long, default_value_t = MockConfig::default().seed, help_heading = "Engine", hide_short_help = true)]
    pub(crate) seed: u64,
    /// Per-token EOS probability after min_tokens when the request does not set ignore_eos.
    #[arg(long, default_value_t = MockConfig::default().eos_prob, help_heading = "Engine", hide_short_help = true)]
    pub(crate) eos_prob: f64,
    /// Cost model: front-end latency of every request before the engine queues it (HTTP,
    /// tokenization), ms; part of the client's TTFT, not of the engine's [default: from --profile].
    #[arg(long, help_heading = "Cost model", hide_short_help = true)]
    pub(crate) request_overhead_ms: Option<f64>,
    /// Cost model: fixed time of every scheduler step, ms [default: from --profile].
    #[arg(long, help_heading = "Cost model", hide_short_help = true)]
    pub(crate) step_overhead_ms: Option<f64>,
    /// Cost model: time per prefill token, ms [default: from --profile].
    #[arg(long, help_heading = "Cost model", hide_short_help = true)]
    pub(crate) prefill_token_ms: Option<f64>,
    /// Cost model: time per sequence in the step, ms [default: from --profile].
    #[arg(long, help_heading = "Cost model", hide_short_help = true)]
    pub(crate) seq_ms: Option<f64>,
    /// Cost model: time per context (KV) token attended in the step, ms [default: from --profile].
    #[arg(long, help_heading = "Cost model", hide_short_help = true)]
    pub(crate) context_token_ms: Option<f64>,
    /// Fraction of requests answered with an error status (from --fault-status-codes).
    #[arg(long, default_value_t = MockConfig::default().faults.status_rate, help_heading = "Faults", hide_short_help = true)]
    pub(crate) fault_status_rate: f64,
    /// Statuses for --fault-status-rate, comma-separated.
    #[arg(long, default_value = status_codes_text(), value_delimiter = ',', help_heading = "Faults", hide_short_help = true)]
    pub(crate) fault_status_codes: Vec<u16>,
    /// Fraction of requests that stall --fault-stall-ms before their first token.
    #[arg(long, default_value_t = MockConfig::default().faults.stall_first_rate, help_heading = "Faults", hide_short_help = true)]
    pub(crate) fault_stall_first_rate: f64,
    /// Fraction of requests that stall --fault-stall-ms after --fault-stall-after tokens.
    #[arg(long, default_value_t = MockConfig::default().faults.stall_mid_rate, help_heading = "Faults", hide_short_help = true)]
    pub(crate) fault_stall_mid_rate: f64,
    /// Length of an injected stall, ms.
    #[arg(long, default_value_t = MockConfig::default().faults.stall_ms, help_heading = "Faults", hide_short_help = true)]
    pub(crate) fault_stall_ms: f64,
    /// Tokens sent before a mid-stream stall.
    #[arg(long, default_value_t = MockConfig::default().faults.stall_after_tokens, help_heading = "Faults", hide_short_help = true)]
    pub(crate) fault_stall_after: u32,
    /// Fraction of requests whose connection is reset (TCP RST) after --fault-reset-after tokens.
    #[arg(long, default_value_t = MockConfig::default().faults.reset_rate, help_heading = "Faults", hide_short_help = true)]
    pub(crate) fault_reset_rate: f64,
    /// Tokens sent before an injected reset.
    #[arg(long, default_value_t = MockConfig::default().faults.reset_after_tokens, help_heading = "Faults", hide_short_help = true)]
    pub(crate) fault_reset_after: u32,
    /// Fraction of requests whose response headers are delayed by --fault-slow-headers-ms.
    #[arg(long, default_value_t = MockConfig::default().faults.slow_headers_rate, help_heading = "Faults", hide_short_help = true)]
    pub(crate) fault_slow_headers_rate: f64,
    /// Delay of slow response headers, ms.
    #[arg(long, default_value_t = MockConfig::default().faults.slow_headers_ms, help_heading = "Faults", hide_short_help = true)]
    pub(crate) fault_slow_headers_ms: f64,
    // Tuning knobs, hidden from --help (docs/tuning.md, `## mock`).
    /// Threads serving HTTP connections (the engine has its own thread besides).
    #[arg(long, default_value_t = MockConfig::default().io_threads, hide = true)]
    pub(crate) io_threads: usize,
    /// Run the engine, writer and HTTP threads under SCHED_FIFO (needs CAP_SYS_NICE).
    #[arg(long, hide = true)]
    pub(crate) realtime: bool,
    /// Emission clock: minimum gap between hand-overs, µs.
    #[arg(long, default_value_t = MockConfig::default().coalesce_us, hide = true)]
    pub(crate) coalesce_us: u64,
}

/// Parses `TTFT_MS,ITL_MS`.
fn parse_fixed(s: &str) -> anyhow::Result<(f64, f64)> {
    let (a, b) = s
        .split_once(',')
        .with_context(|| format!("--fixed-timing wants TTFT_MS,ITL_MS (e.g. 50,10), got `{s}`"))?;
    let p = |x: &str| {
        x.trim()
            .parse::<f64>()
            .with_context(|| format!("--fixed-timing: `{x}` is not a number of milliseconds"))
    };
    Ok((p(a)?, p(b)?))
}

impl MockArgs {
    /// The config the command line asks for: `--profile`, then any cost-model flag given
    /// overrides it; validated.
    pub fn config(&self) -> anyhow::Result<MockConfig> {
        let a = self;
        let profile = Profile::by_name(&a.profile)?;
        let p = profile.cost;
        if a.api_key.as_deref() == Some("") {
            anyhow::bail!("--api-key: the key is empty");
        }
        let cfg = MockConfig {
            model: a.model.clone(),
            fixed_timing: a.fixed_timing.as_deref().map(parse_fixed).transpose()?,
            seed: a.seed,
            max_num_seqs: a.max_num_seqs,
            max_num_batched_tokens: a
                .max_num_batched_tokens
                .unwrap_or(profile.max_num_batched_tokens),
            block_size: a.block_size,
            kv_cache_tokens: a.kv_cache_tokens,
            max_model_len: a.max_model_len,
            tokens_per_event: a.tokens_per_event,
            enable_per_request_metrics: a.enable_per_request_metrics,
            tokenizer: a.tokenizer.clone(),
            cost: CostModel {
                request_overhead_ms: a.request_overhead_ms.unwrap_or(p.request_overhead_ms),
                step_overhead_ms: a.step_overhead_ms.unwrap_or(p.step_overhead_ms),
                prefill_token_ms: a.prefill_token_ms.unwrap_or(p.prefill_token_ms),
                seq_ms: a.seq_ms.unwrap_or(p.seq_ms),
                context_token_ms: a.context_token_ms.unwrap_or(p.context_token_ms),
            },
            eos_prob: a.eos_prob,
            io_threads: a.io_threads,
            realtime: a.realtime,
            coalesce_us: a.coalesce_us,
            embedding_dim: MockConfig::default().embedding_dim,
            timeouts: ConnTimeouts::default(),
            api_key: a.api_key.as_deref().and_then(ApiKey::new),
            faults: FaultConfig {
                status_rate: a.fault_status_rate,
                status_codes: a.fault_status_codes.clone(),
                stall_first_rate: a.fault_stall_first_rate,
                stall_mid_rate: a.fault_stall_mid_rate,
                stall_ms: a.fault_stall_ms,
                stall_after_tokens: a.fault_stall_after,
                reset_rate: a.fault_reset_rate,
                reset_after_tokens: a.fault_reset_after,
                slow_headers_rate: a.fault_slow_headers_rate,
                slow_headers_ms: a.fault_slow_headers_ms,
            },
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_flags_give_the_default_config() {
        let cli = <crate::cli::Cli as clap::Parser>::parse_from(["retrace", "mock"]);
        let crate::cli::Command::Mock(a) = cli.command else {
            unreachable!("mock")
        };
        let (parsed, default) = (a.config().unwrap(), MockConfig::default());
        assert_eq!(format!("{parsed:?}"), format!("{default:?}"));
    }
}
