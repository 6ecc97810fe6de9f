use super::*;

/// The longest schedule a replay accepts (30 days): anything longer is a mistaken flag or trace.
pub(super) const MAX_SCHEDULE: Duration = Duration::from_secs(30 * 86_400);

/// Without `--limit` and `--speed`, the embedded target plans only the first
/// [`EMBEDDED_DEFAULT_SPAN`] of the shaped trace: the cut, ns from t0.
pub(super) fn embedded_cut(cfg: &Config, embedded: bool) -> Option<u64> {
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
pub(super) fn plan_counted(
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
pub(super) fn check_span(span_ns: u64) -> anyhow::Result<()> {
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
pub(super) fn say_embedded_cut(planned: usize, total: usize) {
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
    pub(super) source: plan::source::Source,
    pub(crate) links: Option<plan::turns::Links>,
    pub(crate) left_out: crate::trace::select::Skipped,
    /// Records read from the trace, and malformed rows skipped (`--skip-bad`).
    pub(crate) read: usize,
    pub(crate) malformed: u64,
    pub(crate) block_size: u32,
    pub(super) prompts: Prompts,
    /// The body options, without the model and the target's overheads yet.
    pub(super) opts: BodyOptions,
}

impl Planning {
    /// The body builder's source.
    pub fn into_source(self) -> plan::source::Source {
        self.source
    }
}

/// How the trace is read: with `--block-size` tokens per hash id when given, so that every
/// record's hash ids are bounded by the block size the replay uses.
pub(super) fn read_options(cfg: &Config) -> ImportOptions {
    ImportOptions {
        block_size: cfg.block_size,
        skip_bad: cfg.skip_bad,
        offer_skip_bad: cfg.offer_skip_bad,
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
            format!("; the first at line {line}: {why}")
        });
        eprintln!(
            "retrace: {}: {} with --skip-bad{first}",
            cfg.trace_name(),
            input.report.read_summary()
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
