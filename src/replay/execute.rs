use super::*;

/// What the clock-driven stage measured.
pub struct Ran {
    /// The finished requests, folded in (side requests apart).
    pub(super) collected: collect::Collect,
    /// First dispatch to last completion, s.
    pub(super) duration_s: f64,
    pub(super) cpu_setup_s: f64,
    pub(super) cpu_run_s: f64,
    /// Probes sent and their summary.
    pub(super) probes: Option<(u64, serde_json::Value)>,
    pub(super) server_metrics: Option<serde_json::Value>,
    pub(super) embedded_target: bool,
    /// The signal that halted the run.
    pub(super) interrupted: Option<Signal>,
    /// Why the run was given up (`capacity`'s step lost its objective).
    pub(super) gave_up: Option<String>,
}

/// Stage 2: starts the clock (after the first scrape, or at `--start-at`), drives the plan with
/// probes and scrapes beside it, and stops them when the last request ended.
pub async fn execute(
    cfg: &Config,
    p: &mut Prepared,
    halt: Arc<driver::Halt>,
) -> anyhow::Result<Ran> {
    let fixed = match &cfg.meet {
        Some(meet) => Some(meet.t0().await),
        None => fixed_t0(cfg)?,
    };
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
    collected.watch = cfg
        .stretch
        .as_ref()
        .map(|s| step::Watch::new(s, p.measured));
    halt.enter(driver::Phase::Running);
    let driven = drive(cfg, p, t0, &mut collected, halt.clone()).await;
    halt.enter(driver::Phase::Ended);
    let interrupted = halt.by();
    p.bodies.stop();
    let driven_s = driven.map_err(|e| anyhow!("{}: {e}", cfg.trace_name()))?;
    let watch = collected.watch.as_ref();
    let duration_s = watch.and_then(step::Watch::duration_s).unwrap_or(driven_s);
    let gave_up = watch.and_then(|w| w.lost.clone());
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
        gave_up,
    })
}

/// The plan driven from `t0`, each finished request folded into `collected`, with a progress bar
/// on a terminal; the run's duration (s), or why the body builder failed.
pub(super) async fn drive(
    cfg: &Config,
    p: &Prepared,
    t0: Instant,
    collected: &mut collect::Collect,
    halt: Arc<driver::Halt>,
) -> Result<f64, String> {
    let live = cfg.progress.then(|| Arc::new(progress::Live::default()));
    let last_send = Duration::from_nanos(p.span_ns);
    let bar = (live.clone()).map(|l| progress::bar(p.planned, t0, last_send, l));
    let opts = driver::DriveOptions {
        max_concurrency: cfg.max_concurrency,
        links: p.links.clone(),
        t0: Some(t0),
        halt: halt.clone(),
        sent: live.as_ref().map(|l| l.sent.clone()),
    };
    let driven = driver::drive(
        p.planned,
        p.bodies.clone(),
        p.client.clone(),
        opts,
        |_, tag, s| {
            if let (Some(pb), Some(l)) = (&bar, &live) {
                l.ended(s.ok());
                pb.inc(1);
            }
            if collected.add(tag, s) {
                halt.give_up();
            }
        },
    )
    .await;
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    Ok(driven?.duration_s)
}

/// `--scrape-metrics`: `url`, else the target's own `/metrics` (with the target's headers); the
/// "before" point.
pub(super) async fn scrape_before(
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
