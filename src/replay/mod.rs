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
pub(crate) mod scrape;

pub(crate) use config::DEFAULT_VOCAB;
pub use config::{Config, Tuning};

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
}

impl Outcome {
    /// The process's exit code: interrupted (130 for SIGINT, 143 for SIGTERM), every request
    /// failed (5), the run is invalid (3), or success.
    pub(crate) fn exit_code(&self) -> ExitCode {
        if let Some(s) = self.interrupted {
            return ExitCode::from(s.exit_code());
        }
        match (self.all_failed, self.valid) {
            (true, _) => ExitCode::from(EXIT_ALL_FAILED),
            (false, false) => ExitCode::from(EXIT_INVALID),
            (false, true) => ExitCode::SUCCESS,
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
        replay_with(cfg, halt).await
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

/// The longest schedule a replay accepts (30 days): anything longer is a mistaken flag or trace.
const MAX_SCHEDULE: Duration = Duration::from_secs(30 * 86_400);

/// Without `--limit` and `--speed`, the embedded target plans only the first
/// [`EMBEDDED_DEFAULT_SPAN`] of the shaped trace: the cut, ns from t0.
fn embedded_cut(cfg: &Config, embedded: bool) -> Option<u64> {
    (embedded && cfg.limit.is_none() && cfg.speed.is_none())
        .then_some(EMBEDDED_DEFAULT_SPAN.as_nanos() as u64)
}

/// Plans a trace held whole ([`plan::source::plan_whole`]): every send in plan order, cut for the
/// embedded target, and what the selection left out.
pub fn plan(
    cfg: &Config,
    trace: crate::trace::Trace,
    embedded: bool,
) -> anyhow::Result<(Vec<plan::source::Planned>, crate::trace::select::Skipped)> {
    plan_counted(cfg, trace, embedded).map(|(sends, left_out, _)| (sends, left_out))
}

/// [`plan`], with the number of records read.
fn plan_counted(
    cfg: &Config,
    mut trace: crate::trace::Trace,
    embedded: bool,
) -> anyhow::Result<(
    Vec<plan::source::Planned>,
    crate::trace::select::Skipped,
    usize,
)> {
    trace.requests.sort_by_key(|r| r.arrival_us);
    let records = trace.requests.into_iter().map(Ok);
    let window = cfg.shaping.window_us;
    let selected = plan::source::Selected::new(records, cfg.trace_name(), cfg.select, window)?;
    let speed = cfg.speed.unwrap_or(1.0);
    let (mut sends, left_out, read) =
        plan::source::plan_whole(selected, trace.header, &cfg.shaping, speed)?;
    if let Some(line) = left_out.summary(read) {
        eprintln!("retrace: {line}");
    }
    if let Some(cut) = embedded_cut(cfg, embedded) {
        let n = sends.partition_point(|p| p.at_ns <= cut);
        say_embedded_cut(n, sends.len());
        sends.truncate(n);
    }
    check_span(sends.iter().map(|p| p.at_ns).max().unwrap_or(0))?;
    Ok((sends, left_out, read))
}

/// Refuses a schedule longer than [`MAX_SCHEDULE`].
fn check_span(span_ns: u64) -> anyhow::Result<()> {
    if span_ns > MAX_SCHEDULE.as_nanos() as u64 {
        anyhow::bail!(
            "the schedule would run for {:.0} days (more than {}): check --speed, --request-rate, --ramp-up and the trace's timestamps",
            span_ns as f64 / 86_400e9,
            MAX_SCHEDULE.as_secs() / 86_400
        );
    }
    Ok(())
}

/// The embedded target's default span message, when it cuts the plan.
fn say_embedded_cut(planned: usize, total: usize) {
    if planned < total {
        eprintln!(
            "retrace: embedded mock: replaying the first {planned} of {total} requests ({} s of the trace at real speed; give --limit or --speed to choose)",
            EMBEDDED_DEFAULT_SPAN.as_secs()
        );
    }
}

/// The plan, surveyed before the clock, and the body builder's source for it.
pub struct Planning {
    pub survey: plan::source::Survey,
    source: plan::source::Source,
    pub(crate) links: Option<plan::turns::Links>,
    pub(crate) left_out: crate::trace::select::Skipped,
    /// Records read from the trace, and malformed rows skipped (`--skip-bad`).
    pub(crate) read: usize,
    pub(crate) malformed: u64,
    pub(crate) block_size: u32,
    prompts: Prompts,
    /// The body options, without the model and the target's overheads yet.
    opts: BodyOptions,
}

impl Planning {
    /// The body builder's source.
    pub fn into_source(self) -> plan::source::Source {
        self.source
    }
}

/// How the trace is read: with `--block-size` tokens per hash id when given, so that every
/// record's hash ids are bounded by the block size the replay uses.
fn read_options(cfg: &Config) -> ImportOptions {
    ImportOptions {
        block_size: cfg.block_size,
        skip_bad: cfg.skip_bad,
        ..Default::default()
    }
}

/// Reads and plans the trace, streamed when the shaping allows and else whole ([`source`]),
/// and surveys the plan, checking that every planned request can be built; the source reads
/// it again for the body builder.
pub fn planning(cfg: &Config, embedded: bool) -> anyhow::Result<Planning> {
    let input = open_all(&cfg.trace, &read_options(cfg))?;
    let malformed = input.report.skipped;
    if malformed > 0 {
        let first = (input.report.bad.first()).map_or(String::new(), |(line, why)| {
            format!(" (the first at line {line}: {why})")
        });
        eprintln!(
            "retrace: {}: skipped {malformed} malformed rows (--skip-bad){first}",
            cfg.trace_name()
        );
    }
    let block_size = cfg.block_size.unwrap_or(input.header.block_size).max(1);
    let prompts = prompts(cfg, block_size)?;
    // The model and the target's overheads are filled in once the target is known.
    let opts = BodyOptions {
        api: cfg.api,
        model: String::new(),
        model_override: cfg.model.is_some(),
        extra_body: cfg.extra_body.clone(),
        keep_original_limits: cfg.keep_original_limits,
        overheads: Default::default(),
    };
    let theory = cfg.scrape_metrics.as_ref().map(|_| {
        use crate::trace::stats::{CacheSim, PREFIX_NODES};
        CacheSim::new(block_size, cfg.server_block_size, PREFIX_NODES)
    });
    let mut survey = plan::source::Survey::new(cfg.trace_name(), theory);
    let mut check = |p: &plan::source::Planned| survey.add(p, &opts, &prompts);
    let speed = cfg.speed.unwrap_or(1.0);
    if !plan::source::streams(&cfg.shaping, cfg.sessions) {
        let (sends, left_out, read) = plan_counted(cfg, input.collect_trace()?.0, embedded)?;
        let links = match cfg.sessions {
            true => Some(plan::turns::link(&sends, speed).map_err(anyhow::Error::msg)?),
            false => None,
        };
        sends.iter().try_for_each(&mut check)?;
        return Ok(Planning {
            survey,
            source: plan::source::from_sends(sends),
            links,
            left_out,
            read,
            malformed,
            block_size,
            prompts,
            opts,
        });
    }
    let name = cfg.trace_name();
    // The files opened above are the first read; each later one opens them again.
    let mut opened = Some(input);
    let mut selected = || -> anyhow::Result<_> {
        let input = match opened.take() {
            Some(i) => i,
            None => open_all(&cfg.trace, &read_options(cfg))?,
        };
        let window = cfg.shaping.window_us;
        Ok(plan::source::Selected::new(
            input,
            name.clone(),
            cfg.select,
            window,
        )?)
    };
    let retimed = match plan::source::needs_count(&cfg.shaping) {
        true => selected()?.try_fold(0, |n, r| r.map(|_| n + 1))?,
        false => 0,
    };
    let mut stage = || -> anyhow::Result<_> {
        Ok(plan::source::Stage::new(
            selected()?,
            &cfg.shaping,
            speed,
            retimed,
        )?)
    };
    let cut = embedded_cut(cfg, embedded);
    let mut first = stage()?;
    let mut total = 0;
    for p in &mut first {
        let p = p?;
        total += 1;
        if cut.is_none_or(|c| p.at_ns <= c) {
            check(&p)?;
        }
    }
    let (left_out, read) = first.into_inner().finish()?;
    if let Some(line) = left_out.summary(read) {
        eprintln!("retrace: {line}");
    }
    say_embedded_cut(survey.planned, total);
    check_span(survey.span_ns)?;
    let source = Box::new(stage()?.take(survey.planned));
    Ok(Planning {
        survey,
        source,
        links: None,
        left_out,
        read,
        malformed,
        block_size,
        prompts,
        opts,
    })
}

/// Runs a whole replay and renders it (async part of [`run`]; tests call it directly).
pub async fn replay(cfg: Config) -> anyhow::Result<Outcome> {
    replay_with(cfg, Arc::default()).await
}

/// [`replay`], which `halt` may halt.
pub(crate) async fn replay_with(cfg: Config, halt: Arc<driver::Halt>) -> anyhow::Result<Outcome> {
    let mut prepared = prepare(&cfg).await?;
    let ran = execute(&cfg, &mut prepared, halt).await?;
    if let Some(e) = prepared.embedded.take() {
        match ran.interrupted {
            None => e.handle.shutdown().await,
            // Its streams were cut: no graceful wait for them.
            Some(_) => drop(e),
        }
    }
    assemble(&cfg, &prepared, ran)
}

/// Everything made before the clock starts.
pub struct Prepared {
    embedded: Option<Embedded>,
    client: Arc<http::client::Client>,
    /// Planned sends.
    planned: usize,
    links: Option<plan::turns::Links>,
    /// The body builder's window (bodies are built during the run, ahead of the clock).
    bodies: Arc<plan::body::Window>,
    /// Planned sends that are not side requests (`--include-aux`).
    measured: usize,
    /// The trace holds recorded responses.
    recorded: bool,
    probe_bodies: Vec<BuiltRequest>,
    theory: scrape::Theory,
    /// `--scrape-metrics`' "before" point, taken before the warm connections were opened.
    scrape: Option<scrape::Before>,
    /// `--result-json`, opened before the run.
    result_file: std::sync::Mutex<Option<ResultFile>>,
    /// Where `--detailed` rows go (taken by the run).
    detail: Option<collect::Detail>,
    facts: RunFacts,
}

/// `--result-json`, opened before the run ([`crate::sys::partial`]), so that a path that cannot be
/// written fails before anything is sent and a run that uses up its open files still has its
/// file; a run that fails removes the partial file, and an old result stays whole.
struct ResultFile {
    partial: crate::sys::partial::Partial,
    file: std::fs::File,
    path: PathBuf,
}

impl ResultFile {
    fn open(path: &Path) -> anyhow::Result<ResultFile> {
        let (partial, file) = crate::sys::partial::Partial::create(path)
            .with_context(|| format!("--result-json {}: cannot write", path.display()))?;
        let path = path.to_path_buf();
        Ok(ResultFile {
            partial,
            file,
            path,
        })
    }

    fn write(mut self, text: &str) -> anyhow::Result<()> {
        let cannot = || format!("--result-json {}: cannot write", self.path.display());
        self.file.write_all(text.as_bytes()).with_context(cannot)?;
        self.partial.commit(self.file).with_context(cannot)
    }
}

/// What the result file says about the run besides its measurements.
pub(crate) struct RunFacts {
    target_url: String,
    model: String,
    speed: f64,
    block_size: u32,
    rx_stamp: &'static str,
    /// Reader threads and their batch window, when bodies are read on them.
    readers: Option<(usize, Duration)>,
    /// The one API every measured request used, or `mixed`.
    endpoint: String,
    /// `METHOD path` → requests sent.
    by_endpoint: std::collections::BTreeMap<String, u64>,
    /// Requests the selection left out, and why.
    left_out: crate::trace::select::Skipped,
    /// The selection in force (`text_prompts`: whether text prompts could be built).
    select: crate::trace::select::Selection,
    /// Workload left out (requests that cannot be rebuilt, malformed rows) and workload read.
    lost: (u64, u64),
    malformed: u64,
    /// What the target's tokenizer did, when it made the text prompts.
    target_text: Option<Arc<plan::servertext::TargetStats>>,
    /// How `--tokenizer`'s text prompts were fitted to the target ([`http::overhead::measure`]).
    tokenizer_fit: Option<String>,
}

/// Stage 1: reads, plans and surveys the trace, starts the embedded target when there is no
/// `--target`, starts the body builder and opens the connections (after any `--start-at` wait).
pub async fn prepare(cfg: &Config) -> anyhow::Result<Prepared> {
    let result_file = cfg
        .result_json
        .as_deref()
        .map(ResultFile::open)
        .transpose()?;
    let is_embedded = cfg.target.is_none();
    let mut planned = plan_apart(cfg.clone(), is_embedded).await?;
    nothing_to_send(cfg, &planned)?;
    let embedded = match is_embedded {
        false => None,
        true => Some(start_embedded_target().await?),
    };
    let target_url = cfg
        .target
        .clone()
        .or_else(|| embedded.as_ref().map(|e| e.url.clone()))
        .unwrap_or_default();
    let client = Arc::new(open_client(cfg, &target_url).await?);
    let model = model(cfg, embedded.as_ref(), &client).await?;
    let mut select = cfg.select;
    let mut target_text = None;
    if planned.survey.target_text > 0 {
        let n = planned.survey.target_text;
        match probe_target_text(cfg, &target_url, &model, planned.block_size).await {
            Ok(src) => {
                eprintln!("retrace: {n} synthesised text prompts are made by the target's /detokenize and counted by its /tokenize (exact as it counts them; --prompt-mode text --tokenizer FILE is faster)");
                target_text = Some(src.stats.clone());
                if let Prompts::Target { text, .. } = &mut planned.prompts {
                    *text = Some(Box::new(src));
                }
            }
            Err(why) if cfg.prompt_mode == PromptMode::Text => anyhow::bail!(
                "--prompt-mode text without --tokenizer: the target cannot make the text prompts ({why}); give --tokenizer FILE"
            ),
            Err(why) => {
                eprintln!("retrace: the target cannot make text prompts ({why}): chat requests recorded without a body are left out (give --prompt-mode text --tokenizer FILE for them)");
                select.text_prompts = false;
                let cfg = Config {
                    select,
                    ..cfg.clone()
                };
                planned = plan_apart(cfg.clone(), is_embedded).await?;
                nothing_to_send(&cfg, &planned)?;
            }
        }
    }
    let lost = lost_workload(&planned.left_out, planned.read, planned.malformed);
    let Planning {
        survey,
        source,
        links,
        left_out,
        malformed,
        block_size,
        prompts,
        opts,
        ..
    } = planned;
    // Only synthesised prompts (requests without a recorded body) are fitted to the target.
    let (overheads, tokenizer_fit) = match &prompts {
        Prompts::Text(tb) if survey.synthesised => {
            let (o, line) = http::overhead::measure(&client, &model, tb).await;
            eprintln!("retrace: {line}");
            (o, Some(line))
        }
        _ => Default::default(),
    };
    let body_opts = BodyOptions {
        model: model.clone(),
        overheads,
        ..opts
    };
    // Built apart from the runtime: a prompt from the target waits for its answers.
    let (body_opts, prompts, probe_bodies) = {
        let (max_hash_id, span_ns, rate) = (survey.max_hash_id, survey.span_ns, cfg.probe_rate);
        tokio::task::spawn_blocking(move || {
            let bodies = match rate {
                Some(rate) => probe_bodies(max_hash_id, span_ns, rate, &body_opts, &prompts),
                None => Ok(Vec::new()),
            };
            (body_opts, prompts, bodies)
        })
        .await
        .context("building the probes")?
    };
    let probe_bodies = probe_bodies?;
    let theory = scrape::Theory {
        server_block_size: cfg.server_block_size,
        hits: survey.theory.as_ref().map_or(0, |t| t.hits),
        queries: survey.theory.as_ref().map_or(0, |t| t.queries),
        lower_bound: survey.theory.as_ref().is_some_and(|t| t.full),
        hits_at: survey.theory.as_ref().map(|t| t.hits_at),
    };
    let detail = detail(cfg.result_json.as_deref(), cfg.detailed, survey.measured)?;
    let bodies = plan::body::Window::start(
        source,
        survey.planned,
        body_opts,
        prompts,
        cfg.tuning.window,
    )
    .context("starting the body builder thread")?;
    warn_before_the_run(cfg, survey.planned);
    wait_for_start_at(cfg).await;
    let scrape = match &cfg.scrape_metrics {
        Some(url) => Some(scrape_before(cfg, url.as_deref(), &client.target).await?),
        None => None,
    };
    warm(cfg, &client, survey.planned).await;
    let endpoint = survey.endpoint();
    let facts = RunFacts {
        target_url,
        model,
        speed: cfg.speed.unwrap_or(1.0),
        block_size,
        rx_stamp: client.pool.rx_stamp(),
        readers: client.pool.readers().map(|r| (r.len(), r.batch())),
        endpoint,
        by_endpoint: survey.by_endpoint,
        left_out,
        select,
        lost,
        malformed,
        target_text,
        tokenizer_fit,
    };
    Ok(Prepared {
        embedded,
        client,
        planned: survey.planned,
        links,
        bodies,
        measured: survey.measured,
        recorded: survey.recorded,
        probe_bodies,
        theory,
        scrape,
        result_file: std::sync::Mutex::new(result_file),
        detail: Some(detail),
        facts,
    })
}

/// [`planning`] on a blocking thread (it reads the trace).
async fn plan_apart(cfg: Config, embedded: bool) -> anyhow::Result<Planning> {
    tokio::task::spawn_blocking(move || planning(&cfg, embedded))
        .await
        .context("reading the trace")?
}

/// A plan with no send is [`NothingToSend`], saying why.
fn nothing_to_send(cfg: &Config, p: &Planning) -> anyhow::Result<()> {
    if p.survey.planned > 0 {
        return Ok(());
    }
    let malformed = match p.malformed {
        0 => String::new(),
        m => format!(" ({m} malformed rows skipped)"),
    };
    let why = match p.left_out.summary(p.read) {
        Some(line) => format!("{line}{malformed}"),
        None if p.read == 0 => format!("the trace holds no requests{malformed}"),
        None => "no request falls within the plan (check --window, --limit and --shard)".into(),
    };
    Err(NothingToSend(cfg.trace_name(), why).into())
}

/// The workload left out, and the workload: requests the replay cannot rebuild plus malformed
/// rows skipped, of the records read that are not side requests plus those rows.
fn lost_workload(
    left_out: &crate::trace::select::Skipped,
    read: usize,
    malformed: u64,
) -> (u64, u64) {
    let side = left_out.count(crate::trace::select::Skip::auxiliary);
    let lost = left_out.count(crate::trace::select::Skip::unrebuildable) + malformed;
    (lost, (read as u64).saturating_sub(side) + malformed)
}

/// Why the run is invalid for what it left out: more than [`MAX_LEFT_OUT_SHARE`] of the
/// workload.
fn left_out_reason((lost, workload): (u64, u64)) -> Option<String> {
    (workload > 0 && lost as f64 > MAX_LEFT_OUT_SHARE * workload as f64).then(|| {
        format!(
            "{lost} of {workload} workload requests left out ({:.1}%, more than {:.0}%; see left_out)",
            100.0 * lost as f64 / workload as f64,
            100.0 * MAX_LEFT_OUT_SHARE
        )
    })
}

/// Whether the target makes text prompts ([`plan::servertext::probe`]), through connections of its
/// own (the workload's stay free for the run).
async fn probe_target_text(
    cfg: &Config,
    url: &str,
    model: &str,
    block_size: u32,
) -> Result<plan::servertext::ServerText, String> {
    let target = http::target::Target::parse(url, cfg.headers.clone())?;
    let pool = http::pool::Pool::new(&target, cfg.target_ca.as_deref()).await?;
    let client = Arc::new(http::client::Client {
        pool,
        target,
        timeouts: cfg.timeouts,
    });
    plan::servertext::probe(client, model, block_size, cfg.seed).await
}

/// Where `--detailed` rows go: inline, or to the sidecar beside `--result-json` (opened now, so
/// that an unwritable path fails before the run) when more than [`crate::result::sidecar::THRESHOLD`]
/// requests are measured.
fn detail(
    result_json: Option<&std::path::Path>,
    detailed: bool,
    measured: usize,
) -> anyhow::Result<collect::Detail> {
    Ok(match (result_json, detailed) {
        (_, false) => collect::Detail::Off,
        (Some(r), true) if measured > crate::result::sidecar::THRESHOLD => {
            let path = crate::result::sidecar::path_for(r);
            let w = crate::result::sidecar::Writer::create(&path)
                .with_context(|| format!("--detailed: {}: cannot write", path.display()))?;
            collect::Detail::File(w)
        }
        (_, true) => collect::Detail::Inline(Vec::new()),
    })
}

impl Prepared {
    /// What the body builder did so far.
    pub fn builder_stats(&self) -> &plan::body::BuilderStats {
        &self.bodies.stats
    }
}

/// The model to send: `--model`, the embedded mock's, else the target's first.
async fn model(
    cfg: &Config,
    embedded: Option<&Embedded>,
    client: &http::client::Client,
) -> anyhow::Result<String> {
    match (&cfg.model, embedded) {
        (Some(m), _) => Ok(m.clone()),
        (None, Some(e)) => Ok(e.model.clone()),
        (None, None) => client
            .first_model()
            .await
            .map_err(|e| anyhow!("{e} (or give --model)")),
    }
}

/// The client for `target_url`: its pool, kernel stamps and reader threads as tuned, and one
/// connection opened to check that the target can be reached.
async fn open_client(cfg: &Config, target_url: &str) -> anyhow::Result<http::client::Client> {
    let target =
        http::target::Target::parse(target_url, cfg.headers.clone()).map_err(|e| anyhow!(e))?;
    let t = &cfg.tuning;
    let pool = http::pool::Pool::new(&target, cfg.target_ca.as_deref())
        .await
        .map_err(|e| anyhow!("--target {target_url}: {e}"))?
        .with_kernel_rx(t.kernel_rx)
        .with_readers(t.reader_threads, t.read_batch)
        .context("starting the reader threads")?;
    pool.reach().await.map_err(|e| {
        anyhow!(
            "--target {target_url}: the target could not be reached ({})",
            e.reason()
        )
    })?;
    Ok(http::client::Client {
        pool,
        target,
        timeouts: cfg.timeouts,
    })
}

/// How prompts are made: token ids from a vocabulary (the tokenizer's or a synthetic one), or
/// text that re-encodes to the trace's blocks; without a tokenizer, text from the target
/// ([`servertext`], probed once the target is known).
fn prompts(cfg: &Config, block_size: u32) -> anyhow::Result<Prompts> {
    let Some(p) = &cfg.tokenizer else {
        let v = Vocab::from_size(cfg.vocab_size)?;
        return Ok(Prompts::Target {
            tokens: Synth::new(v, block_size, cfg.seed),
            text: None,
            all_text: cfg.prompt_mode == PromptMode::Text,
        });
    };
    let tok = prompts::load_tokenizer(p)?;
    if cfg.prompt_mode == PromptMode::Text {
        let tb = TextBuilder::new(tok, block_size, cfg.seed).ok_or_else(|| {
            anyhow!("--tokenizer {}: fewer than 64 tokens decode to a plain space-led word; text prompts cannot be built exactly (use --prompt-mode token-ids)", p.display())
        })?;
        return Ok(Prompts::Text(Box::new(tb)));
    }
    let v = Vocab::from_tokenizer(&tok)
        .ok_or_else(|| anyhow!("--tokenizer {}: no usable tokens", p.display()))?;
    Ok(Prompts::Tokens(Synth::new(v, block_size, cfg.seed)))
}

/// Probe bodies: fresh hash ids above the trace's, built before the clock like the rest.
fn probe_bodies(
    max_hash_id: Option<u64>,
    span_ns: u64,
    rate: f64,
    opts: &BodyOptions,
    prompts: &Prompts,
) -> anyhow::Result<Vec<BuiltRequest>> {
    let base = max_hash_id.map_or(0, |m| m.saturating_add(1));
    let n = probe::bodies_needed(span_ns, rate, 100_000);
    (0..n as u64)
        .map(|k| {
            let r = crate::trace::Request {
                input_tokens: probe::PROBE_PROMPT_TOKENS,
                output_tokens: 1,
                hash_ids: vec![base.saturating_add(k)],
                ..Default::default()
            };
            http::request::build(&r, u64::MAX - k, opts, prompts)
                .map_err(|e| anyhow!("--probe-request-rate: building a probe: {e}"))
        })
        .collect()
}

fn warn_before_the_run(cfg: &Config, planned: usize) {
    if let Some(limit) = cfg.fd_limit {
        let streams = cfg.max_concurrency.unwrap_or(planned).min(planned) as u64;
        if streams + 64 > limit {
            eprintln!(
                "retrace: warning: up to {streams} streams may be in flight but the open-file limit is {limit}; requests beyond it fail as `connect` (raise it with `ulimit -n`, or give --max-concurrency)"
            );
        }
    }
}

/// `--start-at`: waits here, before opening connections (servers close idle keep-alives within
/// seconds), until shortly before t0.
async fn wait_for_start_at(cfg: &Config) {
    let Some(at) = cfg.start_at else { return };
    if let Ok(ahead) = at.duration_since(std::time::SystemTime::now()) {
        eprintln!(
            "retrace: --start-at: starting at {} (in {:.1} s)",
            plan::start::display(at),
            ahead.as_secs_f64()
        );
        tokio::time::sleep(ahead.saturating_sub(plan::start::WARM_LEAD)).await;
    }
}

/// Opens connections before the clock starts, a bounded number at a time.
async fn warm(cfg: &Config, client: &http::client::Client, planned: usize) {
    let warm = cfg
        .tuning
        .warm_connections
        .unwrap_or(cfg.max_concurrency.unwrap_or(128))
        .min(planned)
        .saturating_sub(1); // the one that checked the target is idle already
    if warm > 0 {
        let opened = client.pool.warm(warm, 32).await;
        if opened < warm {
            tracing::warn!("opened {opened} of {warm} warm connections");
        }
    }
}

/// What the clock-driven stage measured.
pub struct Ran {
    /// The finished requests, folded in (side requests apart).
    collected: collect::Collect,
    /// First dispatch to last completion, s.
    duration_s: f64,
    cpu_setup_s: f64,
    cpu_run_s: f64,
    /// Probes sent and their summary.
    probes: Option<(u64, serde_json::Value)>,
    server_metrics: Option<serde_json::Value>,
    embedded_target: bool,
    /// The signal that halted the run.
    interrupted: Option<Signal>,
}

/// Stage 2: starts the clock (after the first scrape, or at `--start-at`), drives the plan with
/// probes and scrapes beside it, and stops them when the last request ended.
pub async fn execute(
    cfg: &Config,
    p: &mut Prepared,
    halt: Arc<driver::Halt>,
) -> anyhow::Result<Ran> {
    let fixed = fixed_t0(cfg)?;
    let scraper = p
        .scrape
        .take()
        .map(|b| scrape::start(b, fixed, driver::START_LEAD));
    let t0 = match (&scraper, fixed) {
        (Some(s), _) => s.t0,
        (None, Some(t)) => t,
        (None, None) => Instant::now() + driver::START_LEAD,
    };
    let prober = cfg.probe_rate.map(|rate| {
        let bodies = Arc::new(p.probe_bodies.clone());
        probe::start(rate, bodies, p.client.clone(), t0)
    });
    // The process's CPU time before the clock (trace, bodies, connections) and during the run.
    let cpu_setup_s = process_cpu_s();
    p.bodies.set_t0(t0);
    let detail = p.detail.take().unwrap_or(collect::Detail::Off);
    let mut collected = collect::Collect::new(p.recorded, p.measured, detail, collector(cfg, p));
    halt.enter(driver::Phase::Running);
    let driven = drive(cfg, p, t0, &mut collected, halt.clone()).await;
    halt.enter(driver::Phase::Ended);
    let interrupted = halt.by();
    p.bodies.stop();
    let duration_s = driven.map_err(|e| anyhow!("{}: {e}", cfg.trace_name()))?;
    let inexact = p
        .bodies
        .stats
        .inexact
        .load(std::sync::atomic::Ordering::Relaxed);
    if inexact > 0 {
        eprintln!("retrace: warning: {inexact} text prompts do not re-encode to exactly their token blocks (lengths/prefixes approximate)");
    }
    let cpu_run_s = process_cpu_s() - cpu_setup_s;
    let probes = match (prober, cfg.probe_rate) {
        (Some(pr), Some(rate)) => {
            let samples = pr.finish().await;
            let ps = median_p99_and(&cfg.percentiles);
            let summary = probe::summarize(rate, &samples, duration_s, &ps);
            Some((samples.len() as u64, summary))
        }
        _ => None,
    };
    let server_metrics = match scraper {
        Some(s) => {
            let series = s.finish().await;
            // Probes reach the server's counters too (fresh prompts: queries, never hits).
            let sent = probes.as_ref().map_or(0, |p| p.0);
            let theory = scrape::Theory {
                queries: p.theory.queries + sent * probe::PROBE_PROMPT_TOKENS,
                ..p.theory
            };
            Some(scrape::summarize(&series, &theory))
        }
        None => None,
    };
    Ok(Ran {
        collected,
        duration_s,
        cpu_setup_s,
        cpu_run_s,
        probes,
        server_metrics,
        embedded_target: p.embedded.is_some(),
        interrupted,
    })
}

/// The plan driven from `t0`, each finished request folded into `collected`, with a progress bar
/// on a terminal; the run's duration (s), or why the body builder failed.
async fn drive(
    cfg: &Config,
    p: &Prepared,
    t0: Instant,
    collected: &mut collect::Collect,
    halt: Arc<driver::Halt>,
) -> Result<f64, String> {
    let bar = progress_bar(cfg, p.planned);
    let opts = driver::DriveOptions {
        max_concurrency: cfg.max_concurrency,
        links: p.links.clone(),
        t0: Some(t0),
        halt,
    };
    let mut failed = 0u64;
    let driven = driver::drive(
        p.planned,
        p.bodies.clone(),
        p.client.clone(),
        opts,
        |_, tag, s| {
            if let Some(pb) = &bar {
                if !s.ok() {
                    failed += 1;
                    pb.set_message(format!("({failed} failed)"));
                }
                pb.inc(1);
            }
            collected.add(tag, s);
        },
    )
    .await;
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    Ok(driven?.duration_s)
}

fn progress_bar(cfg: &Config, n: usize) -> Option<indicatif::ProgressBar> {
    if !cfg.progress {
        return None;
    }
    let pb = indicatif::ProgressBar::new(n as u64);
    pb.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{elapsed_precise} [{bar:40}] {pos}/{len} requests {msg}",
    ) {
        pb.set_style(style);
    }
    Some(pb)
}

/// `--scrape-metrics`: `url`, else the target's own `/metrics` (with the target's headers); the
/// "before" point.
async fn scrape_before(
    cfg: &Config,
    url: Option<&str>,
    target: &http::target::Target,
) -> anyhow::Result<scrape::Before> {
    let (url, headers) = match url {
        Some(u) => (u.to_string(), HeaderMap::new()),
        None => {
            let scheme = if target.tls { "https" } else { "http" };
            let url = format!("{scheme}://{}/metrics", target.authority);
            (url, target.headers.clone())
        }
    };
    let st = scrape::ScrapeTarget::new(&url, headers, cfg.target_ca.as_deref())
        .await
        .map_err(anyhow::Error::msg)?;
    Ok(scrape::before(st).await)
}

/// What the run keeps of its workload's requests: every statistic exact up to the bounds;
/// `--sessions` reports on every request's scalars, so it holds them all.
fn collector(cfg: &Config, p: &Prepared) -> metrics::Collector {
    let scalar_bound = match p.links {
        Some(_) => usize::MAX,
        None => metrics::SCALAR_BOUND,
    };
    metrics::Collector::new(metrics::ITL_BOUND, scalar_bound, cfg.slo)
}

/// Stage 3: the summary, validity, the result file and the console report.
pub fn assemble(cfg: &Config, p: &Prepared, mut ran: Ran) -> anyhow::Result<Outcome> {
    let work = &ran.collected.work;
    let duration_s = ran.duration_s;
    let summary = work.summary(duration_s, &cfg.percentiles);
    let kind = metrics::Failure::Interrupted.as_str();
    let cut = summary.errors.get(kind.as_ref()).copied().unwrap_or(0);
    let reasons = [
        ran.interrupted
            .map(|s| interrupted_reason(s, work.requests(), cut, p.measured)),
        invalid_reason(cfg, work),
        left_out_reason(p.facts.lost),
    ];
    let reasons: Vec<String> = reasons.into_iter().flatten().collect();
    let invalid_reason = (!reasons.is_empty()).then(|| reasons.join("; "));
    let held = work.held().unwrap_or_default();
    let sessions = p
        .links
        .as_ref()
        .map(|l| plan::turns::report(l, &l.at_ns, held, &median_p99_and(&cfg.percentiles)));
    // Requests that failed as recorded, or were cut where the client cancelled them, are what
    // was asked, and those the halt cut are not the target's: a run of only those has not
    // failed.
    let same = ran
        .collected
        .recorded
        .as_ref()
        .map_or(0, |r| r.same + r.cancelled_as_recorded);
    let all_failed = outcome::all_failed(work.requests(), summary.completed, same + cut);
    let arrays = ran.collected.finish(ran.interrupted.is_none())?;
    let inexact = p
        .bodies
        .stats
        .inexact
        .load(std::sync::atomic::Ordering::Relaxed);
    let info = run_info(cfg, &p.facts, inexact, invalid_reason.clone());
    let mut r = result_of(cfg, p, &ran, &info, &summary);
    r.detailed = arrays.inline;
    r.requests_file = arrays.file;
    r.sessions = sessions.as_ref().map(|s| s.to_json());
    let result = r.to_value();
    let file = p
        .result_file
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some(f) = file {
        f.write(&serde_json::to_string_pretty(&result)?)?;
    }
    let verdict = (invalid_reason.as_deref(), all_failed);
    let report = console_report(cfg, p, &ran, &info, &summary, sessions.as_ref(), verdict);
    Ok(Outcome {
        summary,
        result,
        report,
        valid: invalid_reason.is_none(),
        all_failed,
        sessions,
        interrupted: ran.interrupted,
    })
}

/// The console report: vLLM's block, ours, then each optional section and the verdict (why the
/// run is invalid, whether every request failed).
fn console_report(
    cfg: &Config,
    p: &Prepared,
    ran: &Ran,
    info: &crate::result::RunInfo,
    summary: &metrics::Summary,
    sessions: Option<&plan::turns::SessionReport>,
    (invalid_reason, all_failed): (Option<&str>, bool),
) -> String {
    let firsts = &ran.collected.first_errors;
    let probes = ran.probes.as_ref().map(|(_, p)| p);
    let mut report = console::vllm_block(summary, info, probes);
    let late = p
        .bodies
        .stats
        .late
        .load(std::sync::atomic::Ordering::Relaxed);
    report.push_str(&console::extra_sections(
        summary,
        cfg.max_drift_ms,
        firsts,
        late,
    ));
    let recorded = ran.collected.recorded.as_ref();
    report.push_str(&outcome::console(recorded, &ran.collected.aux));
    if let Some(r) = sessions {
        report.push_str(&console::sessions_section(r));
    }
    if let Some(sm) = &ran.server_metrics {
        report.push_str(&console::server_metrics_section(sm));
    }
    if let Some((_, p)) = &ran.probes {
        report.push_str(&console::probes_section(p));
    }
    if let Some(r) = invalid_reason {
        report.push_str(&format!("RUN INVALID: {r}\n"));
    }
    if all_failed {
        let n = ran.collected.work.requests();
        report.push_str(&format!(
            "RUN FAILED: all {n} requests failed (exit {EXIT_ALL_FAILED})\n"
        ));
    }
    report
}

/// The result file of the run (without its sessions section).
fn result_of(
    cfg: &Config,
    p: &Prepared,
    ran: &Ran,
    info: &crate::result::RunInfo,
    summary: &metrics::Summary,
) -> crate::result::ReplayResult {
    let (facts, work) = (&p.facts, &ran.collected.work);
    let n = work.requests() as usize;
    let mut r = crate::result::ReplayResult::new(info, summary, work.histograms(), n);
    r.server_metrics = ran.server_metrics.clone();
    r.probes = ran.probes.as_ref().map(|p| p.1.clone());
    r.run = Some(crate::result::RunExtras {
        start_at: cfg.start_at.map(plan::start::display),
        rx_stamp: facts.rx_stamp,
        body_readers: facts
            .readers
            .map(|(threads, batch)| crate::result::BodyReaders {
                threads,
                batch_us: batch.as_micros() as u64,
            }),
        client_cpu: crate::result::ClientCpu {
            setup_s: ran.cpu_setup_s,
            run_s: ran.cpu_run_s,
            embedded_target: ran.embedded_target,
        },
        body_builder: body_builder(cfg, &p.bodies.stats),
    });
    let recorded = ran.collected.recorded.as_ref();
    r.selected = Some(crate::result::SentOfRecording {
        selection: serde_json::json!(facts.select),
        left_out: serde_json::json!(facts.left_out.by_name()),
        left_out_workload: serde_json::json!({
            "left_out": facts.lost.0,
            "workload": facts.lost.1,
            "share": match facts.lost.1 {
                0 => 0.0,
                w => facts.lost.0 as f64 / w as f64,
            },
            "malformed_rows": facts.malformed,
            "limit": MAX_LEFT_OUT_SHARE,
        }),
        target_text: facts.target_text.as_ref().map(|t| t.to_json()),
        tokenizer_fit: facts.tokenizer_fit.clone(),
        requests_by_endpoint: facts.by_endpoint.clone(),
        auxiliary: ran.collected.aux.to_json(),
        recorded_outcomes: recorded.map(outcome::RecordedOutcomes::to_json),
        cancelled_as_recorded: recorded.map(outcome::RecordedOutcomes::cancelled_json),
    });
    r
}

fn body_builder(cfg: &Config, st: &plan::body::BuilderStats) -> crate::result::BodyBuilder {
    use std::sync::atomic::Ordering::Relaxed;
    let lead = st.min_lead_ns.load(Relaxed);
    crate::result::BodyBuilder {
        lead_s: cfg.tuning.window.lead.as_secs_f64(),
        window_mib: cfg.tuning.window.max_bytes as f64 / (1 << 20) as f64,
        late: st.late.load(Relaxed),
        min_lead_ms: (lead != i64::MAX).then(|| lead as f64 / 1e6),
        peak_bytes: st.peak_live_bytes.load(Relaxed) as u64,
    }
}

/// Why a halted run is invalid: `signal` stopped it with `measured` of the `planned` workload
/// requests in the result, `cut` of them cut in flight or not sent.
fn interrupted_reason(signal: Signal, measured: u64, cut: u64, planned: usize) -> String {
    format!(
        "interrupted by {signal}: {measured} of {planned} planned requests measured ({cut} of them cut in flight or not sent, error kind `{}`)",
        metrics::Failure::Interrupted
    )
}

/// Why the run is invalid: its p99 send drift exceeded `--max-drift-ms`.
fn invalid_reason(cfg: &Config, work: &metrics::Collector) -> Option<String> {
    let drift_p99 = work.drift(&[99.0]).percentiles[0].1;
    match cfg.max_drift_ms {
        Some(d) if drift_p99 > d => Some(format!(
            "p99 send drift {drift_p99:.3} ms exceeds --max-drift-ms {d}"
        )),
        _ => None,
    }
}

fn run_info(
    cfg: &Config,
    facts: &RunFacts,
    inexact: u64,
    invalid_reason: Option<String>,
) -> crate::result::RunInfo {
    crate::result::RunInfo {
        date: now_utc_compact(),
        trace: cfg.trace_name(),
        target: match cfg.target {
            Some(_) => facts.target_url.clone(),
            None => "embedded-mock".into(),
        },
        model: facts.model.clone(),
        endpoint: facts.endpoint.clone(),
        tokenizer_id: cfg.tokenizer.as_ref().map(|p| p.display().to_string()),
        label: None,
        traffic: crate::result::Traffic::of(cfg.shaping.arrivals.as_ref()),
        speed: facts.speed,
        max_concurrency: cfg.max_concurrency,
        seed: cfg.seed,
        block_size: facts.block_size,
        prompt_mode: match cfg.prompt_mode {
            PromptMode::TokenIds => "token-ids".into(),
            PromptMode::Text => "text".into(),
        },
        drift_limit_ms: cfg.max_drift_ms,
        shard: cfg.shaping.shard.map(|(i, n)| format!("{i}/{n}")),
        valid: invalid_reason.is_none(),
        invalid_reason,
        inexact_prompts: inexact,
    }
}

/// User + system CPU time of this process so far, seconds (0 where unknown).
fn process_cpu_s() -> f64 {
    #[cfg(unix)]
    // SAFETY: getrusage writes one rusage struct to a valid pointer.
    unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut r) == 0 {
            let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
            return tv(r.ru_utime) + tv(r.ru_stime);
        }
    }
    0.0
}

/// Percentiles of our own sections (sessions, probes): 50 and 99 always, then `--percentiles`.
fn median_p99_and(percentiles: &[f64]) -> Vec<f64> {
    let mut ps = vec![50.0, 99.0];
    for p in percentiles {
        if !ps.contains(p) {
            ps.push(*p);
        }
    }
    ps
}

/// `--start-at` on the monotonic clock, read now (an error when setup ran past it).
fn fixed_t0(cfg: &Config) -> anyhow::Result<Option<std::time::Instant>> {
    match cfg.start_at {
        None => Ok(None),
        Some(at) => Ok(Some(
            plan::start::t0_for(at, std::time::SystemTime::now(), std::time::Instant::now())
                .map_err(anyhow::Error::msg)?,
        )),
    }
}

/// vLLM's `date` format (`20260101-120000`), in UTC.
fn now_utc_compact() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|d| d.format("%Y%m%d-%H%M%S").to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Side requests are not workload; requests that cannot be rebuilt and malformed rows are
    /// workload left out; the user's own --skip-recorded-failures is neither.
    #[test]
    fn the_left_out_share_counts_workload_only() {
        use crate::trace::select::{Skip, Skipped};
        let left_out = Skipped(
            [
                (Skip::Auxiliary, 50),
                (Skip::RecordedFailure, 5),
                (Skip::ChatWithoutTokenizer, 8),
                (Skip::EmptyPrompt, 1),
            ]
            .into_iter()
            .collect(),
        );
        assert_eq!(lost_workload(&left_out, 150, 1), (10, 101));
        assert_eq!(left_out_reason((10, 101)), None);
        let why = left_out_reason((11, 101)).unwrap_or_default();
        assert!(
            why.starts_with("11 of 101 workload requests left out (10.9%"),
            "{why}"
        );
        assert_eq!(left_out_reason((10, 100)), None);
        assert!(left_out_reason((11, 100)).is_some());
        assert_eq!(left_out_reason((0, 0)), None);
    }

    /// `--detailed` keeps its arrays inline up to the threshold; above it the sidecar beside
    /// `--result-json` is opened before the run (removed when the run is abandoned; an
    /// unwritable one fails at once); without a result file they stay inline.
    #[test]
    fn detailed_rows_go_to_the_sidecar_above_the_threshold() {
        use collect::Detail;
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path().join("run.json");
        let r = Some(r.as_path());
        let over = crate::result::sidecar::THRESHOLD + 1;
        assert!(matches!(
            detail(r, true, crate::result::sidecar::THRESHOLD),
            Ok(Detail::Inline(_))
        ));
        let d = detail(r, true, over).unwrap();
        assert!(matches!(d, Detail::File(_)));
        let partial = dir.path().join("run.requests.jsonl.partial");
        assert!(partial.exists());
        drop(d);
        assert!(!partial.exists(), "an abandoned run leaves no partial file");
        assert!(matches!(detail(None, true, over), Ok(Detail::Inline(_))));
        assert!(matches!(detail(r, false, over), Ok(Detail::Off)));
        let bad = std::path::Path::new("/nonexistent/dir/run.json");
        let e = detail(Some(bad), true, over).err().unwrap().to_string();
        assert!(
            e.contains("run.requests.jsonl") && e.contains("cannot write"),
            "{e}"
        );
    }
}
