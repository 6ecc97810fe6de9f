use super::*;

/// What the run keeps of its workload's requests: every statistic exact up to the bounds;
/// `--sessions` reports on every request's scalars, so it holds them all.
pub(super) fn collector(cfg: &Config, p: &Prepared) -> metrics::Collector {
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
        ran.gave_up.as_ref().map(|why| format!("given up: {why}")),
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
    // A halted run, or a step's measured stretch, holds part of the plan's requests.
    let whole = ran.interrupted.is_none() && ran.collected.watch.is_none();
    let arrays = ran.collected.finish(whole)?;
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
        stretch: ran.collected.watch.as_ref().map(step::Watch::measured),
        shadows: Vec::new(),
    })
}

/// The console report: vLLM's block, ours, then each optional section and the verdict (why the
/// run is invalid, whether every request failed).
pub(super) fn console_report(
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
pub(super) fn result_of(
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

pub(super) fn body_builder(
    cfg: &Config,
    st: &plan::body::BuilderStats,
) -> crate::result::BodyBuilder {
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
pub(super) fn interrupted_reason(
    signal: Signal,
    measured: u64,
    cut: u64,
    planned: usize,
) -> String {
    format!(
        "interrupted by {signal}: {measured} of {planned} planned requests measured ({cut} of them cut in flight or not sent, error kind `{}`)",
        metrics::Failure::Interrupted
    )
}

/// Why the run is invalid: its p99 send drift exceeded `--max-drift-ms`.
pub(super) fn invalid_reason(cfg: &Config, work: &metrics::Collector) -> Option<String> {
    let drift_p99 = work.drift(&[99.0]).percentiles[0].1;
    match cfg.max_drift_ms {
        Some(d) if drift_p99 > d => Some(format!(
            "p99 send drift {drift_p99:.3} ms exceeds --max-drift-ms {d}"
        )),
        _ => None,
    }
}

pub(super) fn run_info(
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
pub(super) fn process_cpu_s() -> f64 {
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
pub(super) fn median_p99_and(percentiles: &[f64]) -> Vec<f64> {
    let mut ps = vec![50.0, 99.0];
    for p in percentiles {
        if !ps.contains(p) {
            ps.push(*p);
        }
    }
    ps
}

/// `--start-at` on the monotonic clock, read now (an error when setup ran past it).
pub(super) fn fixed_t0(cfg: &Config) -> anyhow::Result<Option<std::time::Instant>> {
    match cfg.start_at {
        None => Ok(None),
        Some(at) => Ok(Some(
            plan::start::t0_for(at, std::time::SystemTime::now(), std::time::Instant::now())
                .map_err(anyhow::Error::msg)?,
        )),
    }
}

/// vLLM's `date` format (`20260101-120000`), in UTC.
pub(super) fn now_utc_compact() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|d| d.format("%Y%m%d-%H%M%S").to_string())
        .unwrap_or_default()
}
