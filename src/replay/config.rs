//! `retrace replay`'s validated configuration: [`Config::from_args`] checks the command line, one
//! small parser per flag group; every error names its flag.

use crate::cli::{values, ReplayArgs};
use crate::metrics::{self, Api};
use crate::replay::http::request::PromptMode;
use crate::replay::http::target::Timeouts;
use crate::replay::plan::{shaping, start};
use anyhow::{anyhow, bail};
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// Default vocabulary size without a tokenizer.
pub const DEFAULT_VOCAB: u32 = 4096;

/// A validated replay configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The trace: one file, or several recordings merged by wall clock.
    pub trace: Vec<PathBuf>,
    pub target: Option<String>,
    /// `--target-ca`: trust roots for an https target (default: system bundle).
    pub target_ca: Option<PathBuf>,
    pub model: Option<String>,
    /// `--endpoint`: the API of synthesised prompts (`None`: each request's recorded one).
    pub api: Option<Api>,
    /// `--include-aux`, `--skip-recorded-failures`: which requests are sent.
    pub select: crate::trace::select::Selection,
    pub speed: Option<f64>,
    pub limit: Option<usize>,
    pub max_concurrency: Option<usize>,
    pub block_size: Option<u32>,
    pub tokenizer: Option<PathBuf>,
    pub vocab_size: u32,
    pub prompt_mode: PromptMode,
    pub seed: u64,
    pub result_json: Option<PathBuf>,
    pub detailed: bool,
    /// Extra headers, the API key included (never printed or written).
    pub headers: HeaderMap,
    pub extra_body: serde_json::Map<String, serde_json::Value>,
    pub max_drift_ms: Option<f64>,
    pub percentiles: Vec<f64>,
    /// `--goodput` objectives (empty = no goodput).
    pub slo: metrics::Slo,
    pub keep_original_limits: bool,
    pub timeouts: Timeouts,
    /// The hidden tuning knobs (docs/tuning.md).
    pub tuning: Tuning,
    /// Show a progress bar (stderr is a terminal).
    pub progress: bool,
    /// The open-file limit in force, when known (warns when streams may exceed it).
    pub fd_limit: Option<u64>,
    /// Workload shaping applied to the trace before planning.
    pub shaping: shaping::Shaping,
    /// Print the schedule summary and exit.
    pub dry_run: bool,
    /// `--sessions`: a turn waits for its session's previous turn plus think time.
    pub sessions: bool,
    /// `--skip-bad`: malformed trace rows are skipped and counted.
    pub skip_bad: bool,
    /// `--scrape-metrics`: `Some(None)` = the target's /metrics, `Some(Some(url))` = that URL.
    pub scrape_metrics: Option<Option<String>>,
    /// `--server-block-size`, tokens.
    pub server_block_size: u32,
    /// `--probe-request-rate`, probes per second.
    pub probe_rate: Option<f64>,
    /// `--start-at`: the wall-clock instant of t0.
    pub start_at: Option<SystemTime>,
}

/// The hidden knobs of the client and the dispatcher.
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    /// Connections opened before the clock starts (`None` = --max-concurrency, else 128).
    pub warm_connections: Option<usize>,
    /// `--rx-stamp kernel`: events are stamped when they reached this host.
    pub kernel_rx: bool,
    /// `--reader-threads`, resolved (0 = bodies read on the tasks).
    pub reader_threads: usize,
    /// `--read-batch-us`.
    pub read_batch: Duration,
    /// The body builder's window: constants ([`crate::replay::plan::body::LEAD`], [`crate::replay::plan::body::MAX_BYTES`]),
    /// not flags; tests make it small.
    pub window: crate::replay::plan::body::Limits,
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

fn percentiles(list: &str) -> anyhow::Result<Vec<f64>> {
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
fn api_and_prompts(a: &ReplayArgs) -> anyhow::Result<(Option<Api>, PromptMode)> {
    let (api, prompt_mode) = (a.endpoint, a.prompt_mode);
    // Without --tokenizer, text comes from the target's /tokenize and /detokenize.
    if api == Some(Api::Chat) && prompt_mode == PromptMode::TokenIds && a.tokenizer.is_some() {
        bail!("--endpoint chat sends text: add --prompt-mode text to use --tokenizer");
    }
    Ok((api, prompt_mode))
}

/// `--header` values and the `--api-key-env` key.
fn headers(a: &ReplayArgs) -> anyhow::Result<HeaderMap> {
    let mut headers = HeaderMap::new();
    for h in &a.header {
        let (k, v) = crate::replay::http::target::parse_header(h).map_err(|e| anyhow!(e))?;
        headers.append(k, v);
    }
    if let Some(var) = &a.api_key_env {
        let key = std::env::var(var)
            .map_err(|_| anyhow!("--api-key-env {var}: environment variable {var} is not set"))?;
        let mut v = HeaderValue::from_str(&format!("Bearer {}", key.trim()))
            .map_err(|_| anyhow!("--api-key-env {var}: the key is not a valid header value"))?;
        v.set_sensitive(true);
        headers.insert(AUTHORIZATION, v);
    }
    Ok(headers)
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
        seed: a.seed,
    })
    .map_err(anyhow::Error::msg)
}

/// `--scrape-metrics`, `--max-drift-ms`, `--server-block-size`: checked, nothing to convert.
fn check_measurement_flags(a: &ReplayArgs) -> anyhow::Result<()> {
    if a.server_block_size == 0 {
        bail!("--server-block-size 0: must be at least 1");
    }
    if let Some(Some(u)) = &a.scrape_metrics {
        crate::sys::userinfo::refuse("--scrape-metrics", u).map_err(anyhow::Error::msg)?;
        if !u.starts_with("http://") {
            bail!("--scrape-metrics={u}: give an http:// URL, like http://127.0.0.1:8000/metrics");
        }
    }
    if let Some(d) = a.max_drift_ms {
        if !(d.is_finite() && d >= 0.0) {
            bail!("--max-drift-ms {d}: must be a non-negative number");
        }
    }
    Ok(())
}

impl Tuning {
    fn from_args(a: &ReplayArgs) -> anyhow::Result<Tuning> {
        let reader_threads = match a.reader_threads.as_str() {
            "auto" => std::thread::available_parallelism().map_or(1, |n| n.get().min(4)),
            n => match n.parse::<usize>() {
                Ok(v) if v <= 64 => v,
                _ => bail!("--reader-threads {n:?}: give a number of threads (0 to 64) or auto"),
            },
        };
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
}

impl Config {
    /// The trace's file name(s), as errors and the result file name it.
    pub fn trace_name(&self) -> String {
        crate::trace::fleet::names(&self.trace)
    }

    /// Validates the command line; every error names the flag.
    pub fn from_args(a: ReplayArgs) -> anyhow::Result<Config> {
        if let Some(s) = a.speed {
            positive("--speed", s)?;
            if !(1e-6..=1e6).contains(&s) {
                bail!("--speed {s}: give a factor between 0.000001 and 1000000");
            }
        }
        at_least_one("--max-concurrency", a.max_concurrency)?;
        at_least_one("--block-size", a.block_size)?;
        check_measurement_flags(&a)?;
        let (api, prompt_mode) = api_and_prompts(&a)?;
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
        Ok(Config {
            percentiles: percentiles(&a.percentiles)?,
            slo: goodput(&a.goodput)?,
            headers: headers(&a)?,
            extra_body: extra_body(a.extra_body.as_deref())?,
            shaping: shaping(&a)?,
            tuning: Tuning::from_args(&a)?,
            timeouts,
            probe_rate,
            start_at,
            api,
            select: crate::trace::select::Selection {
                include_aux: a.include_aux,
                skip_recorded_failures: a.skip_recorded_failures,
                // Without --tokenizer, the target may make text (checked once it is known).
                text_prompts: prompt_mode == PromptMode::Text || a.tokenizer.is_none(),
            },
            prompt_mode,
            dry_run: a.dry_run,
            sessions: a.sessions,
            skip_bad: a.skip_bad,
            scrape_metrics: a.scrape_metrics,
            server_block_size: a.server_block_size,
            trace: a.trace,
            target: a.target,
            target_ca: a.target_ca,
            model: a.model,
            speed: a.speed,
            limit: a.limit,
            max_concurrency: a.max_concurrency,
            block_size: a.block_size,
            tokenizer: a.tokenizer,
            vocab_size: a.vocab_size.unwrap_or(DEFAULT_VOCAB),
            seed: a.seed,
            result_json: a.result_json,
            detailed: a.detailed,
            max_drift_ms: a.max_drift_ms,
            keep_original_limits: a.keep_original_limits,
            progress: std::io::stderr().is_terminal(),
            fd_limit: None,
        })
    }
}
