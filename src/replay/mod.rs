//! `retrace replay`: re-issue a trace against an OpenAI-compatible server at its own timing.
//!
//! The pipeline, each step its own module: a validated [`Config`] (the command line's, every
//! error naming its flag); [`replay`] runs three stages. [`prepare`]: [`planning`] reads the trace
//! one record at a time through the selection, shaping and schedule ([`source`]; whole for
//! `--loop`, `--overlay` and `--sessions`) and surveys the plan,
//! every request's [`http::request::head`] checked; the [`window`] builder thread reads it again and
//! builds bodies ahead of the clock, and the [`http::client::Client`] opens its connections.
//! [`execute`]: [`driver::drive`] releases requests at absolute deadlines and
//! [`http::client::Client::send`] turns each into a [`crate::metrics::Sample`], beside the optional
//! probes and metric scrapes. [`assemble`]: [`crate::metrics::summarize`] computes vLLM-exact
//! statistics, [`console`] renders them and [`result`] makes the result file. Without `--target`,
//! the embedded simulated engine is started on a loopback port (see [`start_embedded_target`]).
//! A failed request is data; only a broken setup (bad flag, unreadable trace, a target that
//! cannot be reached) is an error. The first SIGINT or SIGTERM halts a running replay
//! ([`driver::Halt`]): its result is what was measured, marked invalid, and it exits 130 or 143
//! ([`on_signals`]).

pub(crate) mod collect;
pub(crate) mod config;
pub(crate) mod console;
pub(crate) mod driver;
pub mod http;
pub(crate) mod outcome;
pub mod plan;
pub(crate) mod probe;
pub(crate) mod progress;
pub(crate) mod scrape;
pub(crate) mod shadow;
pub(crate) mod step;

pub(crate) use config::DEFAULT_VOCAB;
pub use config::{Config, Tuning};
pub use shadow::ShadowSide;

use crate::metrics;
use crate::replay::plan::prompts::{self, Synth, TextBuilder, Vocab};
use crate::sys::signal::{Signal, Signals};
use crate::trace::fleet::open_all;
use crate::trace::import::ImportOptions;
use anyhow::{anyhow, Context};
use http::request::{BodyOptions, BuiltRequest, PromptMode, Prompts};
use hyper::header::HeaderMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Exit status of a run whose p99 drift exceeded `--max-drift-ms`.
pub(crate) const EXIT_INVALID: u8 = 3;

/// Exit status of a run in which no measured request succeeded ([`outcome::all_failed`]); it
/// wins over [`EXIT_INVALID`].
pub(crate) const EXIT_ALL_FAILED: u8 = 5;

/// Exit status of a replay left with nothing to send ([`NothingToSend`]). Not 4: `compare` uses
/// 4 ("not judged"), and no exit code means two things across retrace's commands.
pub(crate) const EXIT_NOTHING_TO_SEND: u8 = 6;

/// The most of the workload a replay may leave out (requests it cannot rebuild, malformed rows
/// skipped with `--skip-bad`) and still be valid: more makes the run invalid (exit 3).
pub(crate) const MAX_LEFT_OUT_SHARE: f64 = 0.10;

/// A replay with nothing to send: every request was left out, or the trace holds none (exit
/// [`EXIT_NOTHING_TO_SEND`]).
#[derive(Debug, thiserror::Error)]
#[error("{0}: nothing to send: {1}")]
pub(crate) struct NothingToSend(pub String, pub(crate) String);

/// With the embedded target and neither `--speed` nor `--limit`, only the requests of this first
/// stretch of the trace are replayed, at real speed, so the run takes about a minute.
pub(crate) const EMBEDDED_DEFAULT_SPAN: Duration = Duration::from_secs(45);

/// What a finished replay produced.
pub struct Outcome {
    pub summary: metrics::Summary,
    pub result: serde_json::Value,
    /// Console report (vLLM block + ours).
    pub report: String,
    pub valid: bool,
    /// No measured request succeeded (and not every one failed as recorded).
    pub all_failed: bool,
    /// `--sessions`: how the session-ordered replay went.
    pub sessions: Option<plan::turns::SessionReport>,
    /// The signal that halted the run.
    pub(crate) interrupted: Option<Signal>,
    /// `capacity`'s step: its warm-up, and why it was given up.
    pub(crate) stretch: Option<step::Measured>,
    /// `--shadow` and `--shadow-control`: each shadow's own outcome.
    pub shadows: Vec<ShadowSide>,
}

impl Outcome {
    /// The process's exit code: interrupted (130 for SIGINT, 143 for SIGTERM), every request
    /// failed (5), the run is invalid (3), or success; with shadows, the first side's (the
    /// target first) that is not success.
    pub(crate) fn exit_code(&self) -> ExitCode {
        let own = self.own_exit_code();
        let shadows = self.shadows.iter().map(|s| s.outcome.own_exit_code());
        let code = std::iter::once(own).chain(shadows).find(|&c| c != 0);
        ExitCode::from(code.unwrap_or(0))
    }

    fn own_exit_code(&self) -> u8 {
        if let Some(s) = self.interrupted {
            return s.exit_code();
        }
        match (self.all_failed, self.valid) {
            (true, _) => EXIT_ALL_FAILED,
            (false, false) => EXIT_INVALID,
            (false, true) => 0,
        }
    }
}

/// Entry point of `retrace replay`: the finished run, or `None` after `--dry-run` (its summary
/// printed). The command line writes `--report-html` and prints the console report.
pub(crate) fn run(cfg: Config) -> anyhow::Result<Option<Outcome>> {
    if cfg.dry_run {
        dry_run(&cfg)?;
        return Ok(None);
    }
    let fds = crate::sys::fdlimit::raise();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let halt = Arc::new(driver::Halt::default());
    let out = rt.block_on(async {
        let signals = Signals::install().context("handling SIGINT and SIGTERM")?;
        tokio::spawn(on_signals(signals, halt.clone()));
        let cfg = Config {
            fd_limit: fds,
            ..cfg
        };
        replay_all(cfg, halt).await
    })?;
    Ok(Some(out))
}

/// The first SIGINT or SIGTERM halts the run ([`driver::Halt`]), which then writes its result;
/// before the clock starts it ends the process, nothing sent and nothing written; a second
/// signal ends it at once. No partial file is left ([`crate::sys::partial::exit`]).
async fn on_signals(mut signals: Signals, halt: Arc<driver::Halt>) {
    let first = signals.recv().await;
    match halt.halt(first) {
        driver::Phase::Setup => {
            eprintln!("retrace: {first}: stopped before the run began; nothing written");
            crate::sys::partial::exit(first.exit_code());
        }
        driver::Phase::Running => eprintln!(
            "retrace: {first}: sending no more requests; those in flight get {} s to end, then the result is written (a second signal exits at once)",
            driver::HALT_GRACE.as_secs()
        ),
        driver::Phase::Ended => {
            eprintln!("retrace: {first}: the run has ended; writing its result (a second signal exits at once)");
        }
    }
    let again = signals.recv().await;
    eprintln!("retrace: {again}: exiting at once; no result written");
    crate::sys::partial::exit(again.exit_code())
}

/// `--dry-run`: the planned schedule's summary, nothing sent.
fn dry_run(cfg: &Config) -> anyhow::Result<()> {
    let p = planning(cfg, cfg.target.is_none())?;
    let sv = &p.survey;
    print!("{}", sv.dry.render(sv.planned, sv.span_ns));
    if let Some(l) = &p.links {
        let dependent = l.pred.iter().filter(|p| p.is_some()).count();
        println!(
            "sessions: {} sessions; {dependent} turns wait for their previous turn + think time (their send times depend on the server)",
            l.sessions
        );
    }
    if let Some(rate) = cfg.probe_rate {
        let n = probe::bodies_needed(p.survey.span_ns, rate, usize::MAX) - 1;
        println!("probes: {rate}/s, about {n} over the planned span (more if the run outlasts it)");
    }
    if let Some(at) = cfg.start_at {
        println!("start at: {}", plan::start::display(at));
    }
    Ok(())
}

/// A running embedded target; shut down after the run.
pub(crate) struct Embedded {
    pub(crate) url: String,
    pub(crate) model: String,
    handle: crate::mock::MockHandle,
}

/// The embedded target's engine: the mock's continuous-batching scheduler with its `fast` profile
/// ([`crate::mock::Profile::FAST`]: ≈200k prefill tokens/s, 8,192-token steps, cheap KV reads),
/// so that a minute of the sample Mooncake traces at real speed is served without an
/// ever-growing queue (the default `llama8b` profile is far too slow for those traces); the same
/// engine as `retrace mock --profile fast`. Per-request metrics on.
pub fn embedded_mock_config() -> crate::mock::MockConfig {
    crate::mock::MockConfig {
        enable_per_request_metrics: true,
        ..crate::mock::MockConfig::with_profile(crate::mock::Profile::FAST)
    }
}

/// Starts the embedded simulated engine ([`embedded_mock_config`]) on an ephemeral loopback port.
pub(crate) async fn start_embedded_target() -> anyhow::Result<Embedded> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding a loopback port for the embedded mock")?;
    let cfg = embedded_mock_config();
    let model = cfg.model.clone();
    let handle = crate::mock::start(listener, cfg)
        .await
        .context("starting the embedded mock")?;
    Ok(Embedded {
        url: format!("http://{}", handle.addr),
        model,
        handle,
    })
}

mod planning;
pub use planning::*;
mod prepare;
pub use prepare::*;
mod execute;
pub use execute::*;
mod assemble;
pub use assemble::*;

#[cfg(test)]
mod tests;
