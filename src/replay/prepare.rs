use super::*;

/// Runs a whole replay and renders it (async part of [`run`]; tests call it directly).
pub async fn replay(cfg: Config) -> anyhow::Result<Outcome> {
    replay_all(cfg, Arc::default()).await
}

/// [`replay_with`] for a single target, [`shadow::replay_sides`] with `--shadow`.
pub(crate) async fn replay_all(cfg: Config, halt: Arc<driver::Halt>) -> anyhow::Result<Outcome> {
    match cfg.shadows.is_empty() {
        true => replay_with(cfg, halt).await,
        false => shadow::replay_sides(cfg, halt).await,
    }
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
    pub(super) embedded: Option<Embedded>,
    pub(super) client: Arc<http::client::Client>,
    /// Planned sends.
    pub(super) planned: usize,
    /// The last planned send's offset from t0, ns (`--speed` applied).
    pub(super) span_ns: u64,
    pub(super) links: Option<plan::turns::Links>,
    /// The body builder's window (bodies are built during the run, ahead of the clock).
    pub(super) bodies: Arc<plan::body::Window>,
    /// Planned sends that are not side requests (`--include-aux`).
    pub(super) measured: usize,
    /// The trace holds recorded responses.
    pub(super) recorded: bool,
    pub(super) probe_bodies: Vec<BuiltRequest>,
    pub(super) theory: scrape::Theory,
    /// `--scrape-metrics`' "before" point, taken before the warm connections were opened.
    pub(super) scrape: Option<scrape::Before>,
    /// `--result-json`, opened before the run.
    pub(super) result_file: std::sync::Mutex<Option<ResultFile>>,
    /// Where `--detailed` rows go (taken by the run).
    pub(super) detail: Option<collect::Detail>,
    pub(super) facts: RunFacts,
}

/// `--result-json`, opened before the run ([`crate::sys::partial`]), so that a path that cannot be
/// written fails before anything is sent and a run that uses up its open files still has its
/// file; a run that fails removes the partial file, and an old result stays whole.
pub(super) struct ResultFile {
    pub(super) partial: crate::sys::partial::Partial,
    pub(super) file: std::fs::File,
    pub(super) path: PathBuf,
}

impl ResultFile {
    pub(super) fn open(path: &Path) -> anyhow::Result<ResultFile> {
        let (partial, file) = crate::sys::partial::Partial::create(path)
            .with_context(|| format!("--result-json {}: cannot write", path.display()))?;
        let path = path.to_path_buf();
        Ok(ResultFile {
            partial,
            file,
            path,
        })
    }

    pub(super) fn write(mut self, text: &str) -> anyhow::Result<()> {
        let cannot = || format!("--result-json {}: cannot write", self.path.display());
        self.file.write_all(text.as_bytes()).with_context(cannot)?;
        self.partial.commit(self.file).with_context(cannot)
    }
}

/// What the result file says about the run besides its measurements.
pub(crate) struct RunFacts {
    pub(super) target_url: String,
    pub(super) model: String,
    pub(super) speed: f64,
    pub(super) block_size: u32,
    pub(super) rx_stamp: &'static str,
    /// Reader threads and their batch window, when bodies are read on them.
    pub(super) readers: Option<(usize, Duration)>,
    /// The one API every measured request used, or `mixed`.
    pub(super) endpoint: String,
    /// `METHOD path` → requests sent.
    pub(super) by_endpoint: std::collections::BTreeMap<String, u64>,
    /// Requests the selection left out, and why.
    pub(super) left_out: crate::trace::select::Skipped,
    /// The selection in force (`text_prompts`: whether text prompts could be built).
    pub(super) select: crate::trace::select::Selection,
    /// Workload left out (requests that cannot be rebuilt, malformed rows) and workload read.
    pub(super) lost: (u64, u64),
    pub(super) malformed: u64,
    /// What the target's tokenizer did, when it made the text prompts.
    pub(super) target_text: Option<Arc<plan::servertext::TargetStats>>,
    /// How `--tokenizer`'s text prompts were fitted to the target ([`http::overhead::measure`]).
    pub(super) tokenizer_fit: Option<String>,
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
            let (fit, fit_model) = text_source(cfg, &target_url, &model).await?;
            let (o, line) = http::overhead::measure(&fit, &fit_model, tb).await;
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
        span_ns: survey.span_ns,
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
pub(super) async fn plan_apart(cfg: Config, embedded: bool) -> anyhow::Result<Planning> {
    tokio::task::spawn_blocking(move || planning(&cfg, embedded))
        .await
        .context("reading the trace")?
}

/// A plan with no send is [`NothingToSend`], saying why.
pub(super) fn nothing_to_send(cfg: &Config, p: &Planning) -> anyhow::Result<()> {
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
pub(super) fn lost_workload(
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
pub(super) fn left_out_reason((lost, workload): (u64, u64)) -> Option<String> {
    (workload > 0 && lost as f64 > MAX_LEFT_OUT_SHARE * workload as f64).then(|| {
        format!(
            "{lost} of {workload} workload requests left out ({:.1}%, more than {:.0}%; see left_out)",
            100.0 * lost as f64 / workload as f64,
            100.0 * MAX_LEFT_OUT_SHARE
        )
    })
}

/// Whether the target makes text prompts ([`plan::servertext::probe`]): the side's own, or on a
/// shadow's side the replay's ([`Config::text_from`]).
pub(super) async fn probe_target_text(
    cfg: &Config,
    url: &str,
    model: &str,
    block_size: u32,
) -> Result<plan::servertext::ServerText, String> {
    let (client, model) = text_source(cfg, url, model)
        .await
        .map_err(|e| format!("{e:#}"))?;
    plan::servertext::probe(client, &model, block_size, cfg.seed).await
}

/// The client and model of the server whose tokenizer makes and fits text prompts, through
/// connections of its own (the workload's stay free for the run): the side's own target at
/// `url` with `model`, or the replay's target on a shadow's side.
async fn text_source(
    cfg: &Config,
    url: &str,
    model: &str,
) -> anyhow::Result<(Arc<http::client::Client>, String)> {
    let (url, headers) = match &cfg.text_from {
        Some(t) => (t.url.as_str(), t.headers.clone()),
        None => (url, cfg.headers.clone()),
    };
    let target = http::target::Target::parse(url, headers).map_err(|e| anyhow!(e))?;
    let pool = http::pool::Pool::new(&target, cfg.target_ca.as_deref())
        .await
        .map_err(|e| anyhow!("{url}: {e}"))?;
    let client = Arc::new(http::client::Client {
        pool,
        target,
        timeouts: cfg.timeouts,
    });
    let model = match cfg.text_from.as_ref().map(|t| &t.model) {
        None => model.to_string(),
        Some(Some(m)) => m.clone(),
        Some(None) => client
            .first_model()
            .await
            .with_context(|| format!("{url}: the model whose tokenizer makes the text"))?,
    };
    Ok((client, model))
}

/// Where `--detailed` rows go: inline, or to the sidecar beside `--result-json` (opened now, so
/// that an unwritable path fails before the run) when more than [`crate::result::sidecar::THRESHOLD`]
/// requests are measured.
pub(super) fn detail(
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
pub(super) async fn model(
    cfg: &Config,
    embedded: Option<&Embedded>,
    client: &http::client::Client,
) -> anyhow::Result<String> {
    match (&cfg.model, embedded) {
        (Some(m), _) => Ok(m.clone()),
        (None, Some(e)) => Ok(e.model.clone()),
        (None, None) => Ok(client.first_model().await?),
    }
}

/// The client for `target_url`: its pool, kernel stamps and reader threads as tuned, and one
/// connection opened to check that the target can be reached.
pub(super) async fn open_client(
    cfg: &Config,
    target_url: &str,
) -> anyhow::Result<http::client::Client> {
    let flag = cfg.target_flag;
    let target = http::target::Target::parse_as(target_url, cfg.headers.clone(), flag)
        .map_err(|e| anyhow!(e))?;
    let t = &cfg.tuning;
    let pool = http::pool::Pool::new(&target, cfg.target_ca.as_deref())
        .await
        .map_err(|e| anyhow!("{flag} {target_url}: {e}"))?
        .with_kernel_rx(t.kernel_rx)
        .with_readers(t.reader_threads, t.read_batch)
        .context("starting the reader threads")?;
    pool.reach().await.map_err(|e| {
        anyhow!(
            "{flag} {target_url}: the target could not be reached ({})",
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
pub(super) fn prompts(cfg: &Config, block_size: u32) -> anyhow::Result<Prompts> {
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
pub(super) fn probe_bodies(
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

pub(super) fn warn_before_the_run(cfg: &Config, planned: usize) {
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
pub(super) async fn wait_for_start_at(cfg: &Config) {
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
pub(super) async fn warm(cfg: &Config, client: &http::client::Client, planned: usize) {
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
