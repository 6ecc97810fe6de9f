//! `retrace compare`, `report` and `merge`: their command lines and options.

use crate::report::render::RenderFormat as CompareFormat;
use crate::report::{self, compare, rules};
use std::path::PathBuf;

/// Compare two runs (retrace results, vllm bench serve results, AIPerf exports, or traces):
/// per-metric change with significance, paired per-request TTFT, workload, and `--fail-on`
/// gating for CI.
///
/// Inputs: `retrace replay --result-json` files (add `--detailed` for per-request samples and
/// paired comparison), `vllm bench serve --save-result` files, AIPerf exports
/// (`profile_export.jsonl`, or `profile_export_aiperf.json`: its statistics only), or traces.
/// Exit status: 0 ok,
/// 1 a `--fail-on` rule tripped, 2 usage or input error, 4 no rule tripped but some could not be
/// judged (too few samples).
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  # did the candidate get slower? (exit 1: a rule tripped; 4: cannot judge)
  retrace compare base.json cand.json \\
    --fail-on \"mean_ttft_ms>+10%,failure_rate>0.01\" --html cmp.html
  # a trace against its replay: faithful or not, how far latencies are apart
  retrace compare traces/mooncake_conversation_1k.jsonl cand.json")]
pub struct CompareArgs {
    /// The reference run.
    #[arg(required_unless_present = "shadow")]
    pub(crate) baseline: Option<PathBuf>,
    /// The run under test.
    #[arg(required_unless_present = "shadow")]
    pub(crate) candidate: Option<PathBuf>,
    /// Judge each shadow of a recording made with `record --shadow` (its files, e.g. rotated
    /// ones) against the primary, request by request; a `--shadow-control` is the noise band.
    /// Or the result of `replay --shadow` (RUN.json), paired with each RUN.shadow-K.json beside
    /// it, RUN.control.json as the noise band.
    #[arg(long, value_name = "RECORDING", num_args = 1.., conflicts_with_all = ["baseline", "candidate", "noise", "html"], help_heading = "Options")]
    pub(crate) shadow: Vec<PathBuf>,
    /// Another run of the baseline (same trace, same target): changes count only beyond the
    /// largest difference between such a run and the baseline. Repeat for several reruns.
    #[arg(long, value_name = "OTHER_BASELINE", help_heading = "Options")]
    pub(crate) noise: Vec<PathBuf>,
    /// Comma-separated rules, e.g. `p99_ttft_ms>+10%,mean_tpot_ms>+5%,failure_rate>0.01`
    /// (+N% relative change, +N absolute change, N the candidate's value).
    #[arg(long, value_name = "RULES", help_heading = "Options")]
    pub(crate) fail_on: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = CompareFormat::Text, help_heading = "Options", hide_short_help = true)]
    pub(crate) format: CompareFormat,
    /// Also write the comparison as a self-contained HTML page.
    #[arg(long, value_name = "FILE", help_heading = "Options")]
    pub(crate) html: Option<PathBuf>,
    /// Smallest change that counts: a percentage of the baseline (`1%`, the default) or an
    /// absolute amount in the metric's unit (`0.5`); smaller changes are "no change".
    #[arg(
        long,
        value_name = "X%|X",
        default_value = "1%",
        help_heading = "Options",
        hide_short_help = true
    )]
    pub(crate) min_effect: String,
    /// Seed of the bootstrap resampling (same seed, same intervals).
    #[arg(
        long,
        value_name = "S",
        default_value_t = 0,
        help_heading = "Options",
        hide_short_help = true
    )]
    pub(crate) seed: u64,
    /// Bootstrap resamples per metric.
    #[arg(long, value_name = "N", default_value_t = 400, value_parser = clap::value_parser!(u64).range(10..=100_000), help_heading = "Options", hide_short_help = true)]
    pub(crate) resamples: u64,
}

/// Write one self-contained HTML report of a run (timeline, CDFs, throughput, breakdown).
///
/// Input: a retrace result (`--detailed` gives the timeline and time series), a vllm bench serve
/// result, an AIPerf export, or a recorded trace. The page needs no network.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  retrace report cand.json -o report.html
  # a capacity result: latency and throughput against offered load
  retrace report cap.json -o capacity.html")]
pub struct ReportArgs {
    /// Result or trace file.
    pub(crate) input: PathBuf,
    /// Output HTML file.
    #[arg(short, long, value_name = "FILE")]
    pub(crate) output: PathBuf,
    /// Timeline colours of inter-token gaps, as vLLM's `--timeline-itl-thresholds`: green below A
    /// ms, orange below B ms, red above; TTFT has its own colour.
    #[arg(
        long,
        visible_alias = "timeline-itl-thresholds",
        value_name = "A,B",
        default_value = "25,50"
    )]
    pub(crate) thresholds_ms: String,
    /// Percentiles of the latency tables, comma-separated (at most 12).
    #[arg(long, value_name = "LIST", default_value = "50,90,95,99,99.9")]
    pub(crate) percentiles: String,
}

/// Merge replay result files (e.g. the shards of `replay --shard I/N`) into one result.
///
/// Histograms are added (lossless), counts and tokens summed, `duration` is the longest
/// input's (shards run concurrently), per-request arrays concatenated. Statistics are
/// recomputed from the per-request data when every input was `--detailed` (then they equal one
/// process's), else from the merged histograms (`merged_from_histograms: true`). Inputs must
/// share trace, seed, speed, endpoint, model and prompt mode. Details: docs/scale-out.md.
/// AIPerf per-request exports (`profile_export.jsonl`) merge into one such export: every
/// record, ordered by send time (docs/compare.md).
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  # the two shards of a run (on two machines, started together with --start-at)
  retrace replay traces/mooncake_conversation_1k.jsonl --limit 40 --shard 0/2 \\
    --target http://127.0.0.1:8000 --result-json shard-0.json
  retrace replay traces/mooncake_conversation_1k.jsonl --limit 40 --shard 1/2 \\
    --target http://127.0.0.1:8000 --result-json shard-1.json
  retrace merge shard-0.json shard-1.json -o all.json")]
pub struct MergeArgs {
    /// Result files (`retrace.replay/1`), or AIPerf per-request exports.
    #[arg(required = true, num_args = 1..)]
    pub(crate) inputs: Vec<PathBuf>,
    /// Output result file.
    #[arg(short, long, value_name = "FILE")]
    pub(crate) output: PathBuf,
}

impl CompareArgs {
    /// The options `compare` runs with; `--fail-on` and `--min-effect` parsed.
    pub(crate) fn options(&self) -> anyhow::Result<report::CompareOptions> {
        let (rules, settings) = self.judging()?;
        let (Some(baseline), Some(candidate)) = (&self.baseline, &self.candidate) else {
            anyhow::bail!("compare takes a BASELINE and a CANDIDATE, or --shadow RECORDING");
        };
        Ok(report::CompareOptions {
            baseline: baseline.clone(),
            candidate: candidate.clone(),
            noise: self.noise.clone(),
            rules,
            format: self.format,
            html: self.html.clone(),
            compare: settings,
        })
    }

    /// Whether this is `compare --shadow`.
    pub(crate) fn is_shadow(&self) -> bool {
        !self.shadow.is_empty()
    }

    /// The options `compare --shadow` runs with.
    pub(crate) fn shadow_options(&self) -> anyhow::Result<report::ShadowCompareOptions> {
        let (rules, settings) = self.judging()?;
        Ok(report::ShadowCompareOptions {
            recordings: self.shadow.clone(),
            rules,
            format: self.format,
            compare: settings,
        })
    }

    /// The `--fail-on` rules and the significance settings, parsed.
    fn judging(&self) -> anyhow::Result<(Vec<rules::Rule>, compare::Settings)> {
        let rules = match &self.fail_on {
            Some(spec) => rules::parse(spec)?,
            None => Vec::new(),
        };
        let min_effect = compare::MinEffect::parse(&self.min_effect).map_err(anyhow::Error::msg)?;
        let settings = compare::Settings {
            min_effect,
            seed: self.seed,
            resamples: self.resamples as usize,
        };
        Ok((rules, settings))
    }
}

impl ReportArgs {
    /// The options `report` runs with; `--thresholds-ms` parsed.
    pub(crate) fn options(&self) -> anyhow::Result<report::ReportOptions> {
        Ok(report::ReportOptions {
            input: self.input.clone(),
            output: self.output.clone(),
            thresholds_ms: parse_thresholds(&self.thresholds_ms)?,
            percentiles: parse_percentiles(&self.percentiles)?,
        })
    }
}

impl MergeArgs {
    /// The options `merge` runs with.
    pub(crate) fn options(&self) -> report::MergeOptions {
        report::MergeOptions {
            inputs: self.inputs.clone(),
            output: self.output.clone(),
        }
    }
}

/// Parses `--percentiles LIST`: replay's grammar, at most
/// [`report::headline::MAX_PERCENTILES`] of them, at least one.
fn parse_percentiles(s: &str) -> anyhow::Result<Vec<f64>> {
    let v = super::replay::percentiles(s)?;
    let max = report::headline::MAX_PERCENTILES;
    if v.is_empty() || v.len() > max {
        anyhow::bail!(
            "--percentiles {s:?}: expected 1 to {max} percentiles, got {}",
            v.len()
        );
    }
    Ok(v)
}

/// Parses `--thresholds-ms A,B`.
fn parse_thresholds(s: &str) -> anyhow::Result<(f64, f64)> {
    let v: Vec<f64> = s
        .split(',')
        .map(|x| x.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|_| anyhow::anyhow!("--thresholds-ms `{s}`: expected two numbers like 25,50"))?;
    match v[..] {
        [a, b] if a > 0.0 && b > a && b.is_finite() => Ok((a, b)),
        _ => anyhow::bail!(
            "--thresholds-ms `{s}`: expected two increasing positive numbers like 25,50"
        ),
    }
}
