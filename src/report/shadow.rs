//! `compare --shadow RECORDING...`: each shadow target of a shadowed recording judged against the
//! primary request by request (docs/shadow.md). A pair is one request answered by both sides,
//! both completed. Per latency metric (TTFT, TPOT, ITL, E2EL) the rows give the per-request
//! change: the mean and median of the per-request deltas, and the difference of the p99s, each
//! with a paired bootstrap interval (pairs resampled together). A `--shadow-control` target's
//! own changes are the noise band of every candidate (Diffy's noise floor): a candidate's change
//! counts only beyond it. The rows are a [`Comparison`], so the verdict line, `--fail-on` and
//! `--min-effect` work as for result files.
//!
//! Bounded: at most [`MAX_PAIRS`] pairs per target are kept (later ones are counted, not
//! used), and a bootstrap draws from at most [`BOOTSTRAP_MAX`] of them.

use super::compare::{self, Better, Comparison, MetricRow, Settings, Side};
use crate::metrics::np_percentile_sorted as percentile_sorted;
use crate::trace::shadow::{self as ts, Role, ShadowCopy};
use crate::trace::{Request, Response};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Pairs kept per shadow target.
pub(crate) const MAX_PAIRS: usize = 1 << 20;
/// Pairs a bootstrap draws from (an even stride over the kept ones beyond it).
pub(crate) const BOOTSTRAP_MAX: usize = 1 << 16;

/// The latency metrics of a pair.
const METRICS: [(&str, &str); 4] = [
    ("ttft", "TTFT"),
    ("tpot", "TPOT"),
    ("itl", "ITL"),
    ("e2el", "E2EL"),
];

/// One request's latencies in ms (TTFT, TPOT, ITL, E2EL; `None` where it has none).
type Lat = [Option<f64>; 4];

fn latencies(r: &Response, output_tokens: u64) -> Lat {
    let ms = |us: u64| us as f64 / 1000.0;
    let e2el = r.end_us.map(ms);
    let Some(ttft) = r.ttft_us.map(ms) else {
        return [None, None, None, e2el];
    };
    let tpot = match (e2el, output_tokens) {
        (Some(e), n) if n > 1 => Some((e - ttft) / (n - 1) as f64),
        _ => None,
    };
    // The mean gap between content events after the first (vLLM's ITL, per request).
    let first = r
        .events
        .iter()
        .position(|e| e.offset_us >= r.ttft_us.unwrap_or(0));
    let itl = first.and_then(|f| {
        let evs = &r.events[f..];
        (evs.len() > 1).then(|| {
            let span = evs[evs.len() - 1]
                .offset_us
                .saturating_sub(evs[0].offset_us);
            ms(span) / (evs.len() - 1) as f64
        })
    });
    [Some(ttft), tpot, itl, e2el]
}

/// What one target's copies gave.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TargetSummary {
    pub index: usize,
    pub role: &'static str,
    pub url: String,
    /// Requests a copy was made of (sent or skipped).
    pub copies: u64,
    /// By reason: not sent, or the measurement given up.
    pub skipped: Vec<(String, u64)>,
    /// Copies sent whose shadow failed (a failure kind, or a status of 400 or more).
    pub shadow_failed: u64,
    /// Of the same requests, how many failed on the primary.
    pub primary_failed: u64,
    pub shadow_failure_rate: Option<f64>,
    pub primary_failure_rate: Option<f64>,
    /// Requests both sides completed.
    pub pairs: u64,
    /// Pairs past [`MAX_PAIRS`], counted but not used.
    pub pairs_unused: u64,
    pub mean_output_tokens_primary: Option<f64>,
    pub mean_output_tokens_shadow: Option<f64>,
    /// Deterministic requests whose outputs were both read whole.
    pub deterministic: u64,
    pub identical: u64,
    pub identical_fraction: Option<f64>,
    pub mean_prefix_fraction: Option<f64>,
    /// p99 of the per-request deltas per metric: (key, value, bootstrap interval).
    pub delta_p99: Vec<(String, f64, (f64, f64))>,
    /// The sides are replay results, which keep no outputs: agreement is not known.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub outputs_unknown: bool,
}

/// One target's pairs while the recording is read.
#[derive(Default)]
struct Acc {
    sum: TargetSummary,
    lat: [Vec<(f64, f64)>; 4],
    out: (f64, f64, u64),
    prefix_sum: f64,
}

impl Acc {
    fn add(&mut self, req: &Request, primary: &Response, c: &ShadowCopy) {
        self.sum.copies += 1;
        let Some(s) = c.response.as_deref().filter(|_| c.skipped.is_none()) else {
            let why = c.skipped.clone().unwrap_or_else(|| "no_response".into());
            match self.sum.skipped.iter_mut().find(|(w, _)| *w == why) {
                Some((_, n)) => *n += 1,
                None => self.sum.skipped.push((why, 1)),
            }
            return;
        };
        let (p_ok, s_ok) = (primary.completed(), s.completed());
        self.sum.primary_failed += u64::from(!p_ok && !primary.cancelled);
        self.sum.shadow_failed += u64::from(!s_ok);
        if let Some(a) = c.agreement {
            self.sum.deterministic += 1;
            self.sum.identical += u64::from(a.identical());
            self.prefix_sum += a.prefix_fraction();
        }
        if !(p_ok && s_ok) {
            return;
        }
        let (a, b) = (
            from_ready(latencies(primary, req.output_tokens), c.ready_us),
            latencies(s, c.output_tokens),
        );
        self.pair(a, b, (req.output_tokens, c.output_tokens));
    }

    /// A request both sides completed: its latencies, and each side's output tokens.
    fn pair(&mut self, a: Lat, b: Lat, out: (u64, u64)) {
        self.sum.pairs += 1;
        self.out.0 += out.0 as f64;
        self.out.1 += out.1 as f64;
        self.out.2 += 1;
        if self.lat[3].len() >= MAX_PAIRS {
            self.sum.pairs_unused += 1;
            return;
        }
        for m in 0..4 {
            if let (Some(x), Some(y)) = (a[m], b[m]) {
                self.lat[m].push((x, y));
            }
        }
    }

    fn finish(&mut self) {
        let s = &mut self.sum;
        let sent = s.copies - s.skipped.iter().map(|(_, n)| n).sum::<u64>();
        if sent > 0 {
            s.shadow_failure_rate = Some(s.shadow_failed as f64 / sent as f64);
            s.primary_failure_rate = Some(s.primary_failed as f64 / sent as f64);
        }
        if self.out.2 > 0 {
            s.mean_output_tokens_primary = Some(self.out.0 / self.out.2 as f64);
            s.mean_output_tokens_shadow = Some(self.out.1 / self.out.2 as f64);
        }
        if s.deterministic > 0 {
            s.identical_fraction = Some(s.identical as f64 / s.deterministic as f64);
            s.mean_prefix_fraction = Some(self.prefix_sum / s.deterministic as f64);
        }
    }
}

/// The primary's latencies `lat` timed from `ready_us` after its arrival (its request whole,
/// the copy offered), as the copy's are from its send: TTFT and E2EL less that time, so that
/// the client's upload of the body counts on neither side.
fn from_ready(mut lat: Lat, ready_us: u64) -> Lat {
    let ready_ms = ready_us as f64 / 1000.0;
    for m in [0, 3] {
        lat[m] = lat[m].map(|v| (v - ready_ms).max(0.0));
    }
    lat
}

/// The statistics of a paired metric: (key prefix, value of pairs).
#[derive(Clone, Copy)]
enum Stat {
    /// Mean of the deltas.
    Mean,
    /// Median of the deltas.
    MedianDelta,
    /// p99 of the shadow side minus p99 of the primary side.
    P99Diff,
    /// p99 of the deltas (reported, not a row).
    P99Delta,
}

impl Stat {
    /// The statistic whose sample floor (`compare::min_samples`) applies.
    fn weighted(self) -> super::weighted::Stat {
        match self {
            Stat::Mean => super::weighted::Stat::Mean,
            Stat::MedianDelta => super::weighted::Stat::Median,
            Stat::P99Diff | Stat::P99Delta => super::weighted::Stat::P99,
        }
    }
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

fn stat(pairs: &[(f64, f64)], s: Stat) -> f64 {
    let deltas = || sorted(pairs.iter().map(|(a, b)| b - a).collect());
    match s {
        Stat::Mean => pairs.iter().map(|(a, b)| b - a).sum::<f64>() / pairs.len() as f64,
        Stat::MedianDelta => percentile_sorted(&deltas(), 50.0),
        Stat::P99Delta => percentile_sorted(&deltas(), 99.0),
        Stat::P99Diff => {
            let a = sorted(pairs.iter().map(|p| p.0).collect());
            let b = sorted(pairs.iter().map(|p| p.1).collect());
            percentile_sorted(&b, 99.0) - percentile_sorted(&a, 99.0)
        }
    }
}

/// The paired bootstrap interval of `s` (pairs resampled together).
fn interval(pairs: &[(f64, f64)], s: Stat, opts: &Settings, salt: u64) -> (f64, f64) {
    let step = pairs.len().div_ceil(BOOTSTRAP_MAX).max(1);
    let base: Vec<(f64, f64)> = pairs.iter().step_by(step).copied().collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(opts.seed ^ salt);
    let mut draw = Vec::with_capacity(base.len());
    let mut got: Vec<f64> = (0..opts.resamples.max(1))
        .map(|_| {
            draw.clear();
            draw.extend((0..base.len()).map(|_| base[rng.random_range(0..base.len())]));
            stat(&draw, s)
        })
        .collect();
    got.sort_by(f64::total_cmp);
    let alpha = (1.0 - compare::CONFIDENCE) / 2.0 * 100.0;
    (
        percentile_sorted(&got, alpha),
        percentile_sorted(&got, 100.0 - alpha),
    )
}

/// One target's rows: per metric, mean and median of the deltas and the p99 difference.
fn rows(acc: &Acc, opts: &Settings) -> Vec<MetricRow> {
    let mut rows = Vec::new();
    for (m, (key, label)) in METRICS.iter().enumerate() {
        let pairs = &acc.lat[m];
        if pairs.len() < 2 {
            continue;
        }
        let a = sorted(pairs.iter().map(|p| p.0).collect());
        let b = sorted(pairs.iter().map(|p| p.1).collect());
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let stats = [
            ("mean", Stat::Mean, mean(&a), mean(&b)),
            (
                "median",
                Stat::MedianDelta,
                percentile_sorted(&a, 50.0),
                percentile_sorted(&b, 50.0),
            ),
            (
                "p99",
                Stat::P99Diff,
                percentile_sorted(&a, 99.0),
                percentile_sorted(&b, 99.0),
            ),
        ];
        for (k, (name, s, pa, pb)) in stats.into_iter().enumerate() {
            let change = stat(pairs, s);
            // as in `compare`: a statistic of too few pairs has no interval (n/a)
            let enough = pairs.len() as u64 >= compare::min_samples(s.weighted());
            let ci = enough.then(|| interval(pairs, s, opts, (m * 8 + k) as u64));
            rows.push(MetricRow {
                key: format!("{name}_{key}_ms"),
                label: format!("{name} {label}"),
                unit: "ms",
                baseline: Some(pa),
                candidate: Some(pb),
                abs_change: Some(change),
                rel_change: (pa != 0.0).then(|| change / pa),
                better: Better::Lower,
                ci,
                noise: None,
                significant: None,
                verdict: compare::Verdict::Unknown,
                approx: false,
                effect_base: Some(pa),
            });
        }
    }
    rows
}

/// The failure-rate row (shadow against primary, on the same requests).
fn failure_row(s: &TargetSummary) -> Option<MetricRow> {
    let (pa, pb) = (s.primary_failure_rate?, s.shadow_failure_rate?);
    Some(MetricRow {
        key: "failure_rate".into(),
        label: "failure rate".into(),
        unit: "",
        baseline: Some(pa),
        candidate: Some(pb),
        abs_change: Some(pb - pa),
        rel_change: (pa != 0.0).then(|| (pb - pa) / pa),
        better: Better::Lower,
        ci: None,
        noise: None,
        significant: None,
        verdict: compare::Verdict::Unknown,
        approx: false,
        effect_base: None,
    })
}

/// One candidate's judgement.
#[derive(Debug, Clone, Serialize)]
pub struct ShadowComparison {
    pub target: TargetSummary,
    /// The control the candidate was judged against, if the recording has one.
    pub control: Option<TargetSummary>,
    pub comparison: Comparison,
}

/// Reads the recordings and judges each candidate.
pub(crate) fn compare_shadows(
    paths: &[PathBuf],
    opts: &Settings,
) -> anyhow::Result<Vec<ShadowComparison>> {
    let (targets, mut accs) = read(paths)?;
    for a in &mut accs {
        a.finish();
    }
    let all_rows: Vec<Vec<MetricRow>> = accs.iter().map(|a| rows(a, opts)).collect();
    let control = targets.iter().position(|(r, _)| *r == Role::Control);
    let control = control.map(|c| (&accs[c].sum, all_rows[c].as_slice()));
    let label = paths_label(paths);
    let out: Vec<ShadowComparison> = targets
        .iter()
        .enumerate()
        .filter(|(_, (role, _))| *role == Role::Candidate)
        .map(|(k, _)| judge(&accs[k], all_rows[k].clone(), control, &label, opts))
        .collect();
    if out.is_empty() {
        anyhow::bail!("{label}: no shadow candidate in this recording (record with --shadow URL)");
    }
    Ok(out)
}

/// One candidate's rows settled against the control's changes (the noise band), its summary
/// with the p99 of its per-request deltas, and the notes on what was left out.
fn judge(
    acc: &Acc,
    mut rows: Vec<MetricRow>,
    control: Option<(&TargetSummary, &[MetricRow])>,
    label: &str,
    opts: &Settings,
) -> ShadowComparison {
    rows.extend(failure_row(&acc.sum));
    for row in &mut rows {
        row.noise = control.and_then(|(_, c)| {
            let r = c.iter().find(|r| r.key == row.key)?;
            r.abs_change.map(f64::abs)
        });
        compare::settle(row, opts.min_effect);
    }
    let mut sum = acc.sum.clone();
    let floor = compare::min_samples(super::weighted::Stat::P99) as usize;
    sum.delta_p99 = METRICS
        .iter()
        .enumerate()
        .filter(|(m, _)| acc.lat[*m].len() >= floor)
        .map(|(m, (key, _))| {
            let pairs = &acc.lat[m];
            let ci = interval(pairs, Stat::P99Delta, opts, 100 + m as u64);
            let p99 = stat(pairs, Stat::P99Delta);
            (format!("p99_delta_{key}_ms"), p99, ci)
        })
        .collect();
    let side = |what: String, n: u64, kind: &'static str| Side {
        path: what,
        kind,
        requests: Some(n as f64),
    };
    let comparison = Comparison {
        schema: compare::SCHEMA,
        baseline: side(label.to_string(), sum.pairs, "primary"),
        candidate: side(
            format!("shadow {} {}", sum.index, sum.url),
            sum.pairs,
            "shadow",
        ),
        noise: control
            .map(|(c, _)| {
                let what = format!("shadow {} {} (control)", c.index, c.url);
                side(what, c.pairs, "shadow")
            })
            .into_iter()
            .collect(),
        seed: opts.seed,
        confidence: compare::CONFIDENCE,
        resamples: opts.resamples,
        rows,
        paired: None,
        workload: None,
        notes: notes(acc, floor),
    };
    ShadowComparison {
        target: sum,
        control: control.map(|(c, _)| c.clone()),
        comparison,
    }
}

/// A shadow target of a recording beside its primary, for `retrace report`.
pub(crate) struct Beside {
    /// `shadow K (candidate URL)`.
    pub(crate) name: String,
    /// The shadow's answers, one row per copy sent, at its request's arrival (the primary's
    /// clock, so the two timelines line up).
    pub(crate) requests: crate::result::Requests,
    /// Requests both sides completed.
    pub(crate) pairs: u64,
    /// Per-request change, shadow − primary, in ms: TTFT and E2EL, of the pairs kept.
    pub(crate) ttft_delta_ms: Vec<f64>,
    pub(crate) e2el_delta_ms: Vec<f64>,
}

impl Beside {
    /// The side named `name`, its rows `requests`, and the deltas of its pairs with the primary.
    fn of(name: String, requests: crate::result::Requests, acc: &Acc) -> Beside {
        let delta = |m: usize| acc.lat[m].iter().map(|(a, b)| b - a).collect();
        Beside {
            name,
            requests,
            pairs: acc.sum.pairs,
            ttft_delta_ms: delta(0),
            e2el_delta_ms: delta(3),
        }
    }
}

/// Each shadow's result beside `replay --shadow` result `path`, paired with its rows `target`
/// row by row, for `retrace report`: none without a shadow's result beside it. Bounded as the
/// result reader bounds each file; an error names the file that cannot be paired.
pub(crate) fn beside_results(
    path: &Path,
    target: &crate::result::Requests,
) -> anyhow::Result<Vec<Beside>> {
    let mut out = Vec::new();
    for (k, (role, sp)) in results_beside(path).into_iter().enumerate() {
        let shadow = load_rows(&sp)?;
        let acc = side_rows(path, target, &shadow, k + 1, role, &sp)?;
        let name = match role {
            Role::Control => format!("control ({})", sp.display()),
            Role::Candidate => format!("shadow {} (candidate {})", k + 1, sp.display()),
        };
        out.push(Beside::of(name, shadow, &acc));
    }
    Ok(out)
}

/// Each shadow target of recording `t` beside its primary (none when it has no shadow). Bounded
/// as the recording is: one row per copy, at most [`MAX_PAIRS`] deltas per metric.
pub(crate) fn beside(t: &crate::trace::Trace) -> Vec<Beside> {
    let targets = ts::targets(&t.header.meta);
    if targets.is_empty() {
        return Vec::new();
    }
    let work: Vec<&Request> = t.requests.iter().filter(|r| r.is_workload()).collect();
    let t0 = work.iter().map(|q| q.arrival_us).min().unwrap_or(0);
    let side = |k: usize, role: Role, url: &str| {
        let mut acc = Acc::default();
        let copies = work.iter().filter_map(|r| {
            let c = r.shadows.iter().find(|c| usize::from(c.target) == k)?;
            if let Some(p) = r.response.as_deref() {
                acc.add(r, p, c);
            }
            c.skipped.is_none().then_some(super::load::Answered {
                input_tokens: r.input_tokens,
                output_tokens: c.output_tokens,
                arrival_us: r.arrival_us,
                response: c.response.as_deref(),
            })
        });
        let requests = super::load::answered_requests(copies, t0);
        let name = format!("shadow {k} ({} {url})", role.as_str());
        Beside::of(name, requests, &acc)
    };
    (targets.iter().enumerate())
        .map(|(k, (role, url))| side(k, *role, url))
        .collect()
}

/// What a candidate's comparison leaves out, said.
fn notes(acc: &Acc, floor: usize) -> Vec<String> {
    let mut notes = Vec::new();
    if acc.sum.pairs < floor as u64 {
        notes.push(format!(
            "too few pairs to judge p99 (needs {floor}): shown as n/a, and no p99 of the per-request delta"
        ));
    }
    if acc.sum.pairs_unused > 0 {
        notes.push(format!(
            "{} pairs past the first {MAX_PAIRS} were counted, not used",
            acc.sum.pairs_unused
        ));
    }
    let kept = acc.lat[3].len();
    if kept > BOOTSTRAP_MAX {
        notes.push(format!(
            "intervals drawn from {BOOTSTRAP_MAX} pairs of {kept} (an even stride): wider than the whole would give"
        ));
    }
    notes
}

fn paths_label(paths: &[PathBuf]) -> String {
    let v: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    v.join(", ")
}

/// A recording's shadow targets by index.
type Targets = Vec<(Role, String)>;

/// The targets and their pairs: of a shadowed recording's files, or of a `replay --shadow`
/// result (a JSON object, known by its content) and the shadows' results beside it.
fn read(paths: &[PathBuf]) -> anyhow::Result<(Targets, Vec<Acc>)> {
    match paths {
        [p] if is_json_object(p) => read_results(p),
        _ => read_recordings(paths),
    }
}

/// The file's first byte other than white space is `{` (a result; a native trace is zstd).
fn is_json_object(p: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 64];
    let n = std::fs::File::open(p).and_then(|mut f| f.read(&mut head));
    let head = &head[..n.unwrap_or(0)];
    head.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// A `replay --shadow` target's result and each `NAME.shadow-K.json` (and `NAME.control.json`)
/// beside it, paired by request (the sides sent the same plan, so row i of each is the same
/// request).
fn read_results(path: &Path) -> anyhow::Result<(Targets, Vec<Acc>)> {
    let target = load_rows(path)?;
    let mut targets = Targets::new();
    let mut accs = Vec::new();
    for (k, (role, sp)) in results_beside(path).into_iter().enumerate() {
        let shadow = load_rows(&sp)?;
        accs.push(side_rows(path, &target, &shadow, k + 1, role, &sp)?);
        targets.push((role, sp.display().to_string()));
    }
    if !targets.iter().any(|(r, _)| *r == Role::Candidate) {
        let beside = crate::result::shadow_result_path(path, 1);
        anyhow::bail!(
            "{}: no shadow's result beside it ({}; replay with --shadow URL --result-json {})",
            path.display(),
            beside.display(),
            path.display()
        );
    }
    Ok((targets, accs))
}

/// The results beside `replay --shadow` result `path`: each `NAME.shadow-K.json` there (K from
/// 1, up to the first missing), then `NAME.control.json` if there.
fn results_beside(path: &Path) -> Vec<(Role, PathBuf)> {
    let candidates = (1..=crate::result::MAX_SHADOWS)
        .map(|k| (Role::Candidate, crate::result::shadow_result_path(path, k)))
        .take_while(|(_, p)| p.exists());
    let control = Some(crate::result::control_result_path(path)).filter(|p| p.exists());
    candidates
        .chain(control.map(|p| (Role::Control, p)))
        .collect()
}

/// The side of result `sp` (its rows `shadow`) paired with the target's rows, request by
/// request.
fn side_rows(
    path: &Path,
    target: &crate::result::Requests,
    shadow: &crate::result::Requests,
    index: usize,
    role: Role,
    sp: &Path,
) -> anyhow::Result<Acc> {
    if shadow.len() != target.len() || shadow.input_lens != target.input_lens {
        anyhow::bail!(
            "{}: not the same requests as {} ({} against {} rows, or other input lengths)",
            sp.display(),
            path.display(),
            shadow.len(),
            target.len()
        );
    }
    let mut acc = Acc {
        sum: TargetSummary {
            index,
            role: role.as_str(),
            url: sp.display().to_string(),
            outputs_unknown: true,
            ..Default::default()
        },
        ..Default::default()
    };
    for i in 0..target.len() {
        acc.add_row(target, shadow, i);
    }
    Ok(acc)
}

/// A result's per-request rows, or an error naming the file.
fn load_rows(p: &Path) -> anyhow::Result<crate::result::Requests> {
    let run = super::load::load(p).map_err(|e| anyhow::anyhow!("{e}"))?;
    run.requests.ok_or_else(|| {
        anyhow::anyhow!(
            "{}: no per-request rows (a replay with --shadow writes them; else --detailed)",
            p.display()
        )
    })
}

/// Row `i`'s latencies in ms; a request answered whole has only its E2EL.
fn row_latencies(r: &crate::result::Requests, i: usize) -> Lat {
    let ms = |s: f64| s * 1000.0;
    let e2el = r.latency_s[i].map(ms);
    let whole = r.non_streamed.get(i).copied().unwrap_or(false);
    let Some(ttft) = r.ttft_s[i].map(ms).filter(|_| !whole) else {
        return [None, None, None, e2el];
    };
    let out = r.output_lens[i];
    let tpot = e2el
        .filter(|_| out > 1)
        .map(|e| (e - ttft) / (out - 1) as f64);
    let gaps = &r.itls_s[i];
    let itl = (!gaps.is_empty()).then(|| ms(gaps.iter().sum::<f64>()) / gaps.len() as f64);
    [Some(ttft), tpot, itl, e2el]
}

impl Acc {
    /// Row `i` of two results of the same plan: counted, and paired when both succeeded.
    fn add_row(&mut self, a: &crate::result::Requests, b: &crate::result::Requests, i: usize) {
        self.sum.copies += 1;
        let ok = |r: &crate::result::Requests| r.errors[i].is_empty();
        let (p_ok, s_ok) = (ok(a), ok(b));
        self.sum.primary_failed += u64::from(!p_ok);
        self.sum.shadow_failed += u64::from(!s_ok);
        if p_ok && s_ok {
            let out = (a.output_lens[i], b.output_lens[i]);
            self.pair(row_latencies(a, i), row_latencies(b, i), out);
        }
    }
}

/// The targets (from the first file; every file must name the same) and their pairs.
fn read_recordings(paths: &[PathBuf]) -> anyhow::Result<(Targets, Vec<Acc>)> {
    let mut targets: Option<Targets> = None;
    let mut accs: Vec<Acc> = Vec::new();
    for p in paths {
        let stream = open(p)?;
        let t = ts::targets(&stream.header.meta);
        match &targets {
            None => {
                if t.is_empty() {
                    anyhow::bail!(
                        "{}: not a shadowed recording (its header names no shadow; record with --shadow URL)",
                        p.display()
                    );
                }
                accs = t
                    .iter()
                    .enumerate()
                    .map(|(k, (role, url))| Acc {
                        sum: TargetSummary {
                            index: k,
                            role: role.as_str(),
                            url: url.clone(),
                            ..Default::default()
                        },
                        ..Default::default()
                    })
                    .collect();
                targets = Some(t);
            }
            Some(first) if *first != t => anyhow::bail!(
                "{}: its shadow targets differ from {}'s",
                p.display(),
                paths[0].display()
            ),
            Some(_) => {}
        }
        for r in stream {
            let r = r?;
            let Some(primary) = r.response.as_deref() else {
                continue;
            };
            for c in &r.shadows {
                if let Some(a) = accs.get_mut(usize::from(c.target)) {
                    a.add(&r, primary, c);
                }
            }
        }
    }
    Ok((targets.unwrap_or_default(), accs))
}

fn open(p: &Path) -> anyhow::Result<crate::trace::stream::TraceStream> {
    let opts = crate::trace::import::ImportOptions {
        format: Some(crate::trace::import::Format::Native),
        ..Default::default()
    };
    Ok(crate::trace::stream::open(p, &opts)?)
}

/// Schema of `compare --shadow --format json`.
pub const SCHEMA: &str = "retrace.compare-shadow/1";

/// Each candidate's comparison as `compare` renders one, then what only a shadow has: failures,
/// skips, output tokens, agreement and the p99 of the per-request deltas. JSON: `{schema,
/// shadows: [{target, control, comparison}]}`, `comparison` as `compare --format json` writes it.
pub(crate) fn render(
    judged: &[ShadowComparison],
    outcomes: &[Vec<super::rules::RuleOutcome>],
    format: super::render::RenderFormat,
) -> String {
    use super::render::RenderFormat;
    use std::fmt::Write as _;
    if format == RenderFormat::Json {
        let shadows: Vec<serde_json::Value> = judged
            .iter()
            .zip(outcomes)
            .map(|(j, o)| {
                let cmp = super::render::render(&j.comparison, o, RenderFormat::Json);
                serde_json::json!({
                    "target": j.target,
                    "control": j.control,
                    "comparison": serde_json::from_str::<serde_json::Value>(&cmp)
                        .unwrap_or(serde_json::Value::Null),
                })
            })
            .collect();
        let doc = serde_json::json!({ "schema": SCHEMA, "shadows": shadows });
        return serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n";
    }
    let md = format == RenderFormat::Markdown;
    let mut s = String::new();
    for (j, o) in judged.iter().zip(outcomes) {
        let t = &j.target;
        let control = j.control.as_ref().map_or(String::from("no control"), |c| {
            format!("control: shadow {} {}", c.index, c.url)
        });
        let head = format!(
            "shadow {} {} against the primary: {} pairs of {} copies ({control})",
            t.index, t.url, t.pairs, t.copies
        );
        let _ = writeln!(s, "{}{head}\n", if md { "## " } else { "" });
        s.push_str(&super::render::render(&j.comparison, o, format));
        let _ = writeln!(s);
        for line in extra_lines(t) {
            let _ = writeln!(s, "{}{line}", if md { "- " } else { "  " });
        }
        let _ = writeln!(s);
    }
    s
}

fn pct(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |x| format!("{:.1} %", x * 100.0))
}

/// The shadow-only lines of one target.
fn extra_lines(t: &TargetSummary) -> Vec<String> {
    let sent = t.copies - t.skipped.iter().map(|(_, n)| n).sum::<u64>();
    let mut v = vec![format!(
        "failures on the same requests: primary {}, shadow {} of {sent} copies sent",
        pct(t.primary_failure_rate),
        pct(t.shadow_failure_rate)
    )];
    if !t.skipped.is_empty() {
        let parts: Vec<String> = t.skipped.iter().map(|(w, n)| format!("{w} {n}")).collect();
        v.push(format!("copies skipped: {}", parts.join(", ")));
    }
    if let (Some(a), Some(b)) = (t.mean_output_tokens_primary, t.mean_output_tokens_shadow) {
        v.push(format!(
            "output tokens per pair: mean {a:.1} primary, {b:.1} shadow"
        ));
    }
    v.push(match t.deterministic {
        _ if t.outputs_unknown => "output agreement: not known (replay results keep no outputs; a recording made with record --shadow has it)".into(),
        0 => "output agreement: no deterministic request (temperature 0 or a seed) read whole on both sides".into(),
        n => format!(
            "output agreement, {n} deterministic requests: {} identical, mean agreeing prefix {}",
            pct(t.identical_fraction),
            pct(t.mean_prefix_fraction)
        ),
    });
    if !t.delta_p99.is_empty() {
        let parts: Vec<String> = t
            .delta_p99
            .iter()
            .map(|(k, d, (lo, hi))| {
                let name = k.trim_start_matches("p99_delta_").trim_end_matches("_ms");
                format!("{} {d:+.2} ms [{lo:+.2}, {hi:+.2}]", name.to_uppercase())
            })
            .collect();
        v.push(format!(
            "p99 of the per-request delta (shadow − primary, 99 % interval): {}",
            parts.join(", ")
        ));
    }
    v
}
