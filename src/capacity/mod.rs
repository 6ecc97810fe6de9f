//! `retrace capacity`: how many times a trace's own load a deployment takes within an SLO.
//!
//! Each step replays the trace with its timing scaled by a factor (as `--speed`) for a fixed
//! stretch of wall-clock time: the `--warmup` (sent, not measured), then the `--step` (measured),
//! then it drains. A trace too short for the factor is repeated back to back, each copy with
//! fresh hash ids (`--loop`'s copies, with `--overlay-distinct`'s ids): every copy keeps its own
//! prefix reuse and shares no cached prefix with another, and each step's copies are numbered
//! after the previous steps', so no step finds another's prompts in the target's cache.
//! [`search`] picks the factors; [`slo`]
//! judges each step on its summary; a step whose SLO is lost whatever the rest of it does is
//! given up at once ([`crate::replay::step`]). Between steps nothing is in flight (each step
//! drains), and with `--reset-prefix-cache` the target's prefix cache is emptied.
//!
//! The result file (`retrace.capacity/1`, docs/result-format.md) holds every step with its full
//! replay result, and the answer. It is rewritten after each step, so a search that stops keeps
//! what it measured.

pub(crate) mod search;
pub(crate) mod slo;
mod table;
mod why;

use crate::replay::{self, step, Config};
use crate::sys::signal::{Signal, Signals};
use anyhow::Context;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Exit status when no speed met the SLO, down to the lowest tried.
pub(crate) const EXIT_NEVER_MET: u8 = 7;

/// Exit status when the search stopped on an error (a target that died): the steps done are in
/// the result file.
pub(crate) const EXIT_ERROR: u8 = 2;

/// Schema identifier of the result file.
pub(crate) const SCHEMA: &str = "retrace.capacity/1";

/// What `retrace capacity` is asked (the command line's, validated).
#[derive(Debug, Clone)]
pub(crate) struct CapacityOptions {
    /// The replay of one step, before its speed, copies and stretch are set.
    pub(crate) replay: Config,
    pub(crate) slo: slo::Slo,
    pub(crate) plan: search::Plan,
    pub(crate) warmup: Duration,
    pub(crate) step: Duration,
    pub(crate) reset_prefix_cache: bool,
    pub(crate) result_json: Option<PathBuf>,
}

/// The trace at 1×: its requests and how long a copy lasts (span and one mean gap, as `--loop`
/// repeats it).
#[derive(Debug, Clone, Copy)]
struct Base {
    requests: usize,
    period_ns: u64,
    output_tokens: u64,
}

impl Base {
    fn rate(&self) -> f64 {
        self.requests as f64 / (self.period_ns as f64 / 1e9)
    }

    /// Copies of the trace a step at `speed` lasting `stretch` needs.
    fn copies(&self, speed: f64, stretch: Duration) -> u32 {
        let need = stretch.as_nanos() as f64 * speed;
        (need / self.period_ns.max(1) as f64)
            .ceil()
            .clamp(1.0, u32::MAX as f64) as u32
    }
}

/// One step done.
#[derive(Debug, Clone)]
struct Step {
    speed: f64,
    copies: u32,
    seconds: f64,
    offered_rps: f64,
    offered_output_tps: f64,
    judged: Vec<slo::Judgement>,
    slo_met: bool,
    /// Why the step does not count as met besides its rules (given up, invalid, all failed).
    because: Option<String>,
    warmup_requests: u64,
    summary: crate::metrics::Summary,
    result: Value,
}

/// Entry point of `retrace capacity`.
pub(crate) fn run(o: CapacityOptions) -> anyhow::Result<ExitCode> {
    let base = survey(&o)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(search_all(&o, base))
}

/// The trace at 1× (read once, nothing sent).
fn survey(o: &CapacityOptions) -> anyhow::Result<Base> {
    let cfg = Config {
        speed: Some(1.0),
        ..o.replay.clone()
    };
    let p = replay::planning(&cfg, cfg.target.is_none())?;
    let sv = &p.survey;
    if sv.measured == 0 {
        anyhow::bail!(
            "{}: nothing to send: the trace holds no request to measure",
            cfg.trace_name()
        );
    }
    let n = sv.measured as u64;
    let gap = if n > 1 {
        sv.span_ns / (n - 1)
    } else {
        1_000_000_000
    };
    Ok(Base {
        requests: sv.measured,
        period_ns: sv.span_ns + gap.max(1),
        output_tokens: sv.dry.output_tokens(),
    })
}

/// The step at `speed`'s replay configuration; its copies of the trace get the hash ids of the
/// copies numbered from `first` (those before went to earlier steps), so that no step finds
/// another's prompts in the target's cache.
fn step_config(o: &CapacityOptions, base: &Base, speed: f64, first: u64) -> (Config, u32) {
    let stretch = o.warmup + o.step;
    let copies = base.copies(speed, stretch);
    let mut c = o.replay.clone();
    c.speed = Some(speed);
    c.shaping.loops = copies;
    c.shaping.loop_distinct = Some(first);
    c.shaping.until_ns = Some(stretch.as_nanos() as u64);
    c.stretch = Some(step::Stretch {
        warmup_ns: o.warmup.as_nanos() as u64,
        budgets: o.slo.budgets(),
    });
    c.percentiles = slo::PERCENTILES.to_vec();
    c.slo = o.slo.goodput;
    c.result_json = None;
    c.detailed = false;
    c.progress = false;
    (c, copies)
}

/// Signals: the first halts the running step and ends the search (its result is written); a
/// second exits at once.
#[derive(Default)]
struct Stop {
    by: Mutex<Option<Signal>>,
    current: Mutex<Option<Arc<replay::driver::Halt>>>,
}

impl Stop {
    fn by(&self) -> Option<Signal> {
        *self.by.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn on_signals(mut signals: Signals, stop: Arc<Stop>) {
    let first = signals.recv().await;
    *stop.by.lock().unwrap_or_else(|e| e.into_inner()) = Some(first);
    if let Some(h) = stop
        .current
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
    {
        h.halt(first);
    }
    eprintln!("retrace: {first}: the search ends after this step; a second signal exits at once");
    let again = signals.recv().await;
    eprintln!("retrace: {again}: exiting at once");
    crate::sys::partial::exit(again.exit_code())
}

async fn search_all(o: &CapacityOptions, base: Base) -> anyhow::Result<ExitCode> {
    let stop = Arc::new(Stop::default());
    let signals = Signals::install().context("handling SIGINT and SIGTERM")?;
    tokio::spawn(on_signals(signals, stop.clone()));
    let mut search = search::Search::new(o.plan.clone());
    let mut steps: Vec<Step> = Vec::new();
    let started = Instant::now();
    let mut reset_missing = false;
    let mut failure = None;
    while let Some(speed) = search.next() {
        if stop.by().is_some() {
            break;
        }
        if o.reset_prefix_cache && !reset_missing {
            reset_missing = !reset_prefix_cache(&o.replay).await?;
        }
        progress(&search, &steps, speed, o, started);
        let first = steps.iter().map(|s| u64::from(s.copies)).sum::<u64>();
        match run_step(o, &base, (speed, first), &stop).await {
            // A step a signal halted is kept, and judges nothing.
            Ok(s) if stop.by().is_some() => {
                steps.push(Step {
                    slo_met: false,
                    because: Some("interrupted".into()),
                    ..s
                });
                break;
            }
            Ok(s) => {
                search.record(speed, s.slo_met);
                steps.push(s);
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
        write_result(o, &base, &search, &steps)?;
    }
    write_result(o, &base, &search, &steps)?;
    print!("{}", table::render(&steps_view(&steps), &o.slo));
    if let Some(e) = failure {
        eprintln!(
            "retrace: capacity: {e:#}; the search stopped after {} steps{}",
            steps.len(),
            o.result_json
                .as_ref()
                .map_or(String::new(), |p| format!(" (kept in {})", p.display()))
        );
        return Ok(ExitCode::from(EXIT_ERROR));
    }
    let answer = search.answer();
    println!(
        "{}",
        table::answer_line(&answer_view(&search, &steps), &o.slo)
    );
    if let Some(w) = why_line(&search, &steps) {
        println!("why: {w}");
    }
    if let Some(s) = stop.by() {
        return Ok(ExitCode::from(s.exit_code()));
    }
    Ok(match answer.speed {
        None => ExitCode::from(EXIT_NEVER_MET),
        Some(_) => ExitCode::SUCCESS,
    })
}

/// Runs and judges the step at `speed`; an error when its replay could not run or every
/// request found the target unreachable (the target died).
async fn run_step(
    o: &CapacityOptions,
    base: &Base,
    (speed, first): (f64, u64),
    stop: &Stop,
) -> anyhow::Result<Step> {
    let (cfg, copies) = step_config(o, base, speed, first);
    let halt = Arc::new(replay::driver::Halt::default());
    *stop.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(halt.clone());
    let t = Instant::now();
    let out = replay::replay_with(cfg, halt)
        .await
        .with_context(|| format!("the step at {speed}× ({copies} copies of the trace)"))?;
    let seconds = t.elapsed().as_secs_f64();
    let sum = &out.summary;
    let unreachable = sum.errors.get("connect").copied().unwrap_or(0);
    if out.all_failed && unreachable > 0 && unreachable == sum.failed {
        anyhow::bail!("the step at {speed}×: the target could not be reached ({unreachable} requests failed to connect)");
    }
    let judged = o.slo.judge(sum);
    let measured = out.stretch.clone();
    let because = match (&measured, out.all_failed, out.valid) {
        (
            Some(step::Measured {
                gave_up: Some(why), ..
            }),
            _,
            _,
        ) => Some(format!("given up: {why}")),
        (_, true, _) => Some("every request failed".into()),
        (_, _, false) => out.result["invalid_reason"].as_str().map(str::to_string),
        _ => None,
    };
    let slo_met = because.is_none() && judged.iter().all(|j| j.met);
    Ok(Step {
        speed,
        copies,
        seconds,
        offered_rps: base.rate() * speed,
        offered_output_tps: base.output_tokens as f64 / (base.period_ns as f64 / 1e9) * speed,
        judged,
        slo_met,
        because,
        warmup_requests: measured.map_or(0, |m| m.warmup),
        summary: out.summary.clone(),
        result: out.result,
    })
}

/// `POST /reset_prefix_cache` (vLLM's); false, said once, when the target lacks it.
async fn reset_prefix_cache(cfg: &Config) -> anyhow::Result<bool> {
    let Some(url) = &cfg.target else {
        // Each step starts its own embedded mock: its cache starts empty.
        return Ok(true);
    };
    let target = replay::http::target::Target::parse(url, cfg.headers.clone())
        .map_err(anyhow::Error::msg)?;
    let pool = replay::http::pool::Pool::new(&target, cfg.target_ca.as_deref())
        .await
        .map_err(anyhow::Error::msg)?;
    let answer = pool
        .call(
            "POST",
            "/reset_prefix_cache",
            &target.headers,
            None,
            Duration::from_secs(30),
            1 << 20,
        )
        .await;
    match answer {
        Ok((status, _)) if (200..300).contains(&status) => Ok(true),
        Ok((status, _)) => {
            eprintln!("retrace: capacity: --reset-prefix-cache: the target answered POST /reset_prefix_cache with HTTP {status}; the steps share its prefix cache");
            Ok(false)
        }
        Err(e) => anyhow::bail!("--reset-prefix-cache: POST /reset_prefix_cache: {e}"),
    }
}

/// The progress line before a step, with how much is left when the bracket is known.
fn progress(s: &search::Search, steps: &[Step], speed: f64, o: &CapacityOptions, t0: Instant) {
    let per = steps.iter().map(|s| s.seconds).sum::<f64>().max(0.0) / steps.len().max(1) as f64;
    let per = if steps.is_empty() {
        (o.warmup + o.step).as_secs_f64()
    } else {
        per
    };
    let left = s.steps_left_estimate();
    let eta = match left {
        Some(n) => format!("about {n} more steps, ~{:.0} s", n as f64 * per),
        None => "steps left unknown until the SLO is first met and missed".into(),
    };
    eprintln!(
        "retrace: capacity: step {} at {speed}× ({:.0} s in; {eta})",
        steps.len() + 1,
        t0.elapsed().as_secs_f64()
    );
}

/// `--scrape-metrics`: why the answer is where it is ([`why`]).
fn why_line(search: &search::Search, steps: &[Step]) -> Option<String> {
    let gauges: Vec<why::Gauges> = steps
        .iter()
        .map(|s| why::Gauges {
            speed: s.speed,
            metrics: &s.result["server_metrics"],
        })
        .collect();
    why::why(&gauges, search.answer().failed_at)
}

/// Requests of step `s` cut in flight or not sent (a given-up or interrupted step's).
fn cut_of(s: &Step) -> u64 {
    let kind = crate::metrics::Failure::Interrupted.as_str();
    let cut = s.summary.errors.get(kind.as_ref()).copied().unwrap_or(0);
    cut.min(s.summary.failed)
}

fn steps_view(steps: &[Step]) -> Vec<table::Row> {
    steps
        .iter()
        .map(|s| table::Row {
            speed: s.speed,
            offered_rps: s.offered_rps,
            achieved_rps: s.summary.request_throughput,
            offered_output_tps: s.offered_output_tps,
            achieved_output_tps: s.summary.output_throughput,
            p50_ttft_ms: slo::value(&s.summary, "median_ttft_ms"),
            p99_ttft_ms: slo::value(&s.summary, "p99_ttft_ms"),
            p99_itl_ms: slo::value(&s.summary, "p99_itl_ms"),
            goodput: s.summary.request_goodput,
            failed: s.summary.failed - cut_of(s),
            cut: cut_of(s),
            slo_met: s.slo_met,
            because: s.because.clone(),
        })
        .collect()
}

fn answer_view(search: &search::Search, steps: &[Step]) -> table::AnswerView {
    let a = search.answer();
    let at = |x: Option<f64>| x.and_then(|x| steps.iter().rev().find(|s| s.speed == x));
    let limited_by = at(a.failed_at).map(limited_by);
    table::AnswerView {
        speed: a.speed,
        at_least: a.speed.is_some() && a.failed_at.is_none(),
        rps: at(a.speed).map(|s| s.offered_rps),
        output_tps: at(a.speed).map(|s| s.offered_output_tps),
        limited_by,
    }
}

/// What stopped the step that did not meet the SLO: its first rule not met, else why it does
/// not count.
fn limited_by(s: &Step) -> String {
    match s.judged.iter().find(|j| !j.met) {
        Some(j) => j.metric.clone(),
        None => s.because.clone().unwrap_or_default(),
    }
}

fn result_json(o: &CapacityOptions, base: &Base, search: &search::Search, steps: &[Step]) -> Value {
    let a = answer_view(search, steps);
    let (mode, speeds) = match &o.plan {
        search::Plan::Ladder(v) => ("ladder", json!(v)),
        search::Plan::Search { .. } => ("search", Value::Null),
    };
    let (min, max, precision, repeats) = match &o.plan {
        search::Plan::Search {
            min,
            max,
            precision,
            repeats,
        } => (json!(min), json!(max), json!(precision), json!(repeats)),
        search::Plan::Ladder(_) => (Value::Null, Value::Null, Value::Null, Value::Null),
    };
    json!({
        "schema": SCHEMA,
        "retrace_version": env!("CARGO_PKG_VERSION"),
        "trace": o.replay.trace_name(),
        "slo": o.slo.rules.iter().map(|r| r.text.clone()).collect::<Vec<_>>(),
        "search": {
            "mode": mode,
            "speeds": speeds,
            "min_speed": min,
            "max_speed": max,
            "precision": precision,
            "repeats": repeats,
            "warmup_s": o.warmup.as_secs_f64(),
            "step_s": o.step.as_secs_f64(),
            "reset_prefix_cache": o.reset_prefix_cache,
        },
        "recorded": {
            "requests": base.requests,
            "request_rate": base.rate(),
        },
        "steps": steps.iter().map(|s| json!({
            "speed": s.speed,
            "slo_met": s.slo_met,
            "not_met_because": s.because,
            "rules": s.judged,
            "copies": s.copies,
            "warmup_requests": s.warmup_requests,
            "offered_request_rate": s.offered_rps,
            "offered_output_throughput": s.offered_output_tps,
            "wall_s": s.seconds,
            "result": s.result,
        })).collect::<Vec<_>>(),
        "capacity": {
            "speed": a.speed,
            "at_least": a.at_least,
            "limited_by": a.limited_by,
            "request_throughput": a.rps,
            "output_throughput": a.output_tps,
            "why": why_line(search, steps),
        },
    })
}

/// `--result-json`, rewritten whole after every step (written beside, then renamed).
fn write_result(
    o: &CapacityOptions,
    base: &Base,
    search: &search::Search,
    steps: &[Step],
) -> anyhow::Result<()> {
    let Some(path) = &o.result_json else {
        return Ok(());
    };
    let text = serde_json::to_string_pretty(&result_json(o, base, search, steps))?;
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, text).with_context(|| format!("--result-json {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("--result-json {}", path.display()))?;
    Ok(())
}
