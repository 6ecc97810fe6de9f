//! `retrace replay`'s command line and its conversion to a [`Config`]: one small parser per flag
//! group; every error names its flag.

use super::values;
use crate::metrics::{self, Api};
use crate::replay::http::request::PromptMode;
use crate::replay::http::target::{Target, Timeouts};
use crate::replay::plan::{shaping, start};
use crate::replay::shadow::ShadowTarget;
use crate::replay::{Config, Tuning, DEFAULT_VOCAB};
use crate::result::MAX_SHADOWS;
use anyhow::{anyhow, bail};
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// The end of `replay --help` (and of `-h`).
const EXAMPLES: &str = "\
Examples:
  # 40 requests at 4x the trace's speed, against the embedded simulated engine
  retrace replay traces/mooncake_conversation_1k.jsonl --limit 40 --speed 4 \\
    --result-json base.json
  # a server of your own (its key in OPENAI_API_KEY) at 8 requests/s, per request
  retrace replay traces/mooncake_conversation_1k.jsonl \\
    --target http://127.0.0.1:8000 --request-rate 8 --limit 40 \\
    --result-json cand.json --detailed";

/// `--timeout-s`' default.
const TIMEOUT_S: f64 = 3600.0;
/// `--idle-timeout-s`' default.
const IDLE_TIMEOUT_S: f64 = 300.0;
/// `--server-block-size`'s default (vLLM's `--block-size`).
const SERVER_BLOCK_SIZE: u32 = 16;
/// `--read-batch-us`' default.
const READ_BATCH_US: u64 = 500;

/// Replay a trace against an OpenAI-compatible server (the embedded mock by default) at its
/// own timing, with vLLM-exact latency metrics.
///
/// Without `--target` the embedded simulated engine is started on a loopback port. Exit status:
/// 0 done, 2 error, 3 run invalid (`--max-drift-ms` exceeded, or more than 10% of the workload
/// left out), 5 every request failed, 6 nothing to send (every request left out), 130 / 143
/// interrupted by SIGINT / SIGTERM (the result, marked invalid, holds what was measured; a
/// second signal exits at once).
#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct ReplayArgs {
    /// Trace file (any format `retrace inspect` reads); several recordings (a rotated set, or
    /// several proxies) are merged by wall clock.
    #[arg(required = true, num_args = 1..)]
    pub(crate) trace: Vec<PathBuf>,
    #[command(flatten)]
    pub(crate) target: TargetArgs,
    /// Also send every planned request to this server, due at the same instant as to --target
    /// (repeatable, at most 4). Each shadow's result goes beside --result-json as
    /// NAME.shadow-K.json, with per-request rows for `retrace compare` to pair; docs/shadow.md.
    #[arg(long, value_name = "URL", help_heading = "Target")]
    pub(crate) shadow: Vec<String>,
    /// A server running the target's own build, sent every request as the shadows are: its
    /// changes against the target are the noise band `retrace compare --shadow` judges the
    /// shadows by. Its result goes beside --result-json as NAME.control.json (needs --shadow).
    #[arg(
        long,
        value_name = "URL",
        help_heading = "Target",
        hide_short_help = true
    )]
    pub(crate) shadow_control: Option<String>,
    /// The `model` the shadows are sent (default: --model, else each shadow's first listed).
    #[arg(
        long,
        value_name = "NAME",
        help_heading = "Target",
        hide_short_help = true
    )]
    pub(crate) shadow_model: Option<String>,
    /// The environment variable holding the shadows' API key (the target's key and --header
    /// values are never sent to a shadow).
    #[arg(
        long,
        value_name = "VAR",
        help_heading = "Target",
        hide_short_help = true
    )]
    pub(crate) shadow_api_key_env: Option<String>,
    /// Time compression: 2 replays twice as fast (default 1).
    #[arg(long, value_name = "X", help_heading = "Workload shaping")]
    pub(crate) speed: Option<f64>,
    /// Replay only the first N requests (default: all).
    ///
    /// With --shard, the shards split the trace's first N. With the embedded mock and neither
    /// --limit nor --speed, the first 45 s of the trace.
    #[arg(long, value_name = "N", help_heading = "Workload shaping")]
    pub(crate) limit: Option<usize>,
    /// Cap on requests in flight; waiting time is reported as client queue time.
    #[arg(long, value_name = "C", help_heading = "Workload shaping")]
    pub(crate) max_concurrency: Option<usize>,
    #[command(flatten)]
    pub(crate) prompts: PromptArgs,
    /// Write the result (vLLM keys + ours + histograms) to this JSON file.
    #[arg(long, value_name = "FILE", help_heading = "Results")]
    pub(crate) result_json: Option<PathBuf>,
    /// Add per-request arrays to the result file.
    #[arg(long, help_heading = "Results")]
    pub(crate) detailed: bool,
    /// Also write the run's self-contained HTML report (`retrace report`).
    ///
    /// With --detailed it has the per-request timeline and time series.
    #[arg(
        long,
        value_name = "FILE",
        help_heading = "Results",
        hide_short_help = true
    )]
    pub(crate) report_html: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) requests: RequestArgs,
    /// Mark the run invalid (exit 3) when p99 send drift exceeds D ms.
    ///
    /// Send drift is actual send − intended time, less any --max-concurrency slot wait.
    #[arg(
        long,
        value_name = "D",
        help_heading = "Results",
        hide_short_help = true
    )]
    pub(crate) max_drift_ms: Option<f64>,
    /// Service-level objectives for goodput, as vLLM: `ttft:MS tpot:MS e2el:MS` (any subset).
    #[arg(long, value_name = "METRIC:MS", num_args = 1.., help_heading = "Results", hide_short_help = true)]
    pub(crate) goodput: Vec<String>,
    /// Percentiles to report, comma-separated.
    #[arg(
        long,
        value_name = "LIST",
        default_value = "99",
        help_heading = "Results",
        hide_short_help = true
    )]
    pub(crate) percentiles: String,
    /// Replay recorded bodies with their own max_tokens/ignore_eos.
    #[arg(long, help_heading = "Trace", hide_short_help = true)]
    pub(crate) keep_original_limits: bool,
    /// Also re-issue a recording's side requests (`/tokenize`, `GET /v1/models`, `/metrics`,
    /// ...) verbatim; by default they are left out of the workload and counted.
    #[arg(long, help_heading = "Trace", hide_short_help = true)]
    pub(crate) include_aux: bool,
    /// Leave out requests that failed in the recording (by default they are sent as recorded,
    /// so they fail again the same way).
    #[arg(long, help_heading = "Trace", hide_short_help = true)]
    pub(crate) skip_recorded_failures: bool,
    /// Skip (and count) malformed rows of the trace instead of stopping at the first.
    ///
    /// They count as workload left out (more than 10% makes the run invalid).
    #[arg(long, help_heading = "Trace", hide_short_help = true)]
    pub(crate) skip_bad: bool,
    /// Total time limit per request, seconds.
    #[arg(long, value_name = "S", default_value_t = TIMEOUT_S, help_heading = "Target", hide_short_help = true)]
    pub(crate) timeout_s: f64,
    /// Limit on silence (no headers, no body bytes) per request, seconds.
    #[arg(long, value_name = "S", default_value_t = IDLE_TIMEOUT_S, help_heading = "Target", hide_short_help = true)]
    pub(crate) idle_timeout_s: f64,
    // Tuning knobs: hidden from --help, documented in docs/tuning.md.
    /// Keep-alive connections to open before the clock starts (default: --max-concurrency, else
    /// 128; never more than the number of requests; 0 = none).
    #[arg(long, value_name = "N", hide = true)]
    pub(crate) warm_connections: Option<usize>,
    /// When a response's bytes count as received (plain `http://` targets): `kernel` (the
    /// kernel's receive timestamp of each socket read) or `read` (when the replayer read them).
    #[arg(
        long,
        default_value = "kernel",
        value_name = "kernel|read",
        hide = true
    )]
    pub(crate) rx_stamp: String,
    /// Threads that read streamed plain `http://` response bodies (`auto`: one per CPU, at most
    /// 4; `0`: every body is read by its request's task).
    #[arg(long, default_value = "auto", value_name = "N|auto", hide = true)]
    pub(crate) reader_threads: String,
    /// With reader threads and `--rx-stamp kernel`: how long a reader thread waits after a wake-up
    /// before it looks again, so one wake-up reads many streams.
    #[arg(long, default_value_t = READ_BATCH_US, value_name = "US", hide = true)]
    pub(crate) read_batch_us: u64,
    /// Replay only arrivals in START..END of trace time (e.g. `600s..1200s`, `..90s`).
    #[arg(long, value_name = "START..END", help_heading = "Workload shaping")]
    pub(crate) window: Option<String>,
    /// Repeat the trace K times back to back (hash ids kept: later loops hit the cache).
    #[arg(
        long = "loop",
        value_name = "K",
        help_heading = "Workload shaping",
        hide_short_help = true
    )]
    pub(crate) loop_count: Option<u32>,
    /// Overlay K copies of the trace, each shifted by 1/K of its span: K times the load, same
    /// burst shape.
    #[arg(
        long,
        value_name = "K",
        help_heading = "Workload shaping",
        hide_short_help = true
    )]
    pub(crate) overlay: Option<u32>,
    /// Give each overlaid copy its own hash ids (no prefix sharing between copies).
    #[arg(long, help_heading = "Workload shaping", hide_short_help = true)]
    pub(crate) overlay_distinct: bool,
    /// Cap idle gaps between arrivals at D (e.g. `5s`).
    #[arg(
        long,
        value_name = "D",
        help_heading = "Workload shaping",
        hide_short_help = true
    )]
    pub(crate) max_gap: Option<String>,
    /// Replace the trace's timing by gamma gaps at R requests/s (`inf`: all at once).
    ///
    /// As `vllm bench serve --request-rate` does.
    #[arg(long, value_name = "R", help_heading = "Workload shaping")]
    pub(crate) request_rate: Option<f64>,
    /// Gamma shape of the gaps: 1 = Poisson, < 1 burstier, > 1 more regular.
    #[arg(
        long,
        value_name = "B",
        default_value_t = 1.0,
        help_heading = "Workload shaping",
        hide_short_help = true
    )]
    pub(crate) burstiness: f64,
    /// Ramp the request rate from --ramp-up-start-rps to --ramp-up-end-rps over the run.
    #[arg(
        long,
        value_name = "linear|exponential",
        help_heading = "Workload shaping",
        hide_short_help = true
    )]
    pub(crate) ramp_up: Option<String>,
    /// Request rate at the start of --ramp-up.
    #[arg(
        long,
        value_name = "R",
        help_heading = "Workload shaping",
        hide_short_help = true
    )]
    pub(crate) ramp_up_start_rps: Option<f64>,
    /// Request rate at the end of --ramp-up.
    #[arg(
        long,
        value_name = "R",
        help_heading = "Workload shaping",
        hide_short_help = true
    )]
    pub(crate) ramp_up_end_rps: Option<f64>,
    /// Replay shard I of N (0-based): a deterministic 1/N of the requests.
    ///
    /// Sessions are kept whole, arrival times as in the whole trace.
    #[arg(
        long,
        value_name = "I/N",
        help_heading = "Workload shaping",
        hide_short_help = true
    )]
    pub(crate) shard: Option<String>,
    /// Print the planned schedule's summary (requests, duration, rates, tokens) and exit.
    #[arg(long, help_heading = "Workload shaping")]
    pub(crate) dry_run: bool,
    /// Send a turn only when its session's previous turn finished, plus its think time.
    ///
    /// Session-ordered replay of a multi-turn trace: a turn waits for the previous turn of its
    /// session (failed or not) plus its think time (/ --speed); first turns keep their planned
    /// times. Reports how far turns drifted from their recorded arrivals.
    #[arg(long, help_heading = "Workload shaping", hide_short_help = true)]
    pub(crate) sessions: bool,
    /// Read the server's Prometheus metrics during the run (default URL: the target's /metrics).
    ///
    /// Before, every second during, and after the run: achieved prefix-cache hit rate beside the
    /// trace's theoretical one, running/waiting requests and KV-cache usage over time (console +
    /// result file). Another URL with `--scrape-metrics=http://host:port/metrics`.
    #[arg(long, value_name = "URL", num_args = 0..=1, require_equals = true, help_heading = "Server metrics", hide_short_help = true)]
    pub(crate) scrape_metrics: Option<Option<String>>,
    /// The server's KV-cache block size in tokens (vLLM `--block-size`).
    ///
    /// For the theoretical prefix-cache hit count that --scrape-metrics reports, when the
    /// server does not publish its own (vLLM's `vllm:cache_config_info` does).
    #[arg(
        long,
        value_name = "TOKENS",
        default_value_t = SERVER_BLOCK_SIZE, help_heading = "Server metrics", hide_short_help = true)]
    pub(crate) server_block_size: u32,
    /// Also send small probe requests at R per second, reported separately.
    ///
    /// Probes (8-token fresh prompt, 1 output token) go beside the workload, outside
    /// --max-concurrency; their TTFT and E2E latency show how much the workload slows unrelated
    /// traffic, never mixed into the metrics.
    #[arg(
        long,
        value_name = "R",
        help_heading = "Workload shaping",
        hide_short_help = true
    )]
    pub(crate) probe_request_rate: Option<f64>,
    /// Start the clock (t0) at this wall-clock time: Unix seconds or RFC 3339.
    ///
    /// E.g. `2026-11-29T22:00:00Z`. Shards started separately then replay one timeline together
    /// (machine clocks synced by NTP). Bodies and connections are prepared before it; a time more
    /// than 5 s in the past is refused.
    #[arg(
        long,
        value_name = "TIME",
        help_heading = "Workload shaping",
        hide_short_help = true
    )]
    pub(crate) start_at: Option<String>,
}

/// The target: where the requests go, and as what model and API (replay's and capacity's).
#[derive(Debug, clap::Args)]
pub struct TargetArgs {
    /// Server base URL, `http://` or `https://`, e.g. `http://127.0.0.1:8000` (default: the
    /// embedded mock).
    #[arg(long, value_name = "URL", help_heading = "Target")]
    pub(crate) target: Option<String>,
    /// CA (PEM) of an `https://` target (default: the system bundle).
    ///
    /// Verification is never turned off.
    #[arg(
        long,
        value_name = "FILE",
        help_heading = "Target",
        hide_short_help = true
    )]
    pub(crate) target_ca: Option<PathBuf>,
    /// Model name to send (default: the first model the target lists at /v1/models).
    #[arg(long, value_name = "NAME", help_heading = "Target")]
    pub(crate) model: Option<String>,
    /// API to call with synthesised prompts (default: each request's recorded endpoint;
    /// completions for traces that do not say, such as Mooncake).
    #[arg(long, value_enum, help_heading = "Target", hide_short_help = true)]
    pub(crate) endpoint: Option<Api>,
}

/// How prompts are made (replay's and capacity's).
#[derive(Debug, clap::Args)]
pub struct PromptArgs {
    /// Tokens per hash id (default: the trace's, 512 for Mooncake).
    #[arg(
        long,
        value_name = "N",
        help_heading = "Prompts",
        hide_short_help = true
    )]
    pub(crate) block_size: Option<u32>,
    /// Hugging Face tokenizer.json of the target model (vocabulary, special tokens, text mode).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "vocab_size",
        help_heading = "Prompts",
        hide_short_help = true
    )]
    pub(crate) tokenizer: Option<PathBuf>,
    /// Vocabulary size without a tokenizer (default 4096).
    ///
    /// Ids below 16 are never used.
    #[arg(
        long,
        value_name = "N",
        help_heading = "Prompts",
        hide_short_help = true
    )]
    pub(crate) vocab_size: Option<u32>,
    /// How prompts are sent.
    #[arg(long, value_enum, default_value_t = PromptMode::TokenIds, help_heading = "Prompts", hide_short_help = true)]
    pub(crate) prompt_mode: PromptMode,
    /// Seed of prompt synthesis (same seed, same prompts, in any process).
    #[arg(
        long,
        value_name = "S",
        default_value_t = 0,
        help_heading = "Prompts",
        hide_short_help = true
    )]
    pub(crate) seed: u64,
}

/// What every request carries besides its prompt (replay's and capacity's).
#[derive(Debug, clap::Args)]
pub struct RequestArgs {
    /// Extra request header `K=V` (repeatable).
    #[arg(
        long,
        value_name = "K=V",
        help_heading = "Target",
        hide_short_help = true
    )]
    pub(crate) header: Vec<String>,
    /// Environment variable holding the API key, sent as `Authorization: Bearer` (default:
    /// `OPENAI_API_KEY` when it is set, as the openai SDK reads it). The key is never printed
    /// or stored.
    #[arg(long, value_name = "VAR", help_heading = "Target")]
    pub(crate) api_key_env: Option<String>,
    /// JSON object merged into every request body (its keys win).
    #[arg(
        long,
        value_name = "JSON",
        help_heading = "Target",
        hide_short_help = true
    )]
    pub(crate) extra_body: Option<String>,
}

impl ReplayArgs {
    /// The config the command line asks for, validated; every error names the flag.
    pub fn config(self) -> anyhow::Result<Config> {
        let a = self;
        if let Some(s) = a.speed {
            positive("--speed", s)?;
            if !(1e-6..=1e6).contains(&s) {
                bail!("--speed {s}: give a factor between 0.000001 and 1000000");
            }
        }
        at_least_one("--max-concurrency", a.max_concurrency)?;
        check_measurement_flags(&a)?;
        let probe_rate = match a.probe_request_rate {
            Some(r) => Some(positive("--probe-request-rate", r)?),
            None => None,
        };
        let start_at = match &a.start_at {
            Some(t) => Some(start::parse(t, SystemTime::now()).map_err(anyhow::Error::msg)?),
            None => None,
        };
        let timeouts = Timeouts {
            idle: Duration::from_secs_f64(positive("--idle-timeout-s", a.idle_timeout_s)?),
            total: Duration::from_secs_f64(positive("--timeout-s", a.timeout_s)?),
        };
        let base = base_config(a.trace.clone(), &a.target, &a.prompts, &a.requests)?;
        let shadows = shadows(&a, &|var| std::env::var(var).ok())?;
        Ok(Config {
            // A shadowed replay's sides are paired by their per-request rows.
            detailed: a.detailed || !shadows.is_empty(),
            shadows,
            percentiles: percentiles(&a.percentiles)?,
            slo: goodput(&a.goodput)?,
            shaping: shaping(&a)?,
            tuning: tuning(&a)?,
            timeouts,
            probe_rate,
            start_at,
            select: crate::trace::select::Selection {
                include_aux: a.include_aux,
                skip_recorded_failures: a.skip_recorded_failures,
                ..base.select
            },
            dry_run: a.dry_run,
            sessions: a.sessions,
            skip_bad: a.skip_bad,
            offer_skip_bad: true,
            scrape_metrics: a.scrape_metrics,
            server_block_size: a.server_block_size,
            speed: a.speed,
            limit: a.limit,
            max_concurrency: a.max_concurrency,
            result_json: a.result_json,
            max_drift_ms: a.max_drift_ms,
            keep_original_limits: a.keep_original_limits,
            ..base
        })
    }
}

/// A replay of `trace` to the target, prompts and request flags given, everything else at its
/// default (replay's other flags unset): what `replay` and `capacity` share.
pub(crate) fn base_config(
    trace: Vec<PathBuf>,
    t: &TargetArgs,
    p: &PromptArgs,
    r: &RequestArgs,
) -> anyhow::Result<Config> {
    at_least_one("--block-size", p.block_size)?;
    let (api, prompt_mode) = api_and_prompts(t, p)?;
    Ok(Config {
        trace,
        target: t.target.clone(),
        target_flag: "--target",
        shadows: Vec::new(),
        meet: None,
        text_from: None,
        target_ca: t.target_ca.clone(),
        model: t.model.clone(),
        api,
        select: crate::trace::select::Selection {
            include_aux: false,
            skip_recorded_failures: false,
            // Without --tokenizer, the target may make text (checked once it is known).
            text_prompts: prompt_mode == PromptMode::Text || p.tokenizer.is_none(),
        },
        speed: None,
        limit: None,
        max_concurrency: None,
        block_size: p.block_size,
        tokenizer: p.tokenizer.clone(),
        vocab_size: p.vocab_size.unwrap_or(DEFAULT_VOCAB),
        prompt_mode,
        seed: p.seed,
        result_json: None,
        detailed: false,
        headers: headers(r)?,
        extra_body: extra_body(r.extra_body.as_deref())?,
        max_drift_ms: None,
        percentiles: vec![99.0],
        slo: metrics::Slo::default(),
        keep_original_limits: false,
        timeouts: Timeouts {
            idle: Duration::from_secs_f64(IDLE_TIMEOUT_S),
            total: Duration::from_secs_f64(TIMEOUT_S),
        },
        tuning: Tuning {
            warm_connections: None,
            kernel_rx: true,
            reader_threads: reader_threads("auto")?,
            read_batch: Duration::from_micros(READ_BATCH_US),
            window: Default::default(),
        },
        progress: std::io::stderr().is_terminal(),
        fd_limit: None,
        shaping: shaping::Shaping {
            loops: 1,
            overlay: 1,
            seed: p.seed,
            ..Default::default()
        },
        dry_run: false,
        sessions: false,
        skip_bad: false,
        offer_skip_bad: false,
        scrape_metrics: None,
        server_block_size: SERVER_BLOCK_SIZE,
        probe_rate: None,
        start_at: None,
        stretch: None,
    })
}

/// `--shadow` and its flags: each URL checked as `--target` is, none the target's or another
/// shadow's, each with only the key of `--shadow-api-key-env` (read from `env`).
fn shadows(
    a: &ReplayArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Vec<ShadowTarget>> {
    if a.shadow.is_empty() {
        let given = [
            (a.shadow_model.is_some(), "--shadow-model"),
            (a.shadow_api_key_env.is_some(), "--shadow-api-key-env"),
            (a.shadow_control.is_some(), "--shadow-control"),
        ];
        if let Some((_, flag)) = given.iter().find(|(g, _)| *g) {
            bail!("{flag} needs --shadow URL");
        }
        return Ok(Vec::new());
    }
    if a.shadow.len() > MAX_SHADOWS {
        bail!(
            "--shadow: at most {MAX_SHADOWS} shadows ({} given)",
            a.shadow.len()
        );
    }
    let Some(target) = &a.target.target else {
        bail!("--shadow needs --target URL: the target is the other side of the comparison");
    };
    if a.sessions {
        bail!("--shadow with --sessions: a turn's send time depends on its target's answers, so the sides could not send at the same instants");
    }
    let place = |u: &str, flag: &str| -> anyhow::Result<String> {
        let t = Target::parse_as(u, HeaderMap::new(), flag).map_err(|e| anyhow!(e))?;
        Ok(t.url())
    };
    let mut seen = vec![place(target, "--target")?];
    let headers = shadow_headers(a.shadow_api_key_env.as_deref(), env)?;
    let mut out = Vec::new();
    let control = a.shadow_control.iter().map(|u| (u, "--shadow-control"));
    for (u, flag) in a.shadow.iter().map(|u| (u, "--shadow")).chain(control) {
        let at = place(u, flag)?;
        if seen.contains(&at) {
            bail!("{flag} {at}: already a target of this replay; a shadow must be another server");
        }
        seen.push(at);
        out.push(ShadowTarget {
            url: u.clone(),
            model: a.shadow_model.clone(),
            headers: headers.clone(),
            control: flag == "--shadow-control",
        });
    }
    Ok(out)
}

/// The shadows' headers: their `Authorization: Bearer` from `--shadow-api-key-env VAR`, if given.
fn shadow_headers(
    var: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<HeaderMap> {
    let mut headers = HeaderMap::new();
    if let Some(var) = var {
        let v = bearer_from_env("--shadow-api-key-env", var, env)?;
        headers.insert(AUTHORIZATION, v);
    }
    Ok(headers)
}

fn positive(flag: &str, v: f64) -> anyhow::Result<f64> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        bail!("{flag} {v}: must be a positive number")
    }
}

fn at_least_one<T: PartialEq + From<u8>>(flag: &str, v: Option<T>) -> anyhow::Result<()> {
    if v == Some(T::from(0)) {
        bail!("{flag} 0: must be at least 1");
    }
    Ok(())
}

pub(super) fn percentiles(list: &str) -> anyhow::Result<Vec<f64>> {
    list.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim()
                .parse::<f64>()
                .ok()
                .filter(|p| (0.0..=100.0).contains(p))
                .ok_or_else(|| anyhow!("--percentiles {list:?}: {s:?} is not a number in 0..=100"))
        })
        .collect()
}

fn goodput(items: &[String]) -> anyhow::Result<metrics::Slo> {
    let mut slo = metrics::Slo::default();
    for item in items {
        let bad = || anyhow!("--goodput {item:?}: expected ttft:MS, tpot:MS or e2el:MS");
        let (k, v) = item.split_once(':').ok_or_else(bad)?;
        let ms: f64 = v.trim().parse().map_err(|_| bad())?;
        if !(ms.is_finite() && ms >= 0.0) {
            return Err(bad());
        }
        match k.trim() {
            "ttft" => slo.ttft_ms = Some(ms),
            "tpot" => slo.tpot_ms = Some(ms),
            "e2el" => slo.e2el_ms = Some(ms),
            _ => return Err(bad()),
        }
    }
    Ok(slo)
}

/// `--endpoint` and `--prompt-mode`, which must fit together and with `--tokenizer` (without
/// one, text prompts are made by the target).
fn api_and_prompts(t: &TargetArgs, p: &PromptArgs) -> anyhow::Result<(Option<Api>, PromptMode)> {
    let (api, prompt_mode) = (t.endpoint, p.prompt_mode);
    // Without --tokenizer, text comes from the target's /tokenize and /detokenize.
    if api == Some(Api::Chat) && prompt_mode == PromptMode::TokenIds && p.tokenizer.is_some() {
        bail!("--endpoint chat sends text: add --prompt-mode text to use --tokenizer");
    }
    Ok((api, prompt_mode))
}

/// The environment variable the key is read from without `--api-key-env`, as the `openai` SDK
/// and `vllm bench serve` read it.
pub(crate) const OPENAI_API_KEY: &str = "OPENAI_API_KEY";

/// `--header` values and the API key ([`api_key`]), read from the process environment.
fn headers(a: &RequestArgs) -> anyhow::Result<HeaderMap> {
    headers_with(a, &|var| std::env::var(var).ok())
}

/// [`headers`] with `env` as the environment.
fn headers_with(
    a: &RequestArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<HeaderMap> {
    let mut headers = HeaderMap::new();
    for h in &a.header {
        let (k, v) = crate::replay::http::target::parse_header(h).map_err(|e| anyhow!(e))?;
        headers.append(k, v);
    }
    let explicit = headers.contains_key(AUTHORIZATION);
    if let Some(v) = api_key(a.api_key_env.as_deref(), explicit, env)? {
        headers.insert(AUTHORIZATION, v);
    }
    Ok(headers)
}

/// The `Authorization: Bearer` value: the key in `--api-key-env VAR`; without the flag, the key
/// in `OPENAI_API_KEY` when it is set and not empty, unless `--header` gave an Authorization of
/// its own (`explicit`). The value is marked sensitive, and no error shows the key.
fn api_key(
    flag: Option<&str>,
    explicit: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<HeaderValue>> {
    match flag {
        Some(var) => bearer_from_env("--api-key-env", var, env).map(Some),
        None if explicit => Ok(None),
        None => match env(OPENAI_API_KEY) {
            Some(k) if !k.trim().is_empty() => bearer(&k, OPENAI_API_KEY).map(Some),
            _ => Ok(None),
        },
    }
}

/// [`bearer`] of the key in environment variable `var`, which `flag` named.
fn bearer_from_env(
    flag: &str,
    var: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<HeaderValue> {
    match env(var) {
        Some(k) if !k.trim().is_empty() => bearer(&k, &format!("{flag} {var}")),
        Some(_) => bail!("{flag} {var}: environment variable {var} is empty"),
        None => bail!("{flag} {var}: environment variable {var} is not set"),
    }
}

/// `Bearer KEY` as a header value marked sensitive; an invalid key is named by where it came
/// from (`from`), never shown.
fn bearer(key: &str, from: &str) -> anyhow::Result<HeaderValue> {
    let mut v = HeaderValue::from_str(&format!("Bearer {}", key.trim()))
        .map_err(|_| anyhow!("{from}: the key is not a valid header value"))?;
    v.set_sensitive(true);
    Ok(v)
}

fn extra_body(s: Option<&str>) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    match s.map(serde_json::from_str::<serde_json::Value>) {
        None => Ok(serde_json::Map::new()),
        Some(Ok(serde_json::Value::Object(m))) => Ok(m),
        Some(Ok(_)) => bail!("--extra-body: must be a JSON object, like '{{\"temperature\":0}}'"),
        Some(Err(e)) => bail!("--extra-body: not JSON: {e}"),
    }
}

fn shaping(a: &ReplayArgs) -> anyhow::Result<shaping::Shaping> {
    let window_us = values::parse_flag("--window", a.window.as_deref(), values::parse_window)?;
    let max_gap_us =
        values::parse_flag("--max-gap", a.max_gap.as_deref(), values::parse_duration_us)?;
    shaping::Shaping::from_flags(&shaping::ShapingFlags {
        window_us,
        loops: a.loop_count,
        overlay: a.overlay,
        overlay_distinct: a.overlay_distinct,
        max_gap_us,
        request_rate: a.request_rate,
        burstiness: a.burstiness,
        ramp_up: a.ramp_up.as_deref(),
        ramp_up_start_rps: a.ramp_up_start_rps,
        ramp_up_end_rps: a.ramp_up_end_rps,
        shard: a.shard.as_deref(),
        limit: a.limit,
        seed: a.prompts.seed,
    })
    .map_err(anyhow::Error::msg)
}

/// `--scrape-metrics`, `--max-drift-ms`, `--server-block-size`: checked, nothing to convert.
fn check_measurement_flags(a: &ReplayArgs) -> anyhow::Result<()> {
    if a.server_block_size == 0 {
        bail!("--server-block-size 0: must be at least 1");
    }
    if let Some(Some(u)) = &a.scrape_metrics {
        scrape_url(u)?;
    }
    if let Some(d) = a.max_drift_ms {
        if !(d.is_finite() && d >= 0.0) {
            bail!("--max-drift-ms {d}: must be a non-negative number");
        }
    }
    Ok(())
}

/// `--reader-threads`: `auto` is one per CPU, at most 4.
fn reader_threads(v: &str) -> anyhow::Result<usize> {
    Ok(match v {
        "auto" => std::thread::available_parallelism().map_or(1, |n| n.get().min(4)),
        n => match n.parse::<usize>() {
            Ok(v) if v <= 64 => v,
            _ => bail!("--reader-threads {n:?}: give a number of threads (0 to 64) or auto"),
        },
    })
}

/// `--scrape-metrics=URL` (replay's and capacity's): plain http, no credentials in it.
pub(crate) fn scrape_url(u: &str) -> anyhow::Result<()> {
    crate::sys::userinfo::refuse("--scrape-metrics", u).map_err(anyhow::Error::msg)?;
    if !u.starts_with("http://") {
        bail!("--scrape-metrics={u}: give an http:// URL, like http://127.0.0.1:8000/metrics");
    }
    Ok(())
}

/// The hidden tuning knobs.
fn tuning(a: &ReplayArgs) -> anyhow::Result<Tuning> {
    let reader_threads = reader_threads(&a.reader_threads)?;
    if a.read_batch_us > 5_000 {
        bail!("--read-batch-us {}: at most 5000 (5 ms)", a.read_batch_us);
    }
    let kernel_rx = match a.rx_stamp.as_str() {
        "kernel" => true,
        "read" => false,
        other => bail!("--rx-stamp {other:?}: give kernel or read"),
    };
    Ok(Tuning {
        warm_connections: a.warm_connections,
        kernel_rx,
        reader_threads,
        read_batch: Duration::from_micros(a.read_batch_us),
        window: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> anyhow::Result<Config> {
        let mut v = vec!["retrace", "replay", "t.jsonl"];
        v.extend_from_slice(args);
        match <crate::cli::Cli as clap::Parser>::parse_from(v).command {
            crate::cli::Command::Replay(a) => a.config(),
            _ => unreachable!("replay"),
        }
    }

    #[test]
    fn duration_errors_name_the_flag() {
        for (args, flag) in [
            (["--window", "3s"], "--window"),
            (["--max-gap", "x"], "--max-gap"),
        ] {
            let e = config(&args).unwrap_err().to_string();
            assert!(e.contains(flag), "{e} should name {flag}");
        }
        let c = config(&["--window", "1s..2s", "--max-gap", "5s"]).unwrap();
        assert_eq!(c.shaping.window_us, Some((1_000_000, 2_000_000)));
        assert_eq!(c.shaping.max_gap_us, Some(5_000_000));
    }

    /// The `Authorization` value `args` give when the environment holds `env`.
    fn auth(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Option<String>> {
        let mut v = vec!["retrace", "replay", "t.jsonl"];
        v.extend_from_slice(args);
        let crate::cli::Command::Replay(a) =
            <crate::cli::Cli as clap::Parser>::parse_from(v).command
        else {
            unreachable!("replay")
        };
        let lookup = |var: &str| {
            env.iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| v.to_string())
        };
        let h = headers_with(&a.requests, &lookup)?;
        Ok(h.get(AUTHORIZATION)
            .map(|v| v.to_str().unwrap().to_string()))
    }

    #[test]
    fn api_key_flag_beats_openai_api_key_which_is_used_without_it() {
        let both = [("MY_KEY", "from-flag"), (OPENAI_API_KEY, "from-env")];
        let flag = auth(&["--api-key-env", "MY_KEY"], &both).unwrap();
        assert_eq!(flag.as_deref(), Some("Bearer from-flag"));
        let env = auth(&[], &both).unwrap();
        assert_eq!(env.as_deref(), Some("Bearer from-env"));
        assert_eq!(auth(&[], &[]).unwrap(), None, "neither: no header");
        assert_eq!(auth(&[], &[(OPENAI_API_KEY, " ")]).unwrap(), None, "empty");
        // An Authorization header given by hand is not replaced by the environment's key.
        let own = auth(&["--header", "Authorization=Bearer own"], &both).unwrap();
        assert_eq!(own.as_deref(), Some("Bearer own"));
    }

    #[test]
    fn api_key_errors_name_the_variable_and_never_the_key() {
        let e = auth(&["--api-key-env", "MY_KEY"], &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--api-key-env MY_KEY") && e.contains("not set"),
            "{e}"
        );
        let bad = [(OPENAI_API_KEY, "sk-secret\nline")];
        let e = auth(&[], &bad).unwrap_err().to_string();
        assert!(e.contains(OPENAI_API_KEY), "{e}");
        assert!(!e.contains("sk-secret"), "{e}");
    }

    #[test]
    fn a_shadow_gets_its_own_key_and_never_the_targets() {
        let args = |extra: &[&str]| {
            let mut v = vec![
                "retrace",
                "replay",
                "t.jsonl",
                "--target",
                "http://127.0.0.1:9",
            ];
            v.extend_from_slice(&["--shadow", "http://127.0.0.1:10"]);
            v.extend_from_slice(extra);
            match <crate::cli::Cli as clap::Parser>::parse_from(v).command {
                crate::cli::Command::Replay(a) => a,
                _ => unreachable!("replay"),
            }
        };
        let env = |var: &str| match var {
            "SHADOW_KEY" => Some("sk-shadow".to_string()),
            OPENAI_API_KEY => Some("sk-target".to_string()),
            _ => None,
        };
        let target_key = ["--header", "Authorization=Bearer sk-target"];
        let none = shadows(&args(&target_key), &env).unwrap();
        assert!(none[0].headers.is_empty(), "{:?}", none[0].headers);
        let own = shadows(&args(&["--shadow-api-key-env", "SHADOW_KEY"]), &env).unwrap();
        let v = own[0].headers.get(AUTHORIZATION).unwrap();
        assert_eq!(v.to_str().unwrap(), "Bearer sk-shadow");
        assert!(v.is_sensitive());
        let e = shadows(&args(&["--shadow-api-key-env", "NOPE"]), &env).unwrap_err();
        assert!(e.to_string().contains("--shadow-api-key-env NOPE"), "{e}");
    }
}
