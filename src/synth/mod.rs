//! The `synth` command: what-if traces from a recording (docs/synth.md).
//!
//! [`transforms`] applies AIPerf 0.13's synthesis options request by request; [`fit`] learns a
//! model of the input and samples a new trace with new hash ids. Both are pure; this file reads
//! the input and writes the output with `convert`'s writer.

pub(crate) mod fit;
pub(crate) mod transforms;

use crate::trace::import::ImportOptions;
use crate::trace::rows::ImportReport;
use crate::trace::Trace;
use anyhow::{Context, Result};
use std::path::PathBuf;

/// The longest span a synthesised trace may have (365 days): `--speedup`, `--rate` or
/// `--duration` asking for more is refused before anything is made.
pub(crate) const MAX_SPAN_US: u64 = 365 * 86_400_000_000;

/// Most records `synth` reads (4 Mi): it holds its input in memory whole.
pub(crate) const MAX_INPUT_REQUESTS: u64 = 1 << 22;
/// Most hash ids those records carry together (32 Mi, 256 MiB; the fit keeps a few times that
/// again per id, docs/synth.md).
pub(crate) const MAX_INPUT_IDS: u64 = 1 << 25;

/// Errors of `synth`'s own making (reading and writing keep theirs).
#[derive(Debug, thiserror::Error)]
pub(crate) enum WhatIfError {
    #[error("{0}")]
    Option(String),
    #[error("cannot fit a model: {0}")]
    Fit(String),
    #[error("{path}: more {what} than the {max} synth holds in memory (it reads its input whole: cut it first with convert --window or --head)")]
    TooLarge {
        path: String,
        what: &'static str,
        max: u64,
    },
}

/// What `synth` reads, makes and writes.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    pub(crate) input: PathBuf,
    /// Output file; `-` is stdout.
    pub(crate) output: PathBuf,
    pub(crate) import: ImportOptions,
    /// Output format (`None`: from the output's name, as `convert` picks it).
    pub(crate) to: Option<crate::convert::OutFormat>,
    /// zstd level of native output.
    pub(crate) level: i32,
    pub(crate) mode: Mode,
}

/// How the output is made from the input.
#[derive(Debug, Clone)]
pub(crate) enum Mode {
    /// AIPerf's transforms, request by request.
    Transform(transforms::Transforms),
    /// A model of the input, sampled anew.
    Fit { size: fit::Size, seed: u64 },
}

/// Runs `synth`; returns a one-line summary for stderr.
pub fn run(args: &SynthOptions) -> Result<String> {
    let (trace, rep) = read_input(args)?;
    let input = args.input.display().to_string();
    let rows_in = trace.requests.len();
    let (out, to, level) = (&args.output, args.to, args.level);
    let (written, what, left_out) = match &args.mode {
        Mode::Fit { size, seed } => {
            let model = fit::fit(&trace).with_context(|| input.clone())?;
            drop(trace);
            let mut sample = fit::sample(&model, size, *seed)?;
            note_fit(&mut sample.header, *seed, &model);
            let header = sample.header.clone();
            let records = sample.map(|r| r.map_err(Into::into));
            let (n, left) = crate::convert::write_stream(header, records, out, to, level, &input)?;
            (n, fit_summary(&model), left)
        }
        Mode::Transform(t) => {
            let (t, what) = transformed(t, trace)?;
            let records = t.requests.into_iter().map(Ok);
            let (n, left) =
                crate::convert::write_stream(t.header, records, out, to, level, &input)?;
            (n, what, left)
        }
    };
    Ok(format!(
        "{input}: {rows_in} rows read ({} skipped), {written} written to {}{what}{left_out}",
        rep.skipped,
        args.output.display()
    ))
}

/// The input whole, within [`MAX_INPUT_REQUESTS`] (counted by the reader's first pass, before
/// any record is kept) and [`MAX_INPUT_IDS`] (counted as the records are kept).
fn read_input(args: &SynthOptions) -> Result<(Trace, ImportReport)> {
    let stream = crate::trace::stream::open(&args.input, &args.import)?;
    let too_large = |what, max| WhatIfError::TooLarge {
        path: args.input.display().to_string(),
        what,
        max,
    };
    let rows = stream.report.rows;
    if rows > MAX_INPUT_REQUESTS {
        return Err(too_large("records", MAX_INPUT_REQUESTS).into());
    }
    let (header, report) = (stream.header.clone(), stream.report.clone());
    let (mut requests, mut ids) = (Vec::with_capacity(rows as usize), 0u64);
    for r in stream {
        let r = r?;
        ids += r.hash_ids.len() as u64;
        if ids > MAX_INPUT_IDS {
            return Err(too_large("hash ids", MAX_INPUT_IDS).into());
        }
        requests.push(r);
    }
    Ok((Trace { header, requests }, report))
}

/// The summary's note on a fitted model.
fn fit_summary(model: &fit::Model) -> String {
    format!(
        "; fitted: {:.2} req/s, gap gamma shape {:.2}, {} sessions",
        model.rate_rps,
        model.gamma_shape,
        model.session_count()
    )
}

/// What a fitted output's header says of its making.
fn note_fit(header: &mut crate::trace::TraceHeader, seed: u64, model: &fit::Model) {
    let meta = &mut header.meta;
    meta.insert("synth".into(), format!("fitted model, seed {seed}"));
    meta.insert(
        "hash_ids".into(),
        "new: drawn from a counter; none is an id of the input or maps back to one".into(),
    );
    meta.insert("fit_rate_rps".into(), format!("{:.6}", model.rate_rps));
    meta.insert(
        "fit_gap_gamma_shape".into(),
        format!("{:.6}", model.gamma_shape),
    );
}

/// AIPerf's transforms applied to `trace`; and the summary's note on what they left out.
fn transformed(
    t: &transforms::Transforms,
    mut trace: crate::trace::Trace,
) -> Result<(crate::trace::Trace, String)> {
    let applied = transforms::apply(&mut trace, t)?;
    let mut what = String::new();
    if applied.dropped_max_isl + applied.capped_max_osl > 0 {
        what = format!(
            "; {} dropped by --max-isl, {} capped by --max-osl",
            applied.dropped_max_isl, applied.capped_max_osl
        );
    }
    trace.header.meta.insert("synth".into(), describe(t));
    Ok((trace, what))
}

/// The transforms as flags, for the output's header.
fn describe(t: &transforms::Transforms) -> String {
    let mut s = format!(
        "--speedup {} --prefix-len-multiplier {} --prefix-root-multiplier {} --prompt-len-multiplier {} --seed {}",
        t.speedup, t.prefix_len, t.prefix_root, t.prompt_len, t.seed
    );
    if let Some(x) = t.scale_lengths {
        s += &format!(" --scale-lengths {x}");
    }
    if let Some(n) = t.max_isl {
        s += &format!(" --max-isl {n}");
    }
    if let Some(n) = t.max_osl {
        s += &format!(" --max-osl {n}");
    }
    s
}
