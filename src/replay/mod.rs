//! `retrace replay`: re-issue a trace against an OpenAI-compatible server at its own timing.
//!
//! The pipeline, each step its own module: [`Config::from_args`] validates the command line (every
//! error names its flag); the trace is read with [`crate::trace::import`]; [`schedule::plan`]
//! (pure) decides what is sent when; [`request::build`] makes every body before the clock starts;
//! [`driver::drive`] releases requests at absolute deadlines and [`client::execute`] turns each
//! into a [`crate::metrics::Sample`]; [`crate::metrics::summarize`] computes vLLM-exact statistics;
//! [`console`] renders them and [`result`] writes the result file. Without `--target`, the
//! embedded simulated engine is started on a loopback port (see [`start_embedded_target`]).
//! A failed request is data; only a broken setup (bad flag, unreadable trace, unreachable
//! target for the model list) is an error.

pub mod client;
pub mod console;
pub mod driver;
pub mod h1client;
pub mod outcome;
pub mod pool;
pub mod probe;
pub mod reader;
pub mod request;
pub mod result;
pub mod schedule;
pub mod scrape;
pub mod sessions;
pub mod shaping;
pub mod start;

use crate::cli::{EndpointArg, PromptModeArg, ReplayArgs};
use crate::metrics::{self, Api, Histograms};
use crate::synth::{self, Synth, TextBuilder, Vocab};
use crate::trace::import::{read_path, ImportOptions};
use anyhow::{anyhow, bail, Context};
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use request::{BodyOptions, PromptMode, Prompts};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Exit status of a run whose p99 drift exceeded `--max-drift-ms`.
pub const EXIT_INVALID: u8 = 3;

/// Default vocabulary size without a tokenizer.
pub const DEFAULT_VOCAB: u32 = 4096;

/// With the embedded target and neither `--speed` nor `--limit`, only the requests of this first
/// stretch of the trace are replayed, at real speed, so the run takes about a minute.
pub const EMBEDDED_DEFAULT_SPAN: Duration = Duration::from_secs(45);

/// A validated replay configuration.
#[derive(Debug)]
pub struct Config {
    pub trace: PathBuf,
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
    pub timeouts: client::Timeouts,
    /// Dispatcher thread under SCHED_FIFO.
    pub realtime: bool,
    /// `--spin-us`: the dispatcher's fixed spin window (`None` = adaptive).
    pub spin: Option<std::time::Duration>,
    /// Connections opened before the clock starts (`None` = default rule, see the CLI help).
    pub warm_connections: Option<usize>,
    /// `--http-client`.
    pub http_client: pool::HttpClient,
    /// `--rx-stamp kernel`: the own client's events are stamped when they reached this host.
    pub kernel_rx: bool,
    /// `--reader-threads`, resolved (0 = bodies read on the tasks).
    pub reader_threads: usize,
    /// `--read-batch-us`.
    pub read_batch: std::time::Duration,
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
    /// `--scrape-metrics`: `Some(None)` = the target's /metrics, `Some(Some(url))` = that URL.
    pub scrape_metrics: Option<Option<String>>,
    /// `--server-block-size`, tokens.
    pub server_block_size: u32,
    /// `--probe-request-rate`, probes per second.
    pub probe_rate: Option<f64>,
    /// `--start-at`: the wall-clock instant of t0.
    pub start_at: Option<std::time::SystemTime>,
}

fn positive(flag: &str, v: f64) -> anyhow::Result<f64> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        bail!("{flag} {v}: must be a positive number")
    }
}

impl Config {
    /// Validates the command line; every error names the flag.
    pub fn from_args(a: ReplayArgs) -> anyhow::Result<Config> {
        if let Some(s) = a.speed {
            positive("--speed", s)?;
        }
        if a.max_concurrency == Some(0) {
            bail!("--max-concurrency 0: must be at least 1");
        }
        if a.block_size == Some(0) {
            bail!("--block-size 0: must be at least 1");
        }
        if a.server_block_size == 0 {
            bail!("--server-block-size 0: must be at least 1");
        }
        if let Some(Some(u)) = &a.scrape_metrics {
            if !u.starts_with("http://") {
                bail!(
                    "--scrape-metrics={u}: give an http:// URL, like http://127.0.0.1:8000/metrics"
                );
            }
        }
        if let Some(d) = a.max_drift_ms {
            if !(d.is_finite() && d >= 0.0) {
                bail!("--max-drift-ms {d}: must be a non-negative number");
            }
        }
        let percentiles = a
            .percentiles
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| {
                s.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=100.0).contains(p))
                    .ok_or_else(|| {
                        anyhow!(
                            "--percentiles {:?}: {s:?} is not a number in 0..=100",
                            a.percentiles
                        )
                    })
            })
            .collect::<anyhow::Result<Vec<f64>>>()?;
        let mut slo = metrics::Slo::default();
        for item in &a.goodput {
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
        let prompt_mode = match a.prompt_mode {
            PromptModeArg::TokenIds => PromptMode::TokenIds,
            PromptModeArg::Text => PromptMode::Text,
        };
        let api = a.endpoint.map(|e| match e {
            EndpointArg::Completions => Api::Completions,
            EndpointArg::Chat => Api::Chat,
        });
        if prompt_mode == PromptMode::Text && a.tokenizer.is_none() {
            bail!(
                "--prompt-mode text needs --tokenizer (text must re-encode to the trace's blocks)"
            );
        }
        if api == Some(Api::Chat) && prompt_mode == PromptMode::TokenIds {
            bail!("--endpoint chat sends text: add --prompt-mode text and --tokenizer FILE");
        }
        let mut headers = HeaderMap::new();
        for h in &a.header {
            let (k, v) = client::parse_header(h).map_err(|e| anyhow!(e))?;
            headers.append(k, v);
        }
        if let Some(var) = &a.api_key_env {
            let key = std::env::var(var).map_err(|_| {
                anyhow!("--api-key-env {var}: environment variable {var} is not set")
            })?;
            let mut v = HeaderValue::from_str(&format!("Bearer {}", key.trim()))
                .map_err(|_| anyhow!("--api-key-env {var}: the key is not a valid header value"))?;
            v.set_sensitive(true);
            headers.insert(AUTHORIZATION, v);
        }
        let extra_body = match &a.extra_body {
            None => serde_json::Map::new(),
            Some(s) => match serde_json::from_str::<serde_json::Value>(s) {
                Ok(serde_json::Value::Object(m)) => m,
                Ok(_) => bail!("--extra-body: must be a JSON object, like '{{\"temperature\":0}}'"),
                Err(e) => bail!("--extra-body: not JSON: {e}"),
            },
        };
        let shaping = shaping::Shaping::from_flags(&shaping::ShapingFlags {
            window: a.window.as_deref(),
            loops: a.loop_count,
            overlay: a.overlay,
            overlay_distinct: a.overlay_distinct,
            max_gap: a.max_gap.as_deref(),
            request_rate: a.request_rate,
            burstiness: a.burstiness,
            ramp_up: a.ramp_up.as_deref(),
            ramp_up_start_rps: a.ramp_up_start_rps,
            ramp_up_end_rps: a.ramp_up_end_rps,
            shard: a.shard.as_deref(),
            seed: a.seed,
        })
        .map_err(anyhow::Error::msg)?;
        Ok(Config {
            shaping,
            dry_run: a.dry_run,
            sessions: a.sessions,
            scrape_metrics: a.scrape_metrics,
            server_block_size: a.server_block_size,
            probe_rate: match a.probe_request_rate {
                Some(r) => Some(positive("--probe-request-rate", r)?),
                None => None,
            },
            start_at: match &a.start_at {
                Some(t) => Some(
                    start::parse(t, std::time::SystemTime::now()).map_err(anyhow::Error::msg)?,
                ),
                None => None,
            },
            trace: a.trace,
            target: a.target,
            target_ca: a.target_ca,
            model: a.model,
            api,
            select: crate::trace::select::Selection {
                include_aux: a.include_aux,
                skip_recorded_failures: a.skip_recorded_failures,
                text_prompts: prompt_mode == PromptMode::Text,
            },
            speed: a.speed,
            limit: a.limit,
            max_concurrency: a.max_concurrency,
            block_size: a.block_size,
            tokenizer: a.tokenizer,
            vocab_size: a.vocab_size.unwrap_or(DEFAULT_VOCAB),
            prompt_mode,
            seed: a.seed,
            result_json: a.result_json,
            detailed: a.detailed,
            headers,
            extra_body,
            max_drift_ms: a.max_drift_ms,
            percentiles,
            slo,
            keep_original_limits: a.keep_original_limits,
            timeouts: client::Timeouts {
                idle: Duration::from_secs_f64(positive("--idle-timeout-s", a.idle_timeout_s)?),
                total: Duration::from_secs_f64(positive("--timeout-s", a.timeout_s)?),
            },
            warm_connections: a.warm_connections,
            http_client: match a.http_client.as_str() {
                "own" => pool::HttpClient::Own,
                "hyper" => pool::HttpClient::Hyper,
                other => bail!("--http-client {other:?}: give own or hyper"),
            },
            reader_threads: match a.reader_threads.as_str() {
                "auto" => std::thread::available_parallelism().map_or(1, |n| n.get().min(4)),
                n => match n.parse::<usize>() {
                    Ok(v) if v <= 64 => v,
                    _ => {
                        bail!("--reader-threads {n:?}: give a number of threads (0 to 64) or auto")
                    }
                },
            },
            read_batch: match a.read_batch_us {
                us if us <= 5_000 => std::time::Duration::from_micros(us),
                us => bail!("--read-batch-us {us}: at most 5000 (5 ms)"),
            },
            kernel_rx: match a.rx_stamp.as_str() {
                "kernel" => true,
                "read" => false,
                other => bail!("--rx-stamp {other:?}: give kernel or read"),
            },
            realtime: a.realtime,
            spin: match a.spin_us.as_str() {
                "auto" => None,
                us => match us.parse::<u64>() {
                    Ok(v) if v <= 100_000 => Some(std::time::Duration::from_micros(v)),
                    _ => bail!(
                        "--spin-us {us:?}: give auto or a number of microseconds up to 100000"
                    ),
                },
            },
            progress: std::io::stderr().is_terminal(),
            fd_limit: None,
        })
    }
}

/// What a finished replay produced.
pub struct Outcome {
    pub summary: metrics::Summary,
    pub result: serde_json::Value,
    /// Console report (vLLM block + ours).
    pub report: String,
    pub valid: bool,
    /// `--sessions`: how the session-ordered replay went.
    pub sessions: Option<sessions::SessionReport>,
}

/// Entry point of `retrace replay`.
pub fn run(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let report_html = args.report_html.clone();
    let cfg = Config::from_args(args)?;
    if cfg.dry_run {
        let (trace, _) = read_path(&cfg.trace, &ImportOptions::default())?;
        let (trace, plan, _) = prepare(&cfg, trace, cfg.target.is_none())?;
        let sends: Vec<(u64, u64, u64)> = plan
            .iter()
            .map(|p| {
                let r = &trace.requests[p.index];
                (p.at_ns, r.input_tokens, r.output_tokens)
            })
            .collect();
        print!("{}", shaping::dry_run_summary(&sends));
        if cfg.sessions {
            let l = sessions::link(&trace, &plan, cfg.speed.unwrap_or(1.0))
                .map_err(anyhow::Error::msg)?;
            let dependent = l.pred.iter().filter(|p| p.is_some()).count();
            println!(
                "sessions: {} sessions; {dependent} turns wait for their previous turn + think time (their send times depend on the server)",
                l.sessions
            );
        }
        if let Some(rate) = cfg.probe_rate {
            let n = probe::bodies_needed(schedule::span_ns(&plan), rate, usize::MAX) - 1;
            println!(
                "probes: {rate}/s, about {n} over the planned span (more if the run outlasts it)"
            );
        }
        if let Some(at) = cfg.start_at {
            println!("start at: {}", start::display(at));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let fds = raise_fd_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let out = rt.block_on(replay(Config {
        fd_limit: fds,
        ..cfg
    }))?;
    crate::report::write_replay_report(report_html.as_deref(), &out.result)?;
    print!("{}", out.report);
    Ok(if out.valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_INVALID)
    })
}

/// A running embedded target; shut down after the run.
pub struct Embedded {
    pub url: String,
    pub model: String,
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
pub async fn start_embedded_target() -> anyhow::Result<Embedded> {
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

/// `METHOD path` → requests sent (the result's `requests_by_endpoint`).
fn requests_by_endpoint(
    built: &[request::BuiltRequest],
) -> std::collections::BTreeMap<String, u64> {
    let mut m = std::collections::BTreeMap::new();
    for b in built {
        *m.entry(format!("{} {}", b.method, b.path)).or_default() += 1;
    }
    m
}

/// The result's `endpoint`: the one API every measured request used, or `mixed`.
fn endpoint_label(built: &[request::BuiltRequest]) -> String {
    let name = |b: &request::BuiltRequest| match b.api {
        Api::Completions => "completions",
        Api::Chat => "chat",
    };
    match built.first().map(name) {
        Some(first) if built.iter().all(|b| name(b) == first) => first.into(),
        Some(_) => "mixed".into(),
        None => "completions".into(),
    }
}

/// Shapes the trace and plans its sends. With the embedded target and neither `--limit` nor
/// `--speed`, only the first [`EMBEDDED_DEFAULT_SPAN`] of the (shaped) trace is planned.
pub fn prepare(
    cfg: &Config,
    mut trace: crate::trace::Trace,
    embedded: bool,
) -> anyhow::Result<(
    crate::trace::Trace,
    Vec<schedule::PlannedSend>,
    crate::trace::select::Skipped,
)> {
    let before = trace.requests.len();
    let left_out = crate::trace::select::select(&mut trace, &cfg.select);
    if let Some(line) = left_out.summary(before) {
        eprintln!("retrace: {line}");
    }
    let origin = cfg.shaping.apply(&mut trace).map_err(anyhow::Error::msg)?;
    let speed = cfg.speed.unwrap_or(1.0);
    let limit = match (cfg.limit, cfg.speed, embedded) {
        (None, None, true) => {
            let mut arrivals: Vec<u64> = trace.requests.iter().map(|r| r.arrival_us).collect();
            arrivals.sort_unstable();
            let span = EMBEDDED_DEFAULT_SPAN.as_micros() as u64;
            let n = arrivals.iter().take_while(|&&a| a - origin <= span).count();
            if n < arrivals.len() {
                eprintln!(
                    "retrace: embedded mock: replaying the first {n} of {} requests ({} s of the trace at real speed; give --limit or --speed to choose)",
                    arrivals.len(),
                    EMBEDDED_DEFAULT_SPAN.as_secs()
                );
            }
            Some(n)
        }
        (l, _, _) => l,
    };
    let plan = schedule::plan(
        &trace,
        &schedule::ScheduleOptions {
            speed,
            limit,
            origin_us: Some(origin),
        },
    );
    Ok((trace, plan, left_out))
}

/// Runs a whole replay and renders it (async part of [`run`]; tests call it directly).
pub async fn replay(cfg: Config) -> anyhow::Result<Outcome> {
    let (trace, report) = {
        let path = cfg.trace.clone();
        tokio::task::spawn_blocking(move || read_path(&path, &ImportOptions::default()))
            .await
            .context("reading the trace")??
    };
    if report.skipped > 0 {
        tracing::warn!(
            "{}: skipped {} malformed rows",
            cfg.trace.display(),
            report.skipped
        );
    }
    let embedded = match &cfg.target {
        Some(_) => None,
        None => Some(start_embedded_target().await?),
    };
    let target_url = cfg
        .target
        .clone()
        .or_else(|| embedded.as_ref().map(|e| e.url.clone()))
        .unwrap_or_default();
    let target =
        Arc::new(client::Target::parse(&target_url, cfg.headers.clone()).map_err(|e| anyhow!(e))?);
    let http = Arc::new(
        pool::Pool::new(&target, cfg.target_ca.as_deref())
            .await
            .map_err(|e| anyhow!("--target {target_url}: {e}"))?
            .with_client(cfg.http_client)
            .with_kernel_rx(cfg.kernel_rx)
            .with_readers(cfg.reader_threads, cfg.read_batch)
            .context("starting the reader threads")?,
    );
    let rx_stamp = http.rx_stamp();
    let readers = http.readers().map(|r| (r.len(), r.batch()));
    let model = match (&cfg.model, &embedded) {
        (Some(m), _) => m.clone(),
        (None, Some(e)) => e.model.clone(),
        (None, None) => client::first_model(&http, &target)
            .await
            .map_err(|e| anyhow!("{e} (or give --model)"))?,
    };
    let speed = cfg.speed.unwrap_or(1.0);
    let (trace, plan, left_out) = prepare(&cfg, trace, embedded.is_some())?;
    let links = if cfg.sessions {
        Some(sessions::link(&trace, &plan, speed).map_err(anyhow::Error::msg)?)
    } else {
        None
    };
    let block_size = cfg.block_size.unwrap_or(trace.header.block_size).max(1);
    let prompts = match (&cfg.tokenizer, cfg.prompt_mode) {
        (Some(p), mode) => {
            let tok = synth::load_tokenizer(p)?;
            if mode == PromptMode::Text {
                let tb = TextBuilder::new(tok, block_size, cfg.seed).ok_or_else(|| {
                    anyhow!("--tokenizer {}: fewer than 64 tokens decode to a plain space-led word; text prompts cannot be built exactly (use --prompt-mode token-ids)", p.display())
                })?;
                Prompts::Text(Box::new(tb))
            } else {
                let v = Vocab::from_tokenizer(&tok)
                    .ok_or_else(|| anyhow!("--tokenizer {}: no usable tokens", p.display()))?;
                Prompts::Tokens(Synth::new(v, block_size, cfg.seed))
            }
        }
        (None, _) => Prompts::Tokens(Synth::new(
            Vocab::from_size(cfg.vocab_size)?,
            block_size,
            cfg.seed,
        )),
    };
    let body_opts = BodyOptions {
        api: cfg.api,
        model: model.clone(),
        model_override: cfg.model.is_some(),
        extra_body: cfg.extra_body.clone(),
        keep_original_limits: cfg.keep_original_limits,
    };
    // Every body is built before the clock starts.
    let mut built = Vec::with_capacity(plan.len());
    for p in &plan {
        let r = &trace.requests[p.index];
        let b = request::build(r, p.index as u64, &body_opts, &prompts)
            .map_err(|e| anyhow!("{}: request {}: {e}", cfg.trace.display(), p.index))?;
        built.push(b);
    }
    // Probe bodies: fresh hash ids above the trace's, built before the clock like the rest.
    let probe_bodies = match cfg.probe_rate {
        None => Vec::new(),
        Some(rate) => {
            let base = trace
                .requests
                .iter()
                .flat_map(|r| r.hash_ids.iter())
                .max()
                .map_or(0, |m| m.saturating_add(1));
            let n = probe::bodies_needed(schedule::span_ns(&plan), rate, 100_000);
            let mut v = Vec::with_capacity(n);
            for k in 0..n as u64 {
                let r = crate::trace::Request {
                    input_tokens: probe::PROBE_PROMPT_TOKENS,
                    output_tokens: 1,
                    hash_ids: vec![base.saturating_add(k)],
                    ..Default::default()
                };
                v.push(
                    request::build(&r, u64::MAX - k, &body_opts, &prompts)
                        .map_err(|e| anyhow!("--probe-request-rate: building a probe: {e}"))?,
                );
            }
            v
        }
    };
    let theory = scrape::Theory {
        server_block_size: cfg.server_block_size,
        ..Default::default()
    };
    let theory = if cfg.scrape_metrics.is_some() {
        let (hits, queries) = crate::trace::stats::vllm_prefix_cache(
            &trace,
            plan.iter().map(|p| p.index),
            block_size,
            cfg.server_block_size,
        );
        scrape::Theory {
            hits,
            queries,
            ..theory
        }
    } else {
        theory
    };
    let trace_index: Vec<usize> = plan.iter().map(|p| p.index).collect();
    let aux_mask: Vec<bool> = built.iter().map(|b| b.aux).collect();
    let recorded = outcome::recorded_failures(&trace, &trace_index, &aux_mask);
    drop(trace);
    let inexact = built.iter().filter(|b| !b.exact_prompt).count() as u64;
    if inexact > 0 {
        eprintln!("retrace: warning: {inexact} text prompts do not re-encode to exactly their token blocks (lengths/prefixes approximate)");
    }
    if let Some(limit) = cfg.fd_limit {
        let streams = cfg.max_concurrency.unwrap_or(plan.len()).min(plan.len()) as u64;
        if streams + 64 > limit {
            eprintln!(
                "retrace: warning: up to {streams} streams may be in flight but the open-file limit is {limit}; requests beyond it fail as `connect` (raise it with `ulimit -n`, or give --max-concurrency)"
            );
        }
    }
    if let Some(at) = cfg.start_at {
        // Wait here, before opening connections: servers close idle keep-alives within seconds.
        if let Ok(ahead) = at.duration_since(std::time::SystemTime::now()) {
            eprintln!(
                "retrace: --start-at: starting at {} (in {:.1} s)",
                start::display(at),
                ahead.as_secs_f64()
            );
            tokio::time::sleep(ahead.saturating_sub(start::WARM_LEAD)).await;
        }
    }
    // Connections are opened before the clock starts, a bounded number at a time.
    let warm = cfg
        .warm_connections
        .unwrap_or(cfg.max_concurrency.unwrap_or(128))
        .min(plan.len());
    if warm > 0 {
        let opened = http.warm(warm, 32).await;
        if opened < warm {
            tracing::warn!("opened {opened} of {warm} warm connections");
        }
    }
    let bar = if cfg.progress {
        let pb = indicatif::ProgressBar::new(plan.len() as u64);
        pb.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {pos}/{len} requests {msg}",
        ) {
            pb.set_style(style);
        }
        Some(pb)
    } else {
        None
    };
    let fixed = fixed_t0(&cfg)?;
    let scraper = match &cfg.scrape_metrics {
        None => None,
        Some(url) => {
            let (url, headers) = match url {
                Some(u) => (u.clone(), HeaderMap::new()),
                None => (
                    format!(
                        "{}://{}/metrics",
                        if target.tls { "https" } else { "http" },
                        target.authority
                    ),
                    target.headers.clone(),
                ),
            };
            let st = scrape::ScrapeTarget::new(&url, headers, cfg.target_ca.as_deref())
                .await
                .map_err(anyhow::Error::msg)?;
            Some(scrape::start(st, fixed, driver::START_LEAD).await)
        }
    };
    let t0 = match (&scraper, fixed) {
        (Some(s), _) => s.t0,
        (None, Some(t)) => t,
        (None, None) => std::time::Instant::now() + driver::START_LEAD,
    };
    let prober = cfg.probe_rate.map(|rate| {
        probe::start(
            rate,
            Arc::new(probe_bodies),
            http.clone(),
            target.clone(),
            t0,
            cfg.timeouts,
        )
    });
    let sends: Vec<(usize, u64)> = plan.iter().enumerate().map(|(i, p)| (i, p.at_ns)).collect();
    // The process's CPU time before the clock (trace, bodies, connections) and during the run.
    let cpu_setup_s = process_cpu_s();
    let mut failed = 0u64;
    let endpoint = endpoint_label(&built);
    let by_endpoint = requests_by_endpoint(&built);
    let mut driven = driver::drive(
        sends,
        Arc::new(built),
        http,
        target,
        driver::DriveOptions {
            max_concurrency: cfg.max_concurrency,
            timeouts: cfg.timeouts,
            realtime: cfg.realtime,
            spin: cfg.spin,
            links: links.clone(),
            t0: Some(t0),
        },
        |s| {
            if let Some(pb) = &bar {
                if !s.ok() {
                    failed += 1;
                    pb.set_message(format!("({failed} failed)"));
                }
                pb.inc(1);
            }
        },
    )
    .await;
    let cpu_run_s = process_cpu_s() - cpu_setup_s;
    // Side requests are counted apart; the workload's samples alone make the statistics.
    let (work, aux_samples) = outcome::split(std::mem::take(&mut driven.samples), &aux_mask);
    driven.samples = work;
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    crate::stamps::flush();
    let probes = match (prober, cfg.probe_rate) {
        (Some(p), Some(rate)) => {
            let samples = p.finish().await;
            Some((
                samples.len() as u64,
                probe::summarize(
                    rate,
                    &samples,
                    driven.duration_s,
                    &median_p99_and(&cfg.percentiles),
                ),
            ))
        }
        _ => None,
    };
    let server_metrics = match scraper {
        Some(s) => {
            let series = s.finish().await;
            // Probes reach the server's counters too (fresh prompts: queries, never hits).
            let sent = probes.as_ref().map_or(0, |p| p.0);
            let theory = scrape::Theory {
                queries: theory.queries + sent * probe::PROBE_PROMPT_TOKENS,
                ..theory
            };
            Some(scrape::summarize(&series, &theory))
        }
        None => None,
    };
    let embedded_target = embedded.is_some();
    if let Some(e) = embedded {
        e.handle.shutdown().await;
    }
    let mut summary = metrics::summarize(&driven.samples, driven.duration_s, &cfg.percentiles);
    if !cfg.slo.is_empty() && driven.duration_s > 0.0 {
        let good = metrics::good_requests(&driven.samples, &cfg.slo);
        summary.request_goodput = Some(good as f64 / driven.duration_s);
    }
    let drift_p99 = metrics::Stats::from_seconds(
        &driven
            .samples
            .iter()
            .map(|s| s.drift_ns() as f64 / 1e9)
            .collect::<Vec<_>>(),
        &[99.0],
    )
    .percentiles[0]
        .1;
    let (valid, invalid_reason) = match cfg.max_drift_ms {
        Some(d) if drift_p99 > d => (
            false,
            Some(format!(
                "p99 send drift {drift_p99:.3} ms exceeds --max-drift-ms {d}"
            )),
        ),
        _ => (true, None),
    };
    let session_report = links.as_ref().map(|l| {
        let recorded: Vec<u64> = plan.iter().map(|p| p.at_ns).collect();
        sessions::report(
            l,
            &recorded,
            &driven.samples,
            &median_p99_and(&cfg.percentiles),
        )
    });
    let hist = Histograms::from_samples(&driven.samples);
    let info = result::RunInfo {
        date: now_utc_compact(),
        trace: cfg.trace.display().to_string(),
        target: if cfg.target.is_some() {
            target_url.clone()
        } else {
            "embedded-mock".into()
        },
        model,
        endpoint,
        speed,
        max_concurrency: cfg.max_concurrency,
        seed: cfg.seed,
        block_size,
        prompt_mode: match cfg.prompt_mode {
            PromptMode::TokenIds => "token-ids".into(),
            PromptMode::Text => "text".into(),
        },
        drift_limit_ms: cfg.max_drift_ms,
        valid,
        invalid_reason: invalid_reason.clone(),
        inexact_prompts: inexact,
    };
    let mut result = result::build(&info, &summary, &hist, &driven.samples, cfg.detailed);
    if let Some(r) = &session_report {
        result::add_sessions(&mut result, r);
    }
    if let serde_json::Value::Object(m) = &mut result {
        if let Some(at) = cfg.start_at {
            m.insert("start_at".into(), serde_json::json!(start::display(at)));
        }
        m.insert("rx_stamp".into(), serde_json::json!(rx_stamp));
        m.insert("selection".into(), serde_json::json!(cfg.select));
        m.insert("left_out".into(), serde_json::json!(left_out.by_name()));
        m.insert(
            "requests_by_endpoint".into(),
            serde_json::json!(by_endpoint),
        );
        if let Some(a) = outcome::auxiliary(&aux_samples) {
            m.insert("auxiliary".into(), a);
        }
        if let Some(rec) = &recorded {
            m.insert(
                "recorded_outcomes".into(),
                outcome::recorded(rec, &driven.samples),
            );
            if cfg.detailed {
                m.insert("recorded_errors".into(), serde_json::json!(rec));
            }
        }
        m.insert(
            "body_readers".into(),
            match readers {
                Some((n, batch)) => serde_json::json!({
                    "threads": n,
                    "batch_us": batch.as_micros() as u64,
                }),
                None => serde_json::Value::Null,
            },
        );
        m.insert(
            "client_cpu".into(),
            serde_json::json!({
                "setup_s": cpu_setup_s,
                "run_s": cpu_run_s,
                "embedded_target": embedded_target,
            }),
        );
        if let Some(sm) = &server_metrics {
            m.insert("server_metrics".into(), sm.clone());
        }
        if let Some((_, p)) = &probes {
            m.insert("probes".into(), p.clone());
        }
    }
    if let Some(path) = &cfg.result_json {
        let text = serde_json::to_string_pretty(&result)?;
        std::fs::write(path, text)
            .with_context(|| format!("--result-json {}: cannot write", path.display()))?;
    }
    let mut report = console::vllm_block(&summary);
    report.push_str(&console::extra_sections(&summary, cfg.max_drift_ms));
    if let Some(r) = &session_report {
        report.push_str(&console::sessions_section(r));
    }
    if let Some(sm) = &server_metrics {
        report.push_str(&console::server_metrics_section(sm));
    }
    if let Some((_, p)) = &probes {
        report.push_str(&console::probes_section(p));
    }
    if let Some(r) = &invalid_reason {
        report.push_str(&format!("RUN INVALID: {r}\n"));
    }
    Ok(Outcome {
        summary,
        result,
        report,
        valid,
        sessions: session_report,
    })
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
            start::t0_for(at, std::time::SystemTime::now(), std::time::Instant::now())
                .map_err(anyhow::Error::msg)?,
        )),
    }
}

/// Raises the soft open-file limit to the hard limit (each in-flight stream holds a socket) and
/// returns the limit now in force (`None` when unknown).
pub(crate) fn raise_fd_limit() -> Option<u64> {
    #[cfg(unix)]
    // SAFETY: getrlimit/setrlimit on RLIMIT_NOFILE with a valid, initialised struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return None;
        }
        if r.rlim_cur < r.rlim_max {
            let want = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                r = want;
            }
        }
        #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every unix
        Some(r.rlim_cur as u64)
    }
    #[cfg(not(unix))]
    None
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
