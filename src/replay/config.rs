//! `retrace replay`'s validated configuration, which the command line builds (every error
//! naming its flag).

use crate::metrics::{self, Api};
use crate::replay::http::request::PromptMode;
use crate::replay::http::target::Timeouts;
use crate::replay::plan::shaping;
use hyper::header::HeaderMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// Default vocabulary size without a tokenizer.
pub(crate) const DEFAULT_VOCAB: u32 = 4096;

/// A validated replay configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The trace: one file, or several recordings merged by wall clock.
    pub(crate) trace: Vec<PathBuf>,
    pub target: Option<String>,
    /// The flag that named the target, as errors name it (`--target`, or `--shadow` for a
    /// shadow's side).
    pub(crate) target_flag: &'static str,
    /// `--shadow`: candidates sent every planned request at the same instant as the target.
    pub(crate) shadows: Vec<crate::replay::shadow::ShadowTarget>,
    /// Where a shadowed replay's sides agree on t0 (none for a single target).
    pub(crate) meet: Option<std::sync::Arc<crate::replay::shadow::Meet>>,
    /// On a shadow's side, the replay's target, whose tokenizer makes and fits the text prompts
    /// (so every side sends the same body); `None`: the side's own target.
    pub(crate) text_from: Option<crate::replay::shadow::TextFrom>,
    /// `--target-ca`: trust roots for an https target (default: system bundle).
    pub(crate) target_ca: Option<PathBuf>,
    pub(crate) model: Option<String>,
    /// `--endpoint`: the API of synthesised prompts (`None`: each request's recorded one).
    pub(crate) api: Option<Api>,
    /// `--include-aux`, `--skip-recorded-failures`: which requests are sent.
    pub(crate) select: crate::trace::select::Selection,
    pub(crate) speed: Option<f64>,
    pub(crate) limit: Option<usize>,
    pub(crate) max_concurrency: Option<usize>,
    pub(crate) block_size: Option<u32>,
    pub(crate) tokenizer: Option<PathBuf>,
    pub(crate) vocab_size: u32,
    pub(crate) prompt_mode: PromptMode,
    pub(crate) seed: u64,
    pub(crate) result_json: Option<PathBuf>,
    pub(crate) detailed: bool,
    /// Extra headers, the API key included (never printed or written).
    pub(crate) headers: HeaderMap,
    pub(crate) extra_body: serde_json::Map<String, serde_json::Value>,
    pub(crate) max_drift_ms: Option<f64>,
    pub(crate) percentiles: Vec<f64>,
    /// `--goodput` objectives (empty = no goodput).
    pub(crate) slo: metrics::Slo,
    pub(crate) keep_original_limits: bool,
    pub(crate) timeouts: Timeouts,
    /// The hidden tuning knobs (docs/tuning.md).
    pub tuning: Tuning,
    /// Show a progress bar (stderr is a terminal).
    pub(crate) progress: bool,
    /// The open-file limit in force, when known (warns when streams may exceed it).
    pub(crate) fd_limit: Option<u64>,
    /// Workload shaping applied to the trace before planning.
    pub(crate) shaping: shaping::Shaping,
    /// Print the schedule summary and exit.
    pub(crate) dry_run: bool,
    /// `--sessions`: a turn waits for its session's previous turn plus think time.
    pub(crate) sessions: bool,
    /// `--skip-bad`: malformed trace rows are skipped and counted.
    pub(crate) skip_bad: bool,
    /// The command has `--skip-bad` (replay does, capacity does not): errors name it.
    pub(crate) offer_skip_bad: bool,
    /// `--scrape-metrics`: `Some(None)` = the target's /metrics, `Some(Some(url))` = that URL.
    pub(crate) scrape_metrics: Option<Option<String>>,
    /// `--server-block-size`, tokens.
    pub(crate) server_block_size: u32,
    /// `--probe-request-rate`, probes per second.
    pub(crate) probe_rate: Option<f64>,
    /// `--start-at`: the wall-clock instant of t0.
    pub(crate) start_at: Option<SystemTime>,
    /// `capacity`'s step: its warm-up and when it is given up (no flag of replay's).
    pub(crate) stretch: Option<crate::replay::step::Stretch>,
}

/// The hidden knobs of the client and the dispatcher.
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    /// Connections opened before the clock starts (`None` = --max-concurrency, else 128).
    pub(crate) warm_connections: Option<usize>,
    /// `--rx-stamp kernel`: events are stamped when they reached this host.
    pub(crate) kernel_rx: bool,
    /// `--reader-threads`, resolved (0 = bodies read on the tasks).
    pub reader_threads: usize,
    /// `--read-batch-us`.
    pub read_batch: Duration,
    /// The body builder's window: constants ([`crate::replay::plan::body::LEAD`], [`crate::replay::plan::body::MAX_BYTES`]),
    /// not flags; tests make it small.
    pub window: crate::replay::plan::body::Limits,
}

impl Config {
    /// The trace's file name(s), as errors and the result file name it.
    pub(crate) fn trace_name(&self) -> String {
        crate::trace::fleet::names(&self.trace)
    }
}
