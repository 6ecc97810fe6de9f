//! `retrace compare` and `retrace report`: read runs, compare them, render the result.
//!
//! Sub-modules, one concept each: [`run`] (the model of a run), [`load`] (any input → [`run::Run`]; AIPerf exports in [`aiperf`]), [`weighted`] (values with
//! counts: statistics, CDFs, bootstrap resamples), [`compare`] (per-metric change and
//! significance, paired TTFT), [`workload`] (arrivals, lengths, KS, fidelity), [`rules`]
//! (`--fail-on`), [`headline`] (what the report page says first), [`render`] (text/markdown/json) and [`html`] (self-contained pages). This file
//! only runs the commands on their options and writes files (`merge`'s rules are
//! [`crate::result::merge`]'s, AIPerf's [`aiperf`]'s); it computes nothing itself.

pub(crate) mod aiperf;
pub(crate) mod capacity;
pub mod compare;
pub(crate) mod headline;
pub mod html;
pub mod load;
pub mod render;
pub mod rules;
pub mod run;
pub mod shadow;
pub(crate) mod weighted;
pub mod workload;

use anyhow::Context;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// `compare`'s exit status when no rule tripped but some could not be judged (too few samples).
pub(crate) const NOT_JUDGED: u8 = 4;

/// What `compare` reads, judges and writes.
#[derive(Debug, Clone)]
pub(crate) struct CompareOptions {
    pub(crate) baseline: PathBuf,
    pub(crate) candidate: PathBuf,
    /// Other runs of the baseline.
    pub(crate) noise: Vec<PathBuf>,
    /// The `--fail-on` rules.
    pub(crate) rules: Vec<rules::Rule>,
    pub(crate) format: render::RenderFormat,
    /// Also write the comparison as an HTML page here.
    pub(crate) html: Option<PathBuf>,
    pub(crate) compare: compare::Settings,
}

/// What `compare --shadow` reads and judges.
#[derive(Debug, Clone)]
pub(crate) struct ShadowCompareOptions {
    /// The files of one shadowed recording.
    pub(crate) recordings: Vec<PathBuf>,
    pub(crate) rules: Vec<rules::Rule>,
    pub(crate) format: render::RenderFormat,
    pub(crate) compare: compare::Settings,
}

/// `retrace compare --shadow`: each candidate judged as [`run_compare`] judges a candidate run,
/// with the same exit codes (the worst over the candidates).
pub(crate) fn run_shadow_compare(a: &ShadowCompareOptions) -> anyhow::Result<ExitCode> {
    let judged = shadow::compare_shadows(&a.recordings, &a.compare)?;
    let mut outcomes = Vec::with_capacity(judged.len());
    for j in &judged {
        outcomes.push(rules::evaluate(&a.rules, &j.comparison)?);
    }
    std::io::stdout()
        .lock()
        .write_all(shadow::render(&judged, &outcomes, a.format).as_bytes())?;
    let mut code = ExitCode::SUCCESS;
    let (mut tripped, mut unjudged) = (0, false);
    for (j, o) in judged.iter().zip(&outcomes) {
        for r in o.iter().filter(|r| r.tripped || r.not_judged) {
            eprintln!("retrace compare: shadow {}: {}", j.target.index, r.message);
        }
        tripped += o.iter().filter(|r| r.tripped).count();
        unjudged |= o.iter().any(|r| r.not_judged);
    }
    if tripped > 0 {
        code = ExitCode::from(1);
    } else if unjudged {
        code = ExitCode::from(NOT_JUDGED);
    }
    Ok(code)
}

/// What `report` reads and writes.
#[derive(Debug, Clone)]
pub(crate) struct ReportOptions {
    /// Result or trace file.
    pub(crate) input: PathBuf,
    /// Output HTML file.
    pub(crate) output: PathBuf,
    /// Timeline colours of inter-token gaps: green below the first, orange below the second, ms.
    pub(crate) thresholds_ms: (f64, f64),
    /// The percentiles the tables show (`--percentiles`).
    pub(crate) percentiles: Vec<f64>,
}

/// What `merge` reads and writes.
#[derive(Debug, Clone)]
pub(crate) struct MergeOptions {
    /// Result files, or AIPerf per-request exports.
    pub(crate) inputs: Vec<PathBuf>,
    /// Output result file.
    pub(crate) output: PathBuf,
}

/// `retrace compare`: exit 1 when a `--fail-on` rule trips, [`NOT_JUDGED`] when none tripped but
/// some could not be judged; errors (exit 2) for bad input.
pub(crate) fn run_compare(a: &CompareOptions) -> anyhow::Result<ExitCode> {
    check_noise_runs_distinct(a)?;
    let base = load::load(&a.baseline)?;
    let cand = load::load(&a.candidate)?;
    let noise = a
        .noise
        .iter()
        .map(|p| load::load(p))
        .collect::<Result<Vec<_>, _>>()?;
    let cmp = compare::compare(&base, &cand, &noise, &a.compare);
    let outcomes = rules::evaluate(&a.rules, &cmp)?;
    if let Some(path) = &a.html {
        let page = html::compare_page(&cmp, &outcomes, &base, &cand, &noise);
        std::fs::write(path, page)
            .with_context(|| format!("--html {}: cannot write", path.display()))?;
    }
    std::io::stdout()
        .lock()
        .write_all(render::render(&cmp, &outcomes, a.format).as_bytes())?;
    let tripped = outcomes.iter().filter(|o| o.tripped).count();
    let unjudged = outcomes.iter().any(|o| o.not_judged);
    if tripped == 0 && !unjudged {
        return Ok(ExitCode::SUCCESS);
    }
    // the tripped rules, or else the ones that could not be judged
    for o in outcomes
        .iter()
        .filter(|o| if tripped > 0 { o.tripped } else { o.not_judged })
    {
        eprintln!("retrace compare: {}", o.message);
    }
    if tripped == 0 {
        return Ok(ExitCode::from(NOT_JUDGED));
    }
    eprintln!(
        "retrace compare: {tripped} of {} --fail-on rules tripped",
        outcomes.len()
    );
    Ok(ExitCode::from(1))
}

/// Each `--noise` run is another file than the baseline, the candidate and the other noise runs
/// (under any name): a file given twice would count as a rerun it is not. The baseline and the
/// candidate may be one file (a comparison with itself counts nothing twice).
fn check_noise_runs_distinct(a: &CompareOptions) -> anyhow::Result<()> {
    let mut earlier = vec![
        ("the baseline", &a.baseline),
        ("the candidate", &a.candidate),
    ];
    for p in &a.noise {
        let Some(id) = crate::sys::fileid::id(p) else {
            continue;
        };
        if let Some((role, q)) = earlier
            .iter()
            .find(|(_, q)| crate::sys::fileid::id(q) == Some(id))
        {
            anyhow::bail!(
                "--noise {}: given twice (the same file as {role} {}): each run counts once",
                p.display(),
                q.display()
            );
        }
        earlier.push(("--noise", p));
    }
    Ok(())
}

/// `replay --report-html FILE`: the report of a result that is still in memory (its sidecar, if
/// it names one, beside `result_json`).
pub(crate) fn write_replay_report(
    path: Option<&std::path::Path>,
    result: &serde_json::Value,
    result_json: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let Some(path) = path else { return Ok(()) };
    let run = match (result.as_object(), result_json) {
        (Some(obj), Some(rj)) if obj.contains_key(crate::result::sidecar::KEY) => {
            let mut obj = obj.clone();
            crate::result::read::with_sidecar(rj, &mut obj)?;
            load::from_value(path, &serde_json::Value::Object(obj))?
        }
        _ => load::from_value(path, result)?,
    };
    let page = html::report_page(&run, (25.0, 50.0));
    std::fs::write(path, page)
        .with_context(|| format!("--report-html {}: cannot write", path.display()))?;
    Ok(())
}

/// `retrace report`.
pub(crate) fn run_report(a: &ReportOptions) -> anyhow::Result<ExitCode> {
    let data = crate::trace::rows::read_whole(&a.input)
        .with_context(|| format!("{}: cannot read", a.input.display()))?;
    let page = match load::read_input(&a.input, &data)? {
        load::Input::Capacity(v) => {
            html::capacity_page(&capacity::page_data(&a.input.display().to_string(), &v)?)
        }
        load::Input::Run(run) => html::report_page_at(&run, a.thresholds_ms, &a.percentiles),
    };
    std::fs::write(&a.output, &page)
        .with_context(|| format!("-o {}: cannot write", a.output.display()))?;
    eprintln!(
        "wrote {} ({:.1} KB)",
        a.output.display(),
        page.len() as f64 / 1024.0
    );
    Ok(ExitCode::SUCCESS)
}

/// `retrace merge`: shard results → one result file; AIPerf per-request exports → one such export.
pub(crate) fn run_merge(a: &MergeOptions) -> anyhow::Result<ExitCode> {
    if let Some((earlier, later)) = crate::sys::fileid::first_repeat(&a.inputs) {
        return Err(crate::result::merge::MergeError::Twice {
            path: a.inputs[later].display().to_string(),
            earlier: a.inputs[earlier].display().to_string(),
        }
        .into());
    }
    let mut raw = Vec::with_capacity(a.inputs.len());
    for p in &a.inputs {
        let data = crate::trace::rows::read_whole(p)
            .with_context(|| format!("{}: cannot read", p.display()))?;
        raw.push((p.clone(), data));
    }
    if raw.iter().any(|(_, d)| aiperf::detect(d).is_some()) {
        let (out, n) = aiperf::merge_records(&raw)?;
        std::fs::write(&a.output, out)
            .with_context(|| format!("-o {}: cannot write", a.output.display()))?;
        eprintln!(
            "merged {} AIPerf per-request exports into {} ({n} records, by send time)",
            raw.len(),
            a.output.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mut inputs = Vec::with_capacity(raw.len());
    for (p, data) in raw {
        let mut v = crate::result::read::parse_json(&p, &data)?;
        if let Some(obj) = v.as_object_mut() {
            crate::result::read::with_sidecar(&p, obj)?;
        }
        inputs.push((p, v));
    }
    let mut merged = crate::result::merge::merge(&inputs)?;
    if let Some(w) = crate::result::merge::apart(&inputs) {
        eprintln!("retrace merge: warning: {w}");
    }
    let rows = merged["num_prompts"].as_u64().unwrap_or(0);
    if rows > crate::result::sidecar::THRESHOLD as u64 && merged.get("ttfts").is_some() {
        let path = crate::result::sidecar::path_for(&a.output);
        let name = crate::result::sidecar::write_arrays(&path, &mut merged)
            .with_context(|| format!("{}: cannot write", path.display()))?;
        merged[crate::result::sidecar::KEY] = serde_json::json!(name);
    }
    if inputs.len() > 1 && merged["target"] == "embedded-mock" {
        eprintln!(
            "retrace merge: warning: the inputs replayed against embedded mocks (no --target): each \
             shard had its own server at 1/N of the load, so the merged latencies are not one \
             server's"
        );
    }
    let text = serde_json::to_string_pretty(&merged)?;
    std::fs::write(&a.output, text)
        .with_context(|| format!("-o {}: cannot write", a.output.display()))?;
    eprintln!(
        "merged {} results into {} ({} completed, {} failed{})",
        inputs.len(),
        a.output.display(),
        merged["completed"],
        merged["failed"],
        if merged["merged_from_histograms"] == true {
            "; statistics from merged histograms: not every input was --detailed"
        } else {
            ""
        }
    );
    Ok(ExitCode::SUCCESS)
}
