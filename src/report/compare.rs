//! The comparison of two runs (pure): for each metric the baseline and candidate values, the
//! absolute and relative change, which direction is better, and whether the change is
//! significant.
//!
//! Significance: a percentile-bootstrap confidence interval ([`CONFIDENCE`]) of
//! `candidate − baseline` for each statistic, resampling each run independently from its
//! per-request samples when the file has them, else from its stored HdrHistogram (bucket values
//! and counts). A change is significant when the interval excludes 0. With a noise run (the same
//! trace replayed again against the baseline), the interval must also clear the observed
//! baseline-vs-noise difference, so a change counts only beyond measured noise; throughputs (one
//! number per run, no samples) can only be judged that way. Failure rate uses a two-proportion
//! z-test. A tail percentile is judged only with enough samples on both sides
//! ([`min_samples`]: 100 for p90, 1,000 for p99); below that its verdict is `unknown` and a note
//! says so, because a bootstrap of the top few samples is not a confidence interval. When both runs replayed the same trace (same request count and input lengths), a
//! paired per-request TTFT ratio distribution is added, with a confidence interval of its
//! geometric mean (normal approximation on log ratios). Every random draw comes from a ChaCha
//! generator seeded by the user's seed and the row, so results are reproducible.
//!
//! ITL is pooled like vLLM's (every gap of every stream is one sample), but gaps within one
//! stream are correlated (a stream that decodes in a big batch is slow for all its tokens), so a
//! bootstrap over pooled gaps gives intervals far too narrow and flags noise as change. When both
//! runs have per-request gaps, ITL is therefore resampled by request (a cluster bootstrap): the
//! mean's interval is the cluster bootstrap's, exactly; the percentile intervals, still drawn from
//! pooled gaps, are widened by the ratio of the clustered to the pooled interval of the mean (the
//! measured design effect, never below 1). This module prints nothing.

use super::load::{Metric, Run};
use super::weighted::{quad_of, Stat, Weighted};
use super::workload::{self, WorkloadCmp};
use crate::metrics::np_percentile_sorted as percentile_sorted;
use rand::SeedableRng;
use serde::Serialize;

/// Two-sided confidence level of every interval.
pub(crate) const CONFIDENCE: f64 = 0.99;
/// Normal quantile for [`CONFIDENCE`].
const Z: f64 = 2.575_829_303_548_901;

/// Which direction of change is an improvement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    Lower,
    Higher,
}

/// The judgement of one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Significant change in the good direction.
    Better,
    /// Significant change in the bad direction.
    Worse,
    /// No change beyond the confidence interval (or beyond noise).
    Same,
    /// Significance cannot be judged (no samples, no noise run).
    Unknown,
    /// A side lacks the value.
    Missing,
}

/// One compared number.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricRow {
    /// Key (vLLM-style): `p99_ttft_ms`, `request_throughput`, `failure_rate`.
    pub key: String,
    pub label: String,
    pub unit: &'static str,
    pub baseline: Option<f64>,
    pub candidate: Option<f64>,
    /// candidate − baseline.
    pub abs_change: Option<f64>,
    /// (candidate − baseline) / baseline.
    pub rel_change: Option<f64>,
    pub better: Better,
    /// Confidence interval of candidate − baseline.
    pub ci: Option<(f64, f64)>,
    /// |noise − baseline|, when a noise run was given.
    pub noise: Option<f64>,
    pub significant: Option<bool>,
    pub verdict: Verdict,
    /// A value came from a histogram (bucket precision), not exact samples or the file's key.
    pub approx: bool,
    /// What a relative `--min-effect` is a fraction of: the baseline, or for a part of TTFT
    /// (server queue, server TTFT, unattributed time) the baseline's TTFT, the whole it is
    /// part of.
    #[serde(skip)]
    pub effect_base: Option<f64>,
}

/// Paired per-request TTFT comparison (same trace replayed by both runs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Paired {
    /// Requests successful in both runs.
    pub(crate) n: usize,
    /// Geometric mean of candidate/baseline TTFT.
    pub geo_mean_ratio: f64,
    pub(crate) ci: (f64, f64),
    pub(crate) p10: f64,
    pub(crate) p50: f64,
    pub(crate) p90: f64,
    /// Fraction of requests more than 10 % slower / faster in the candidate.
    pub(crate) slower_10pct: f64,
    pub(crate) faster_10pct: f64,
    pub(crate) significant: bool,
    /// Sorted ratios, downsampled, for the chart.
    #[serde(skip)]
    pub(crate) cdf: Vec<(f64, f64)>,
}

/// The smallest change that counts (`--min-effect`): below it a change is "no change", however
/// narrow its interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MinEffect {
    /// A fraction of the baseline (1 % → 0.01).
    Relative(f64),
    /// In the metric's own unit.
    Absolute(f64),
}

impl MinEffect {
    /// The default: 1 % of the baseline.
    pub(crate) const DEFAULT: MinEffect = MinEffect::Relative(0.01);

    /// Parses `1%`, `0.5%` or an absolute `0.2`.
    pub(crate) fn parse(s: &str) -> Result<MinEffect, String> {
        let bad =
            || format!("--min-effect `{s}`: give a percentage like 1% or a non-negative number");
        let t = s.trim();
        let (num, rel) = match t.strip_suffix('%') {
            Some(n) => (n.trim(), true),
            None => (t, false),
        };
        let v: f64 = num.parse().map_err(|_| bad())?;
        if !(v.is_finite() && v >= 0.0) {
            return Err(bad());
        }
        Ok(if rel {
            MinEffect::Relative(v / 100.0)
        } else {
            MinEffect::Absolute(v)
        })
    }

    fn too_small(self, abs: f64, base: Option<f64>) -> bool {
        match self {
            MinEffect::Absolute(m) => abs.abs() < m,
            MinEffect::Relative(m) => base.is_some_and(|b| b != 0.0 && (abs / b).abs() < m),
        }
    }
}

/// Comparison settings.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub seed: u64,
    /// Bootstrap resamples per metric.
    pub resamples: usize,
    pub min_effect: MinEffect,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            seed: 0,
            resamples: 400,
            min_effect: MinEffect::DEFAULT,
        }
    }
}

/// Makes a row's interval hold its own point estimate (a bootstrap of a discrete statistic can
/// collapse to a point beside it) and its significance respect the minimum effect.
pub(crate) fn settle(row: &mut MetricRow, min_effect: MinEffect) {
    let Some(d) = row.abs_change else { return };
    if let Some((lo, hi)) = row.ci {
        row.ci = Some((lo.min(d), hi.max(d)));
        row.significant = judge(row.ci, row.abs_change, row.noise);
    }
    let base = row.effect_base.or(row.baseline);
    if row.significant == Some(true) && min_effect.too_small(d, base) {
        row.significant = Some(false);
    }
    row.verdict = verdict(row.better, row.abs_change, row.significant);
}

/// One side's identity.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Side {
    pub path: String,
    pub kind: &'static str,
    pub requests: Option<f64>,
}

impl Side {
    fn of(r: &Run) -> Side {
        Side {
            path: r.path.display().to_string(),
            kind: r.kind.as_str(),
            requests: r.total_requests(),
        }
    }
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub schema: &'static str,
    pub baseline: Side,
    pub candidate: Side,
    /// The noise runs (reruns of the baseline), possibly none.
    pub noise: Vec<Side>,
    pub seed: u64,
    pub confidence: f64,
    pub resamples: usize,
    pub rows: Vec<MetricRow>,
    pub paired: Option<Paired>,
    pub workload: Option<WorkloadCmp>,
    /// Caveats worth reading (different traces, invalid runs, missing data).
    pub notes: Vec<String>,
}

impl Comparison {
    pub fn row(&self, key: &str) -> Option<&MetricRow> {
        self.rows.iter().find(|r| r.key == key)
    }
}

/// Schema of the JSON output.
pub const SCHEMA: &str = "retrace.compare/1";

/// Point values of the four statistics of `m`: the file's own key when it agrees with the
/// file's exact samples (to 10^-6, float noise) or there are none; else the samples' figure
/// (sorted once), the data the intervals are drawn from, so a point always lies in its
/// interval; else the histogram (approximate).
fn points(run: &Run, m: Metric) -> [Option<(f64, bool)>; 4] {
    let mut sorted: Option<Option<Vec<f64>>> = None;
    Stat::ALL.map(|stat| {
        let s = sorted.get_or_insert_with(|| {
            run.samples_ms(m).map(|mut s| {
                s.sort_by(f64::total_cmp);
                s
            })
        });
        let exact = s.as_ref().map(|s| match stat {
            Stat::Mean => crate::metrics::np_mean(s),
            Stat::Median => percentile_sorted(s, 50.0),
            Stat::P90 => percentile_sorted(s, 90.0),
            Stat::P99 => percentile_sorted(s, 99.0),
        });
        let key = format!("{}_{}_ms", stat.key(), m.key());
        let count_key = format!("count_{}", m.key());
        let has_count = run.scalar(&count_key).is_none_or(|c| c > 0.0);
        let agrees = |v: f64| exact.is_none_or(|x| (v - x).abs() <= 1e-6 * x.abs().max(1e-3));
        if let Some(v) = run.scalar(&key).filter(|&v| has_count && agrees(v)) {
            return Some((v, false));
        }
        if let Some(v) = exact {
            return Some((v, false));
        }
        let w = run.hists.get(&m).filter(|w| w.n() > 0)?;
        Some((w.quad().get(stat), true))
    })
}

/// Fewest samples per side for a bootstrap interval of `stat` to mean something: at least 10
/// samples beyond a tail percentile, 20 for the mean and median.
pub(crate) fn min_samples(stat: Stat) -> u64 {
    match stat {
        Stat::Mean | Stat::Median => 20,
        Stat::P90 => 100,
        Stat::P99 => 1000,
    }
}

/// The generator of one row's draws: the user's seed mixed with the row's `salt`.
fn rng(seed: u64, salt: u64) -> rand_chacha::ChaCha8Rng {
    rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// The [`CONFIDENCE`] percentile interval of bootstrap differences.
fn interval(mut d: Vec<f64>) -> (f64, f64) {
    d.sort_by(f64::total_cmp);
    let alpha = (1.0 - CONFIDENCE) / 2.0 * 100.0;
    (
        percentile_sorted(&d, alpha),
        percentile_sorted(&d, 100.0 - alpha),
    )
}

/// Bootstrap intervals of candidate − baseline for the four statistics of one metric.
fn bootstrap(b: &Weighted, c: &Weighted, opts: &Settings, salt: u64) -> [(f64, f64); 4] {
    let mut rng = rng(opts.seed, salt);
    let mut diffs: [Vec<f64>; 4] = Default::default();
    for _ in 0..opts.resamples.max(10) {
        let qb = quad_of(&b.values, &b.resample(&mut rng));
        let qc = quad_of(&c.values, &c.resample(&mut rng));
        for (i, s) in Stat::ALL.iter().enumerate() {
            diffs[i].push(qc.get(*s) - qb.get(*s));
        }
    }
    diffs.map(interval)
}

/// Per-request ITL sums and gap counts (ms) of one run's successful requests with gaps.
struct Clusters {
    sum: Vec<f64>,
    n: Vec<u64>,
}

impl Clusters {
    fn of(run: &Run) -> Option<Clusters> {
        let r = run.requests.as_ref()?;
        let mut c = Clusters {
            sum: Vec::new(),
            n: Vec::new(),
        };
        for i in 0..r.len() {
            let gaps = &r.itls_s[i];
            if r.ok(i) && !gaps.is_empty() {
                let v: Vec<f64> = gaps
                    .iter()
                    .map(|g| g * 1e3)
                    .filter(|g| g.is_finite())
                    .collect();
                if !v.is_empty() {
                    c.sum.push(v.iter().sum());
                    c.n.push(v.len() as u64);
                }
            }
        }
        (c.sum.len() >= 2).then_some(c)
    }

    /// The pooled mean of a resample of whole requests.
    fn resampled_mean<R: rand::Rng>(&self, rng: &mut R) -> f64 {
        let k = self.sum.len();
        let (mut s, mut n) = (0.0, 0u64);
        for _ in 0..k {
            let i = rng.random_range(0..k);
            s += self.sum[i];
            n += self.n[i];
        }
        s / n.max(1) as f64
    }
}

/// ITL intervals that respect the per-request clustering (see the module doc): the mean's from a
/// cluster bootstrap, the percentiles' `pooled` intervals widened about their centre by the ratio
/// of the clustered to the pooled width of the mean's interval (at least 1).
fn clustered_intervals(
    b: &Clusters,
    c: &Clusters,
    pooled: [(f64, f64); 4],
    opts: &Settings,
    salt: u64,
) -> [(f64, f64); 4] {
    let mut rng = rng(opts.seed ^ 0xC1, salt);
    let mean_ci = interval(
        (0..opts.resamples.max(10))
            .map(|_| c.resampled_mean(&mut rng) - b.resampled_mean(&mut rng))
            .collect(),
    );
    let pooled_w = pooled[0].1 - pooled[0].0;
    let factor = if pooled_w > 0.0 {
        ((mean_ci.1 - mean_ci.0) / pooled_w).max(1.0)
    } else {
        1.0
    };
    let mut out = pooled.map(|(lo, hi)| {
        let mid = (lo + hi) / 2.0;
        (mid - (mid - lo) * factor, mid + (hi - mid) * factor)
    });
    out[0] = mean_ci;
    out
}

fn verdict(better: Better, abs: Option<f64>, significant: Option<bool>) -> Verdict {
    match (abs, significant) {
        (None, _) => Verdict::Missing,
        (Some(_), None) => Verdict::Unknown,
        (Some(_), Some(false)) => Verdict::Same,
        (Some(d), Some(true)) => {
            let improved = match better {
                Better::Lower => d < 0.0,
                Better::Higher => d > 0.0,
            };
            if improved {
                Verdict::Better
            } else {
                Verdict::Worse
            }
        }
    }
}

/// Significance from an interval and the noise band: the interval must exclude 0 and clear the
/// noise difference on the same side.
fn judge(ci: Option<(f64, f64)>, abs: Option<f64>, noise: Option<f64>) -> Option<bool> {
    let band = noise.unwrap_or(0.0);
    match (ci, abs) {
        (Some((lo, hi)), Some(_)) => Some(lo > band || hi < -band),
        (None, Some(d)) if noise.is_some() => Some(d.abs() > band),
        _ => None,
    }
}

/// A difference of two numbers of magnitude `scale` as 0 when it is float rounding (within
/// 10^-9 of `scale`): two equal statistics computed apart differ by about 10^-14.
fn denoise(d: f64, scale: f64) -> f64 {
    match d.abs() <= 1e-9 * scale {
        true => 0.0,
        false => d,
    }
}

#[allow(clippy::too_many_arguments)]
fn make_row(
    key: String,
    label: String,
    unit: &'static str,
    better: Better,
    b: Option<f64>,
    c: Option<f64>,
    ci: Option<(f64, f64)>,
    noise: Option<f64>,
    approx: bool,
) -> MetricRow {
    let abs = match (b, c) {
        (Some(b), Some(c)) => Some(denoise(c - b, b.abs().max(c.abs()))),
        _ => None,
    };
    let scale = b.unwrap_or(0.0).abs().max(c.unwrap_or(0.0).abs());
    let ci = ci.map(|(lo, hi)| (denoise(lo, scale), denoise(hi, scale)));
    let rel = match (b, abs) {
        (Some(b), Some(d)) if b != 0.0 => Some(d / b),
        _ => None,
    };
    let significant = judge(ci, abs, noise);
    MetricRow {
        key,
        label,
        unit,
        baseline: b,
        candidate: c,
        abs_change: abs,
        rel_change: rel,
        better,
        ci,
        noise,
        significant,
        verdict: verdict(better, abs, significant),
        approx,
        effect_base: None,
    }
}

fn failure_rate(r: &Run) -> Option<(f64, f64)> {
    let n = r.total_requests()?;
    (n > 0.0).then(|| (r.scalar("failed").unwrap_or(0.0) / n, n))
}

/// The noise band of a row: the largest |noise − baseline| over the noise runs that have it.
fn band(noise: impl Iterator<Item = Option<f64>>, base: Option<f64>) -> Option<f64> {
    let b = base?;
    noise.flatten().map(|n| (n - b).abs()).reduce(f64::max)
}

/// Compares `cand` against `base`; `noise` holds reruns of the baseline.
pub fn compare(base: &Run, cand: &Run, noise: &[Run], opts: &Settings) -> Comparison {
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    if let Some(thin) = latency_rows(&mut rows, base, cand, noise, opts) {
        notes.push(thin);
    }
    throughput_rows(&mut rows, base, cand, noise);
    if let Some(row) = failure_row(base, cand, noise) {
        rows.push(row);
    }
    let paired = paired_ttft(base, cand);
    notes.extend(input_notes(base, cand, paired.is_none()));
    if noise.is_empty() && !rows.is_empty() {
        notes.push(
            "no --noise run: throughput changes cannot be judged; latency significance is sampling noise only, not run-to-run variation"
                .into(),
        );
    }
    for row in &mut rows {
        settle(row, opts.min_effect);
    }
    let workload = workload::compare(base, cand);
    Comparison {
        schema: SCHEMA,
        baseline: Side::of(base),
        candidate: Side::of(cand),
        noise: noise.iter().map(Side::of).collect(),
        seed: opts.seed,
        confidence: CONFIDENCE,
        resamples: opts.resamples,
        rows,
        paired,
        workload,
        notes,
    }
}

/// A row per latency statistic of every metric, its interval from the bootstrap (clustered by
/// request for ITL); the note on statistics with too few samples to judge, if any.
fn latency_rows(
    rows: &mut Vec<MetricRow>,
    base: &Run,
    cand: &Run,
    noise: &[Run],
    opts: &Settings,
) -> Option<String> {
    let mut thin: Vec<&'static str> = Vec::new();
    let ttft_base = points(base, Metric::Ttft);
    for (mi, m) in Metric::ALL.into_iter().enumerate() {
        let db = base.dist(m);
        let dc = cand.dist(m);
        let mut cis = match (&db, &dc) {
            (Some(b), Some(c)) => Some(bootstrap(b, c, opts, mi as u64 + 1)),
            _ => None,
        };
        if let (Metric::Itl, Some(pooled)) = (m, &mut cis) {
            if let (Some(b), Some(c)) = (Clusters::of(base), Clusters::of(cand)) {
                *pooled = clustered_intervals(&b, &c, *pooled, opts, mi as u64 + 1);
            }
        }
        let (ptb, ptc) = (points(base, m), points(cand, m));
        // A part of TTFT is small beside it: its change counts against the TTFT's size.
        let whole = m.part_of_ttft().then_some(&ttft_base);
        let ptn: Vec<_> = noise.iter().map(|n| points(n, m)).collect();
        for (si, stat) in Stat::ALL.into_iter().enumerate() {
            let (pb, pc) = (ptb[si], ptc[si]);
            if pb.is_none() && pc.is_none() {
                continue;
            }
            let nz = band(ptn.iter().map(|p| p[si].map(|x| x.0)), pb.map(|p| p.0));
            let approx = pb.is_some_and(|p| p.1) || pc.is_some_and(|p| p.1);
            // A bootstrap of a tail percentile needs samples in the tail on both sides.
            let n_min = match (&db, &dc) {
                (Some(b), Some(c)) => b.n().min(c.n()),
                _ => 0,
            };
            let enough = n_min >= min_samples(stat);
            if !enough && cis.is_some() && !thin.contains(&stat.key()) {
                thin.push(stat.key());
            }
            let mut row = make_row(
                format!("{}_{}_ms", stat.key(), m.key()),
                format!("{} {}", stat.key(), m.label()),
                "ms",
                Better::Lower,
                pb.map(|p| p.0),
                pc.map(|p| p.0),
                cis.filter(|_| enough).map(|c| c[si]),
                nz,
                approx,
            );
            row.effect_base = whole.and_then(|w| w[si]).map(|p| p.0);
            rows.push(row);
        }
    }
    (!thin.is_empty()).then(|| {
        format!(
            "too few samples to judge {} (needs {} at p90, {} at p99): shown as n/a",
            thin.join(", "),
            min_samples(Stat::P90),
            min_samples(Stat::P99)
        )
    })
}

/// The throughput and goodput rows (no interval: one number per run; judged by the noise runs).
fn throughput_rows(rows: &mut Vec<MetricRow>, base: &Run, cand: &Run, noise: &[Run]) {
    for (key, label, unit) in [
        ("request_throughput", "request throughput", "req/s"),
        ("output_throughput", "output token throughput", "tok/s"),
        ("total_token_throughput", "total token throughput", "tok/s"),
        ("request_goodput", "request goodput", "req/s"),
    ] {
        let (b, c) = (base.scalar(key), cand.scalar(key));
        if b.is_none() && c.is_none() {
            continue;
        }
        let nz = band(noise.iter().map(|n| n.scalar(key)), b);
        rows.push(make_row(
            key.into(),
            label.into(),
            unit,
            Better::Higher,
            b,
            c,
            None,
            nz,
            false,
        ));
    }
}

/// The failure-rate row: a two-proportion interval of the difference.
fn failure_row(base: &Run, cand: &Run, noise: &[Run]) -> Option<MetricRow> {
    let ((pb, nb), (pc, nc)) = (failure_rate(base)?, failure_rate(cand)?);
    let p = (pb * nb + pc * nc) / (nb + nc);
    let se = (p * (1.0 - p) * (1.0 / nb + 1.0 / nc)).sqrt();
    let d = pc - pb;
    // A difference of two rates lies in [-pb, 1 - pb].
    let ci = Some(((d - Z * se).max(-pb), (d + Z * se).min(1.0 - pb)));
    let nz = band(noise.iter().map(|n| failure_rate(n).map(|f| f.0)), Some(pb));
    let mut row = make_row(
        "failure_rate".into(),
        "failure rate".into(),
        "",
        Better::Lower,
        Some(pb),
        Some(pc),
        ci,
        nz,
        false,
    );
    if se == 0.0 {
        // both 0 % or both 100 %: identical
        row.significant = Some(d != 0.0);
        row.verdict = verdict(Better::Lower, Some(d), row.significant);
    }
    Some(row)
}

/// What the reader should know of the two runs: not the same requests (`unpaired`), marked
/// invalid, or without samples.
fn input_notes(base: &Run, cand: &Run, unpaired: bool) -> Vec<String> {
    let mut notes = Vec::new();
    if unpaired {
        if let (Some(a), Some(b)) = (&base.requests, &cand.requests) {
            if a.len() != b.len() || a.input_lens != b.input_lens {
                notes.push(format!(
                    "the runs did not replay the same requests ({} vs {}, or different input lengths): no paired comparison",
                    a.len(),
                    b.len()
                ));
            }
        }
    }
    for (side, r) in [("baseline", base), ("candidate", cand)] {
        if r.info.get("valid").is_some_and(|v| v == "false") {
            notes.push(format!(
                "{side} run is marked invalid: {}",
                r.info
                    .get("invalid_reason")
                    .map_or("(no reason given)", String::as_str)
            ));
        }
        let other = if side == "baseline" { cand } else { base };
        if other.trace.is_some() && r.trace.is_none() && r.requests.is_none() {
            notes.push(format!(
                "no fidelity section: the {side} result has no per-request arrays to pair with the recording (run replay with --detailed)"
            ));
        }
        if r.trace.is_some() && r.requests.is_none() {
            notes.push(format!(
                "{side} is a trace without recorded responses: workload only"
            ));
        } else if r.requests.is_none() && r.hists.is_empty() {
            notes.push(format!(
                "{side} ({}) has neither per-request samples nor histograms: its own statistics \
                 only; no CDF, significance or paired comparison",
                r.kind.as_str()
            ));
        }
    }
    notes
}

/// Per-request TTFT ratios when both runs replayed the same requests.
pub fn paired_ttft(base: &Run, cand: &Run) -> Option<Paired> {
    let (a, b) = (base.requests.as_ref()?, cand.requests.as_ref()?);
    if a.len() != b.len() || a.input_lens != b.input_lens || a.is_empty() {
        return None;
    }
    let mut ratios: Vec<f64> = (0..a.len())
        .filter(|&i| a.ok(i) && b.ok(i))
        .filter_map(|i| Some(b.ttft_s[i]? / a.ttft_s[i]?))
        .filter(|r| r.is_finite() && *r > 0.0)
        .collect();
    let n = ratios.len();
    if n < 2 {
        return None;
    }
    let logs: Vec<f64> = ratios.iter().map(|r| r.ln()).collect();
    let mean = logs.iter().sum::<f64>() / n as f64;
    let var = logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let se = (var / n as f64).sqrt();
    let ci = ((mean - Z * se).exp(), (mean + Z * se).exp());
    ratios.sort_by(f64::total_cmp);
    let slower = ratios.iter().filter(|&&r| r > 1.1).count() as f64 / n as f64;
    let faster = ratios.iter().filter(|&&r| r < 1.0 / 1.1).count() as f64 / n as f64;
    let cdf = Weighted::from_samples(&ratios).cdf_points(200);
    Some(Paired {
        n,
        geo_mean_ratio: mean.exp(),
        ci,
        p10: percentile_sorted(&ratios, 10.0),
        p50: percentile_sorted(&ratios, 50.0),
        p90: percentile_sorted(&ratios, 90.0),
        slower_10pct: slower,
        faster_10pct: faster,
        significant: ci.0 > 1.0 || ci.1 < 1.0,
        cdf,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::report::load::{Kind, Requests};
    use rand::Rng;
    use rand_distr::{Distribution, LogNormal};
    use std::collections::BTreeMap;

    /// A synthetic run of `n` requests whose TTFTs are lognormal around `median_ms` (sigma 0.5:
    /// noisy, like real TTFTs under load), with fixed seed.
    pub(crate) fn synth_run(n: usize, median_ms: f64, seed: u64) -> Run {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let ln = LogNormal::new((median_ms / 1e3).ln(), 0.5).unwrap();
        let mut r = Requests::default();
        for i in 0..n {
            let ttft: f64 = ln.sample(&mut rng);
            let itls: Vec<f64> = (0..9)
                .map(|_| 0.010 + rng.random::<f64>() * 0.002)
                .collect();
            r.input_lens.push(100 + i as u64 % 7);
            r.output_lens.push(10);
            r.start_s.push(i as f64 * 0.01);
            r.ttft_s.push(Some(ttft));
            r.latency_s.push(Some(ttft + itls.iter().sum::<f64>()));
            r.itls_s.push(itls);
            r.errors.push(String::new());
            r.client_queue_s.push(Some(0.0));
            r.server_queue_s.push(None);
            r.server_ttft_s.push(None);
        }
        let mut scalars = BTreeMap::new();
        scalars.insert("completed".into(), n as f64);
        scalars.insert("failed".into(), 0.0);
        Run {
            path: format!("synthetic-{seed}.json").into(),
            kind: Kind::Retrace,
            scalars,
            info: BTreeMap::new(),
            requests: Some(r),
            hists: BTreeMap::new(),
            trace: None,
            server_series: None,
            sections: Vec::new(),
            selection: None,
        }
    }

    /// Settings that count every significant change (no minimum effect).
    pub(crate) fn strict(seed: u64, resamples: usize) -> Settings {
        Settings {
            min_effect: MinEffect::Absolute(0.0),
            seed,
            resamples,
        }
    }

    /// [`compare`] with [`strict`] options.
    pub(crate) fn strict_compare(
        b: &Run,
        c: &Run,
        noise: &[Run],
        seed: u64,
        resamples: usize,
    ) -> Comparison {
        compare(b, c, noise, &strict(seed, resamples))
    }

    /// `synth_run` with each TTFT split into a server queue of half of it, `unattributed_ms` of
    /// unattributed server time and the rest server TTFT.
    fn split_run(seed: u64, unattributed_ms: f64) -> Run {
        let mut run = synth_run(400, 50.0, seed);
        let r = run.requests.as_mut().unwrap();
        for i in 0..r.ttft_s.len() {
            let t = r.ttft_s[i].unwrap();
            r.server_queue_s[i] = Some(t / 2.0);
            r.server_ttft_s[i] = Some(t / 2.0 - unattributed_ms / 1e3);
        }
        run
    }

    /// A part of TTFT changes only by at least `--min-effect` of the TTFT: +0.26 ms of
    /// unattributed server time beside a 50 ms TTFT (26 % of the part, 0.5 % of the whole) is
    /// no change, however narrow its interval; +5 ms is worse.
    #[test]
    fn a_tiny_change_of_a_part_of_ttft_is_not_worse() {
        let settings = Settings::default();
        let b = split_run(1, 1.0);
        let tiny = compare(&b, &split_run(1, 1.26), &[], &settings);
        let row = tiny.row("mean_unattributed_ms").unwrap();
        assert!((row.abs_change.unwrap() - 0.26).abs() < 1e-6, "{row:?}");
        assert!(row.rel_change.unwrap() > 0.25, "{row:?}");
        assert!(row.ci.unwrap().0 > 0.0, "{row:?}");
        assert_eq!(row.significant, Some(false), "{row:?}");
        assert_eq!(row.verdict, Verdict::Same, "{row:?}");
        let worse = tiny.rows.iter().filter(|r| r.verdict == Verdict::Worse);
        assert_eq!(worse.count(), 0, "{:?}", tiny.rows);
        let big = compare(&b, &split_run(1, 6.0), &[], &settings);
        let row = big.row("mean_unattributed_ms").unwrap();
        assert_eq!(row.verdict, Verdict::Worse, "{row:?}");
    }

    /// Two equal statistics computed apart differ by float rounding (1e-14): the change is 0,
    /// printed `0`, not `+2.84e-14`.
    #[test]
    fn float_noise_is_no_change() {
        let row = make_row(
            "mean_ttft_ms".into(),
            "mean TTFT".into(),
            "ms",
            Better::Lower,
            Some(0.1 + 0.2),
            Some(0.3),
            Some((-2.8e-14, 5.6e-14)),
            None,
            false,
        );
        assert_eq!(row.abs_change, Some(0.0));
        assert_eq!(row.rel_change, Some(0.0));
        assert_eq!(row.ci, Some((0.0, 0.0)));
        let real = make_row(
            "mean_ttft_ms".into(),
            "mean TTFT".into(),
            "ms",
            Better::Lower,
            Some(0.3),
            Some(0.3 + 1e-6),
            None,
            None,
            false,
        );
        assert!(real.abs_change.unwrap() > 0.0, "{real:?}");
    }

    /// A file whose own key disagrees with its per-request arrays (edited, or hostile) gets the
    /// arrays' figure: the point and its interval come from the same data.
    #[test]
    fn a_point_estimate_comes_from_the_samples_its_interval_comes_from() {
        let b = synth_run(400, 100.0, 1);
        let mut c = synth_run(400, 100.0, 1);
        c.scalars.insert("mean_ttft_ms".into(), 0.0);
        let cmp = strict_compare(&b, &c, &[], 3, 200);
        let row = cmp.row("mean_ttft_ms").unwrap();
        assert_eq!(row.candidate, row.baseline, "{row:?}");
        let (lo, hi) = row.ci.unwrap();
        let change = row.abs_change.unwrap();
        assert!(lo <= change && change <= hi, "{row:?}");
        // A key that agrees with the samples (float noise) is taken as written.
        let mut d = synth_run(400, 100.0, 1);
        let exact = strict_compare(&b, &d, &[], 3, 50)
            .row("mean_ttft_ms")
            .unwrap()
            .candidate;
        let written = exact.unwrap() * (1.0 + 1e-9);
        d.scalars.insert("mean_ttft_ms".into(), written);
        let row = strict_compare(&b, &d, &[], 3, 50)
            .row("mean_ttft_ms")
            .unwrap()
            .clone();
        assert_eq!(row.candidate, Some(written));
    }

    #[test]
    fn a_result_without_per_request_arrays_names_the_missing_detailed_flag() {
        use crate::trace::{Request, Trace, TraceHeader};
        let mut recording = synth_run(20, 50.0, 1);
        recording.kind = Kind::Trace;
        recording.trace = Some(Trace {
            header: TraceHeader::imported(16, true, "rec"),
            requests: vec![Request::default(); 20],
        });
        let mut result = synth_run(20, 50.0, 2);
        let cmp = strict_compare(&recording, &result, &[], 1, 50);
        assert!(
            !cmp.notes.iter().any(|n| n.contains("--detailed")),
            "{:?}",
            cmp.notes
        );
        result.requests = None;
        let cmp = strict_compare(&recording, &result, &[], 1, 50);
        let note = cmp.notes.iter().find(|n| n.contains("no fidelity section"));
        assert!(
            note.is_some_and(|n| n.contains("candidate") && n.contains("--detailed")),
            "{:?}",
            cmp.notes
        );
    }

    #[test]
    fn ten_percent_shift_in_noisy_metric_is_found() {
        let b = synth_run(1500, 100.0, 1);
        let c = synth_run(1500, 110.0, 2);
        let cmp = strict_compare(&b, &c, &[], 7, 200);
        for key in ["mean_ttft_ms", "median_ttft_ms"] {
            let row = cmp.row(key).unwrap();
            assert_eq!(row.significant, Some(true), "{row:?}");
            assert_eq!(row.verdict, Verdict::Worse, "{row:?}");
            let rel = row.rel_change.unwrap();
            assert!((0.04..0.16).contains(&rel), "{row:?}");
        }
    }

    #[test]
    fn identical_distributions_are_not_flagged() {
        // Same distribution, different draws, several seeds: no TTFT statistic flagged.
        for (sb, sc) in [(11, 12), (13, 14), (15, 16)] {
            let b = synth_run(1000, 100.0, sb);
            let c = synth_run(1000, 100.0, sc);
            let cmp = strict_compare(&b, &c, &[], 3, 200);
            for stat in ["mean", "median", "p90"] {
                let row = cmp.row(&format!("{stat}_ttft_ms")).unwrap();
                assert_eq!(row.significant, Some(false), "seeds {sb},{sc}: {row:?}");
                assert_eq!(row.verdict, Verdict::Same);
            }
        }
    }

    /// A run whose streams each decode at their own pace: request i's ITL level is lognormal
    /// around `itl_ms` (sigma 0.2), its 30 gaps jitter ±2 % around that level.
    fn correlated_itl_run(n: usize, itl_ms: f64, seed: u64) -> Run {
        let mut run = synth_run(n, 100.0, seed);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0xABCD);
        let ln = LogNormal::new((itl_ms / 1e3).ln(), 0.2).unwrap();
        let r = run.requests.as_mut().unwrap();
        for i in 0..n {
            let level: f64 = ln.sample(&mut rng);
            r.itls_s[i] = (0..30)
                .map(|_| level * (0.98 + 0.04 * rng.random::<f64>()))
                .collect();
        }
        run
    }

    #[test]
    fn itl_intervals_respect_per_stream_correlation() {
        let o = strict(5, 200);
        // Same distribution, different draws: the pooled bootstrap (what this module did before)
        // calls about half of these pairs significant; the clustered intervals call none.
        let mut pooled_flags = 0;
        for (sb, sc) in [(21, 22), (23, 24), (25, 26), (27, 28)] {
            let b = correlated_itl_run(150, 10.0, sb);
            let c = correlated_itl_run(150, 10.0, sc);
            let pooled = bootstrap(
                &b.dist(Metric::Itl).unwrap(),
                &c.dist(Metric::Itl).unwrap(),
                &o,
                1,
            );
            if pooled[0].0 > 0.0 || pooled[0].1 < 0.0 {
                pooled_flags += 1;
            }
            let cmp = compare(&b, &c, &[], &o);
            for stat in ["mean", "median", "p90"] {
                let row = cmp.row(&format!("{stat}_itl_ms")).unwrap();
                assert_eq!(row.significant, Some(false), "seeds {sb},{sc}: {row:?}");
            }
        }
        // (Its 99 % interval is about 5x too narrow here, so it should flag about 60 % of pairs.)
        assert!(
            pooled_flags >= 2,
            "the pooled bootstrap should be fooled by correlated gaps ({pooled_flags}/4)"
        );
        // A real 10 % slowdown of every stream is still found.
        let b = correlated_itl_run(600, 10.0, 41);
        let c = correlated_itl_run(600, 11.0, 42);
        let cmp = compare(&b, &c, &[], &o);
        for stat in ["mean", "median"] {
            let row = cmp.row(&format!("{stat}_itl_ms")).unwrap();
            assert_eq!(row.significant, Some(true), "{row:?}");
            assert_eq!(row.verdict, Verdict::Worse, "{row:?}");
        }
    }

    #[test]
    fn same_seed_same_result() {
        let b = synth_run(500, 100.0, 1);
        let c = synth_run(500, 104.0, 2);
        let o = strict(9, 100);
        assert_eq!(compare(&b, &c, &[], &o), compare(&b, &c, &[], &o));
    }

    #[test]
    fn noise_band_suppresses_changes_within_noise() {
        // The candidate is 10 % slower, but the baseline's own rerun differed by 15 %: not counted.
        let b = synth_run(1500, 100.0, 1);
        let c = synth_run(1500, 110.0, 2);
        let noise = synth_run(1500, 115.0, 3);
        let cmp = strict_compare(&b, &c, std::slice::from_ref(&noise), 7, 200);
        let row = cmp.row("median_ttft_ms").unwrap();
        assert!(row.noise.unwrap() > 10.0, "{row:?}");
        assert_eq!(row.significant, Some(false), "{row:?}");
        // A rerun within 1 % leaves the 10 % change standing.
        let quiet = synth_run(1500, 100.5, 4);
        let cmp = strict_compare(&b, &c, std::slice::from_ref(&quiet), 7, 200);
        assert_eq!(cmp.row("median_ttft_ms").unwrap().verdict, Verdict::Worse);
        // Several reruns: the band is the largest difference, so one noisy rerun is enough.
        let quiet_noise = [quiet.clone(), noise.clone()];
        let cmp = strict_compare(&b, &c, &quiet_noise, 7, 200);
        assert_eq!(cmp.noise.len(), 2);
        let row = cmp.row("median_ttft_ms").unwrap();
        let widest = (points(&noise, Metric::Ttft)[1].unwrap().0
            - points(&b, Metric::Ttft)[1].unwrap().0)
            .abs();
        assert_eq!(row.noise, Some(widest), "{row:?}");
        assert_eq!(row.significant, Some(false), "{row:?}");
    }

    #[test]
    fn histogram_only_runs_are_judged_from_buckets() {
        let strip = |mut r: Run| {
            let q = r.requests.take().unwrap();
            let mut h =
                hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).unwrap();
            for t in q.ttft_s.iter().flatten() {
                h.record((t * 1e6) as u64).unwrap();
            }
            r.hists
                .insert(Metric::Ttft, Weighted::from_histogram(&h, 1e-3));
            r
        };
        let b = strip(synth_run(1500, 100.0, 1));
        let c = strip(synth_run(1500, 110.0, 2));
        let cmp = strict_compare(&b, &c, &[], 7, 200);
        let row = cmp.row("median_ttft_ms").unwrap();
        assert!(row.approx);
        assert_eq!(row.verdict, Verdict::Worse, "{row:?}");
        let b2 = strip(synth_run(1500, 100.0, 5));
        let cmp = strict_compare(&b, &b2, &[], 7, 200);
        assert_eq!(cmp.row("median_ttft_ms").unwrap().verdict, Verdict::Same);
    }

    #[test]
    fn paired_ratio_of_same_trace() {
        let b = synth_run(1000, 100.0, 1);
        let mut c = b.clone();
        if let Some(r) = c.requests.as_mut() {
            for t in r.ttft_s.iter_mut().flatten() {
                *t *= 1.2;
            }
        }
        let p = paired_ttft(&b, &c).unwrap();
        assert_eq!(p.n, 1000);
        assert!((p.geo_mean_ratio - 1.2).abs() < 1e-9);
        assert!(p.significant);
        assert_eq!(p.slower_10pct, 1.0);
    }

    #[test]
    fn tail_percentiles_of_small_runs_are_not_judged() {
        let b = synth_run(200, 100.0, 1);
        let c = synth_run(200, 300.0, 2);
        let cmp = strict_compare(&b, &c, &[], 1, 100);
        assert_eq!(cmp.row("p99_ttft_ms").unwrap().verdict, Verdict::Unknown);
        assert_eq!(cmp.row("p90_ttft_ms").unwrap().verdict, Verdict::Worse);
        assert!(cmp
            .notes
            .iter()
            .any(|n| n.contains("too few samples to judge p99")));
    }

    #[test]
    fn failure_rate_row() {
        let b = synth_run(100, 100.0, 1);
        let mut c = synth_run(100, 100.0, 2);
        c.scalars.insert("completed".into(), 50.0);
        c.scalars.insert("failed".into(), 50.0);
        let cmp = strict_compare(&b, &c, &[], 1, 50);
        let row = cmp.row("failure_rate").unwrap();
        assert_eq!(row.candidate, Some(0.5));
        assert_eq!(row.verdict, Verdict::Worse);
    }
}
