//! Workload comparison (pure): what was sent, not how fast it was served. For each side the
//! arrival rate, burstiness (coefficient of variation of inter-arrival gaps: 1 for Poisson,
//! above 1 bursty), input/output length distributions, prefix reuse and model/endpoint mix; between
//! the sides a two-sample Kolmogorov–Smirnov statistic and asymptotic p-value for ISL and OSL.
//!
//! Fidelity mode (a recorded trace against a replay result of it): request by request, how far
//! the replay's send times were from the trace's arrivals (scaled by the run's `speed`) and how
//! often input and output lengths were reproduced exactly. Result files carry no hash ids, so
//! prefix sharing is compared only between two traces. This module prints nothing.

use super::load::{Kind, Metric, Run};
use crate::trace::select::{self, Selection};
use crate::trace::stats::{self, Dist, Reuse};
use crate::trace::Trace;
use serde::Serialize;
use std::collections::BTreeMap;

/// One side's workload figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Shape {
    pub(crate) requests: usize,
    pub(crate) duration_s: f64,
    pub(crate) rate_rps: f64,
    /// Coefficient of variation of inter-arrival gaps.
    pub(crate) gap_cv: f64,
    pub(crate) isl: Dist,
    pub(crate) osl: Dist,
    /// Traces only.
    pub(crate) reuse: Option<Reuse>,
    pub(crate) models: BTreeMap<String, u64>,
    pub(crate) endpoints: BTreeMap<String, u64>,
    /// A trace's side requests (`/tokenize`, `GET /v1/models`, ...), left out of every figure.
    pub(crate) auxiliary_left_out: u64,
}

/// Two-sample Kolmogorov–Smirnov result.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Ks {
    /// sup |F1 − F2|.
    pub d: f64,
    /// Asymptotic p-value (Kolmogorov distribution with Stephens' small-sample correction).
    pub(crate) p_value: f64,
}

/// A recorded trace against its replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fidelity {
    /// Requests paired by position.
    pub paired: usize,
    pub(crate) speed: f64,
    /// |actual send offset − arrival offset / speed|, ms.
    pub arrival_error_ms: Dist,
    /// Fractions of paired requests with exactly the trace's input / output length. The input
    /// length is the server's count (`usage.prompt_tokens`) where the replay got one, else the
    /// length the replay meant to send. Of the requests whose recorded input length is not an
    /// estimate (1 when every one is).
    pub isl_exact: f64,
    /// Paired requests whose input length the server counted.
    pub isl_server_counted: usize,
    /// Paired requests whose recorded input length was an estimate (recorded without usage, a
    /// tokenizer or the server's count: `InputCount::Estimated`): not judged.
    #[serde(skip_serializing_if = "is_zero")]
    pub isl_estimated: usize,
    pub osl_exact: f64,
    /// Mean |output length − trace output length| over successful requests.
    pub(crate) osl_mean_abs_diff: f64,
    /// Prompts the replayer could not build at the exact length (retrace's `inexact_prompts`).
    pub(crate) inexact_prompts: Option<f64>,
    /// |intended send offset − arrival offset / speed|, ms (retrace results: the schedule
    /// itself, free of the machine's send lateness).
    pub schedule_error_ms: Option<Dist>,
    /// Requests of the trace the replay should have sent (its own selection) and did not.
    pub unpaired: usize,
    /// Workload requests of the trace the replay's selection left out (a chat request without a
    /// tokenizer, `--skip-recorded-failures`, ...; side requests are not counted).
    pub left_out: usize,
    /// Two-sample KS statistic D between the recorded and the replayed TTFT, ITL, E2EL, both
    /// of one population: the paired requests that completed in the recording and in the replay.
    pub(crate) latency_ks: BTreeMap<String, f64>,
    /// Paired requests that completed on both sides (a recording's by
    /// [`crate::trace::Response::completed`], a replay's with a first token and no error): the
    /// only ones whose lengths and latency are judged.
    pub completed_both: usize,
    /// Paired requests that did not complete in the recording, by kind (`cancelled`: the client
    /// went away; else the recorded failure, `http_500`, `upstream_connect`, ...): not judged,
    /// and no fault of the replay.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub recorded_apart: BTreeMap<String, Apart>,
    /// Paired requests that completed in the recording and failed in the replay, by the
    /// replay's failure kind: the target's failures, not judged for lengths or latency.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub replay_failed: BTreeMap<String, Apart>,
    /// The coarser of the two sides' time resolutions ([`resolution_s`]), ms.
    pub(crate) time_resolution_ms: f64,
    /// How far behind the recording the actual sends may be at p99 ([`send_tolerance_ms`]).
    pub(crate) send_tolerance_ms: f64,
    /// The actual sends (`arrival_error_ms`) were within `send_tolerance_ms` at p99.
    pub sent_on_time: bool,
    /// Every workload request sent and paired, lengths reproduced, the intended schedule within
    /// 1 ms at p99 and the actual sends within `send_tolerance_ms`.
    pub faithful: bool,
}

/// Requests of one kind, reported apart: how many, and the first few request indices (their
/// position among the paired requests, which is their index in the replay's per-request arrays).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Apart {
    pub(crate) count: usize,
    pub first: Vec<usize>,
}

/// Request indices an [`Apart`] names.
pub(crate) const APART_NAMED: usize = 5;

fn note_apart(m: &mut BTreeMap<String, Apart>, kind: &str, i: usize) {
    let a = m.entry(kind.to_string()).or_default();
    a.count += 1;
    if a.first.len() < APART_NAMED {
        a.first.push(i);
    }
}

/// Why a recorded request did not complete (`None`: it completed, or the trace recorded no
/// response, as an imported trace does not).
fn recorded_apart_kind(q: &crate::trace::Request) -> Option<String> {
    let r = q.response.as_deref()?;
    if r.completed() {
        return None;
    }
    if r.cancelled {
        return Some("cancelled".into());
    }
    Some(q.recorded_failure().map_or_else(
        || "failed".into(),
        |k| match k {
            "http_error" => format!("http_{}", r.status),
            k => k.to_string(),
        },
    ))
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The intended schedule may differ from the recording by this much at p99 and still be
/// faithful.
pub(crate) const FAITHFUL_SCHEDULE_MS: f64 = 1.0;

/// The actual sends may differ from the recording by this much at p99 (or by one tick of the
/// coarser time resolution, if larger) and still be faithful: a client's own send lateness on a
/// busy machine is of this order, and a run later than this is not "as recorded".
pub(crate) const FAITHFUL_SEND_MS: f64 = 10.0;

/// [`FAITHFUL_SEND_MS`], or one tick of the coarser time resolution when that is larger.
pub(crate) fn send_tolerance_ms(resolution_ms: f64) -> f64 {
    FAITHFUL_SEND_MS.max(resolution_ms)
}

/// The time resolution of a set of instants (seconds): the largest of 1 s, 100 ms, ... 1 µs
/// that every offset from the first is a whole multiple of (a Mooncake trace's integer
/// milliseconds: 1 ms; a recording's microseconds: 1 µs).
pub(crate) fn resolution_s(times: &[f64]) -> f64 {
    let Some(&t0) = times.first() else {
        return 1e-6;
    };
    let ticks = [1.0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5];
    let whole = |tick: f64| {
        times.iter().all(|&t| {
            let k = (t - t0) / tick;
            (k - k.round()).abs() < 1e-6 * k.abs().max(1.0)
        })
    };
    ticks.into_iter().find(|&t| whole(t)).unwrap_or(1e-6)
}

/// `times` on a grid of `tick` seconds (rounded to the nearest tick from the first).
fn on_grid(times: &[f64], tick: f64) -> Vec<f64> {
    let t0 = times.first().copied().unwrap_or(0.0);
    times
        .iter()
        .map(|&t| ((t - t0) / tick).round() * tick)
        .collect()
}

/// The workload section of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadCmp {
    pub(crate) baseline: Shape,
    pub(crate) candidate: Shape,
    pub isl_ks: Ks,
    pub osl_ks: Ks,
    /// Between the inter-arrival gaps of the two sides, both read at the coarser of their
    /// time resolutions (`gaps_resolution_ms`): a Mooncake trace's 0 ms gaps and a recording's
    /// sub-millisecond ones of the same schedule are the same gaps.
    pub(crate) gaps_ks: Ks,
    pub(crate) gaps_resolution_ms: f64,
    pub fidelity: Option<Fidelity>,
}

struct View {
    arrivals_s: Vec<f64>,
    isl: Vec<f64>,
    osl: Vec<f64>,
    shape_extra: Option<stats::TraceStats>,
}

fn view(r: &Run) -> Option<View> {
    let (isl, osl) = lengths(r)?;
    let (arrivals_s, shape_extra) = match (&r.trace, &r.requests) {
        (Some(t), _) => (
            t.requests
                .iter()
                .filter(|q| q.is_workload())
                .map(|q| q.arrival_us as f64 / 1e6)
                .collect(),
            Some(stats::compute(t, &Default::default())),
        ),
        (None, Some(q)) => (
            q.intended_s.clone().unwrap_or_else(|| q.start_s.clone()),
            None,
        ),
        (None, None) => return None,
    };
    Some(View {
        arrivals_s,
        isl,
        osl,
        shape_extra,
    })
}

/// Input lengths of the workload requests (a trace's side requests left out) and, as a result
/// file counts them, output lengths of those that succeeded.
pub(crate) fn lengths(r: &Run) -> Option<(Vec<f64>, Vec<f64>)> {
    if let Some(t) = &r.trace {
        let work = || t.requests.iter().filter(|q| q.is_workload());
        let osl = work().filter(|q| q.recorded_failure().is_none());
        return Some((
            work().map(|q| q.input_tokens as f64).collect(),
            osl.map(|q| q.output_tokens as f64).collect(),
        ));
    }
    let q = r.requests.as_ref()?;
    Some((
        q.input_lens.iter().map(|&v| v as f64).collect(),
        (0..q.len())
            .filter(|&i| q.ok(i))
            .map(|i| q.output_lens[i] as f64)
            .collect(),
    ))
}

/// Gaps between sorted arrivals.
fn gaps(arrivals: &[f64]) -> Vec<f64> {
    let mut a = arrivals.to_vec();
    a.sort_by(f64::total_cmp);
    a.windows(2).map(|w| w[1] - w[0]).collect()
}

/// Coefficient of variation of the gaps between sorted arrivals (population std / mean).
pub(crate) fn gap_cv(arrivals: &[f64]) -> f64 {
    let gaps = gaps(arrivals);
    if gaps.len() < 2 {
        return 0.0;
    }
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    if mean <= 0.0 {
        return 0.0;
    }
    let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
    var.sqrt() / mean
}

fn shape(v: &View) -> Shape {
    let n = v.arrivals_s.len();
    let lo = v.arrivals_s.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v
        .arrivals_s
        .iter()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max);
    let duration_s = if n > 0 { hi - lo } else { 0.0 };
    let (reuse, models, endpoints, aux) = match &v.shape_extra {
        Some(s) => (
            Some(s.reuse.clone()),
            s.models.clone(),
            s.endpoints.clone(),
            s.auxiliary.values().sum(),
        ),
        None => (None, BTreeMap::new(), BTreeMap::new(), 0),
    };
    Shape {
        requests: n,
        duration_s,
        rate_rps: if duration_s > 0.0 {
            n as f64 / duration_s
        } else {
            0.0
        },
        gap_cv: gap_cv(&v.arrivals_s),
        isl: Dist::of(v.isl.clone()),
        osl: Dist::of(v.osl.clone()),
        reuse,
        models,
        endpoints,
        auxiliary_left_out: aux,
    }
}

/// Two-sample KS statistic and asymptotic p-value.
pub fn ks_2samp(a: &[f64], b: &[f64]) -> Ks {
    if a.is_empty() || b.is_empty() {
        return Ks {
            d: 0.0,
            p_value: 1.0,
        };
    }
    let mut x = a.to_vec();
    let mut y = b.to_vec();
    x.sort_by(f64::total_cmp);
    y.sort_by(f64::total_cmp);
    let (n1, n2) = (x.len(), y.len());
    let (mut i, mut j, mut d) = (0usize, 0usize, 0f64);
    while i < n1 && j < n2 {
        let v = x[i].min(y[j]);
        while i < n1 && x[i] <= v {
            i += 1;
        }
        while j < n2 && y[j] <= v {
            j += 1;
        }
        d = d.max((i as f64 / n1 as f64 - j as f64 / n2 as f64).abs());
    }
    let en = ((n1 * n2) as f64 / (n1 + n2) as f64).sqrt();
    Ks {
        d,
        p_value: kolmogorov_q((en + 0.12 + 0.11 / en) * d),
    }
}

/// Q_KS(λ) = 2 Σ (−1)^(j−1) exp(−2 j² λ²), the Kolmogorov survival function.
fn kolmogorov_q(lambda: f64) -> f64 {
    if lambda < 0.2 {
        return 1.0;
    }
    let mut sum = 0.0;
    let mut sign = 1.0;
    for j in 1..=100 {
        let term = sign * 2.0 * (-2.0 * (j * j) as f64 * lambda * lambda).exp();
        sum += term;
        if term.abs() < 1e-12 {
            break;
        }
        sign = -sign;
    }
    sum.clamp(0.0, 1.0)
}

/// The trace's workload requests that the replay sent, in arrival order: the replay's own selection
/// (its result says which), or for other tools' results the workload with a prompt.
fn sent_by(t: &Trace, replay: &Run) -> Trace {
    let sel = replay.selection.unwrap_or(Selection {
        text_prompts: true,
        ..Default::default()
    });
    let mut t = t.clone();
    select::select(&mut t, &sel);
    // Side requests a replay sent (`--include-aux`) are counted apart, not in its arrays.
    t.drop_auxiliary();
    t
}

/// Pairs request `i` of the replay with request `i` of what it sent of the trace: both are in
/// arrival (schedule) order, never completion order.
fn fidelity(trace_run: &Run, replay: &Run) -> Option<Fidelity> {
    let whole = trace_run.trace.as_ref()?;
    let t = &sent_by(whole, replay);
    let workload = whole.requests.iter().filter(|q| q.is_workload()).count();
    let left_out = workload.saturating_sub(t.requests.len());
    let q = replay.requests.as_ref()?;
    let n = t.requests.len().min(q.len());
    if n == 0 {
        return None;
    }
    let speed = replay.scalar("speed").filter(|s| *s > 0.0).unwrap_or(1.0);
    let a0 = t.requests[0].arrival_us as f64 / 1e6;
    let s0 = q.start_s[0];
    let want = |i: usize| (t.requests[i].arrival_us as f64 / 1e6 - a0) / speed;
    let schedule_error_ms = q.intended_s.as_ref().filter(|v| v.len() >= n).map(|v| {
        Dist::of(
            (0..n)
                .map(|i| ((v[i] - v[0]) - want(i)).abs() * 1e3)
                .collect(),
        )
    });
    let mut err = Vec::with_capacity(n);
    let (mut isl_ok, mut osl_ok, mut osl_diff, mut ok_n) = (0usize, 0usize, 0f64, 0usize);
    let (mut recorded_apart, mut replay_failed) = (BTreeMap::new(), BTreeMap::new());
    // Judged: the paired requests that completed on both sides; a recorded cancel or failure,
    // and a failure of the target, are counted apart and named instead.
    let mut both = Vec::with_capacity(n);
    let mut isl_judged = 0usize;
    let server_isl = |i: usize| q.server_input_lens.get(i).copied().flatten();
    let isl_server_counted = (0..n).filter(|&i| server_isl(i).is_some()).count();
    // A recorded estimate is no length to reproduce: the replay re-sent the prompt, or one
    // built to the estimate, and either count says nothing of fidelity.
    let estimated = |i: usize| t.requests[i].input_count == crate::trace::InputCount::Estimated;
    let isl_estimated = (0..n).filter(|&i| estimated(i)).count();
    for i in 0..n {
        err.push(((q.start_s[i] - s0) - want(i)).abs() * 1e3);
        if let Some(kind) = recorded_apart_kind(&t.requests[i]) {
            note_apart(&mut recorded_apart, &kind, i);
            continue;
        }
        if !q.ok(i) {
            // A result's error is `kind: detail`; the kind names it.
            let kind = match q.errors[i].split(':').next().unwrap_or("").trim() {
                "" => "no_content",
                k => k,
            };
            note_apart(&mut replay_failed, kind, i);
            continue;
        }
        both.push(i);
        let isl = server_isl(i).unwrap_or(q.input_lens[i]);
        isl_judged += usize::from(!estimated(i));
        isl_ok += usize::from(!estimated(i) && isl == t.requests[i].input_tokens);
        ok_n += 1;
        osl_ok += usize::from(q.output_lens[i] == t.requests[i].output_tokens);
        osl_diff += (q.output_lens[i] as f64 - t.requests[i].output_tokens as f64).abs();
    }
    let arrival_error_ms = Dist::of(err);
    let isl_exact = if isl_judged > 0 {
        isl_ok as f64 / isl_judged as f64
    } else {
        1.0
    };
    // Nothing judged: exact when every pair was a recorded cancel or failure, not when the
    // target failed them all.
    let osl_exact = match (ok_n, replay_failed.is_empty()) {
        (0, true) => 1.0,
        (0, false) => 0.0,
        (k, _) => osl_ok as f64 / k as f64,
    };
    let unpaired = t.requests.len().saturating_sub(q.len());
    let schedule_p99 = schedule_error_ms
        .as_ref()
        .map_or(arrival_error_ms.p99, |d| d.p99);
    let arrivals: Vec<f64> = (0..n)
        .map(|i| t.requests[i].arrival_us as f64 / 1e6)
        .collect();
    let resolution = resolution_s(&arrivals).max(resolution_s(&q.start_s[..n]));
    // The recording's latency by the rule `inspect` uses, indexed as the pairs are.
    let recorded = trace_run.requests.as_ref().map(|_| {
        let paired: Vec<&crate::trace::Request> = t.requests[..n].iter().collect();
        super::load::recorded_requests(&paired)
    });
    let send_tolerance_ms = send_tolerance_ms(resolution * 1e3);
    let sent_on_time = arrival_error_ms.p99 <= send_tolerance_ms;
    let latency_ks = [
        (Metric::Ttft, "ttft"),
        (Metric::Itl, "itl"),
        (Metric::E2el, "e2el"),
    ]
    .into_iter()
    .filter_map(|(m, name)| {
        // One population on both sides: the pairs that completed in both.
        let rec = recorded.as_ref()?;
        let a = rec.samples_ms_of(m, both.iter().copied());
        let b = q.samples_ms_of(m, both.iter().copied());
        (!a.is_empty() && !b.is_empty()).then(|| (name.to_string(), ks_2samp(&a, &b).d))
    })
    .collect();
    Some(Fidelity {
        paired: n,
        speed,
        faithful: unpaired == 0
            && left_out == 0
            && isl_exact == 1.0
            && osl_exact == 1.0
            && schedule_p99 <= FAITHFUL_SCHEDULE_MS
            && sent_on_time,
        time_resolution_ms: resolution * 1e3,
        send_tolerance_ms,
        sent_on_time,
        schedule_error_ms,
        unpaired,
        left_out,
        latency_ks,
        completed_both: ok_n,
        recorded_apart,
        replay_failed,
        arrival_error_ms,
        isl_exact,
        isl_server_counted,
        isl_estimated,
        osl_exact,
        osl_mean_abs_diff: if ok_n > 0 {
            osl_diff / ok_n as f64
        } else {
            0.0
        },
        inexact_prompts: replay.scalar("inexact_prompts"),
    })
}

/// The workload comparison, when both sides carry arrivals and lengths.
pub(crate) fn compare(base: &Run, cand: &Run) -> Option<WorkloadCmp> {
    let (vb, vc) = (view(base)?, view(cand)?);
    let fid = match (base.kind, cand.kind) {
        (Kind::Trace, Kind::Retrace | Kind::Vllm | Kind::Aiperf) => fidelity(base, cand),
        (Kind::Retrace | Kind::Vllm | Kind::Aiperf, Kind::Trace) => fidelity(cand, base),
        _ => None,
    };
    let tick = resolution_s(&vb.arrivals_s).max(resolution_s(&vc.arrivals_s));
    let gaps_at = |a: &[f64]| gaps(&on_grid(a, tick));
    Some(WorkloadCmp {
        baseline: shape(&vb),
        candidate: shape(&vc),
        isl_ks: ks_2samp(&vb.isl, &vc.isl),
        osl_ks: ks_2samp(&vb.osl, &vc.osl),
        gaps_ks: ks_2samp(&gaps_at(&vb.arrivals_s), &gaps_at(&vc.arrivals_s)),
        gaps_resolution_ms: tick * 1e3,
        fidelity: fid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ks_statistic_on_known_samples() {
        // scipy.stats.ks_2samp([1,2,3,4,5], [3,4,5,6,7]).statistic == 0.4
        let k = ks_2samp(&[1., 2., 3., 4., 5.], &[3., 4., 5., 6., 7.]);
        assert!((k.d - 0.4).abs() < 1e-12);
        // disjoint samples: D = 1
        let k = ks_2samp(&[1., 2., 3.], &[10., 11., 12., 13.]);
        assert_eq!(k.d, 1.0);
        // identical samples: D = 0, p = 1
        let k = ks_2samp(&[1., 2., 2., 3.], &[1., 2., 2., 3.]);
        assert_eq!((k.d, k.p_value), (0.0, 1.0));
        // ties across samples are stepped together
        let k = ks_2samp(&[1., 1., 2.], &[1., 2., 2.]);
        assert!((k.d - 1.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn ks_p_value_large_samples() {
        // Uniform grids offset by 10 % of the range, n=1000 each: D = 0.1; the Kolmogorov
        // asymptotic p-value is 2·exp(−2·(√500·0.1)²) ≈ 8e-5.
        let a: Vec<f64> = (0..1000).map(|i| i as f64).collect();
        let b: Vec<f64> = (0..1000).map(|i| i as f64 + 100.0).collect();
        let k = ks_2samp(&a, &b);
        assert!((k.d - 0.1).abs() < 1e-12);
        assert!(k.p_value > 1e-5 && k.p_value < 2e-4, "{}", k.p_value);
        // Interleaved samples of one distribution: large p.
        let c: Vec<f64> = (0..1000).map(|i| i as f64 + 0.5).collect();
        assert!(ks_2samp(&a, &c).p_value > 0.99);
    }

    /// A trace of `arrivals_ms` and a retrace result that planned it exactly and sent request
    /// `i` at `arrival + late_ms(i)`.
    fn trace_and_replay(arrivals_ms: &[f64], late_ms: impl Fn(usize) -> f64) -> (Run, Run) {
        use crate::trace::{Request, Trace, TraceHeader};
        let run = |kind| Run {
            path: "x".into(),
            kind,
            scalars: BTreeMap::new(),
            info: BTreeMap::new(),
            requests: None,
            hists: BTreeMap::new(),
            trace: None,
            server_series: None,
            sections: Vec::new(),
            selection: None,
        };
        let mut trace = run(Kind::Trace);
        trace.trace = Some(Trace {
            header: TraceHeader::imported(512, true, "t"),
            requests: arrivals_ms
                .iter()
                .map(|&a| Request {
                    arrival_us: (a * 1e3).round() as u64,
                    input_tokens: 10,
                    output_tokens: 4,
                    ..Default::default()
                })
                .collect(),
        });
        let n = arrivals_ms.len();
        let intended: Vec<f64> = arrivals_ms.iter().map(|a| a / 1e3).collect();
        let mut replay = run(Kind::Retrace);
        replay.requests = Some(crate::report::run::Requests {
            input_lens: vec![10; n],
            output_lens: vec![4; n],
            start_s: (0..n).map(|i| intended[i] + late_ms(i) / 1e3).collect(),
            intended_s: Some(intended),
            ttft_s: vec![Some(0.01); n],
            latency_s: vec![Some(0.02); n],
            itls_s: vec![Vec::new(); n],
            errors: vec![String::new(); n],
            client_queue_s: vec![None; n],
            server_queue_s: vec![None; n],
            server_ttft_s: vec![None; n],
            server_input_lens: vec![None; n],
            non_streamed: Vec::new(),
        });
        (trace, replay)
    }

    #[test]
    fn actual_send_times_enter_the_schedule_verdict() {
        let arrivals: Vec<f64> = (0..100)
            .map(|i| i as f64 * 50.0 + 0.013 * (i % 7) as f64)
            .collect();
        let (t, on_time) = trace_and_replay(&arrivals, |i| 0.05 * (i % 3) as f64);
        let f = fidelity(&t, &on_time).unwrap();
        assert!(f.sent_on_time && f.faithful, "{f:?}");
        assert_eq!(f.time_resolution_ms, 1e-3, "microseconds on both sides");
        assert_eq!(f.send_tolerance_ms, FAITHFUL_SEND_MS);
        // The plan was exact, but the last sends went out 208 ms late.
        let (t, late) = trace_and_replay(&arrivals, |i| if i >= 95 { 208.0 } else { 0.0 });
        let f = fidelity(&t, &late).unwrap();
        assert!(
            f.schedule_error_ms.as_ref().unwrap().p99 < 0.01,
            "planned as recorded"
        );
        assert!(f.arrival_error_ms.p99 > 200.0);
        assert!(!f.sent_on_time && !f.faithful, "{f:?}");
    }

    /// Recorded cancels and failures are counted apart and named; lengths and the latency KS
    /// are judged on the pairs that completed on both sides, so a replay that cut the cancels
    /// (fewer tokens) and sent the failures again is still faithful.
    #[test]
    fn recorded_cancels_and_failures_are_apart_and_lengths_judged_on_completed_pairs() {
        use crate::trace::{Event, Response};
        let arrivals: Vec<f64> = (0..6).map(|i| i as f64 * 10.0).collect();
        let (mut t, mut r) = trace_and_replay(&arrivals, |_| 0.0);
        let streamed = |end: u64| Response {
            status: 200,
            ttft_us: Some(10_000),
            events: vec![
                Event {
                    offset_us: 10_000,
                    tokens: 1,
                },
                Event {
                    offset_us: end,
                    tokens: 3,
                },
            ],
            end_us: Some(end),
            ..Default::default()
        };
        let tr = t.trace.as_mut().unwrap();
        for (i, q) in tr.requests.iter_mut().enumerate() {
            q.response = Some(Box::new(streamed(20_000 + i as u64)));
        }
        // Request 1: cancelled after 2 events, with a 12 s end; request 3: cancelled before
        // any event; request 4: an upstream 500.
        let resp = |i: usize, tr: &mut Trace| tr.requests[i].response.as_mut().unwrap().clone();
        let mut c = resp(1, tr);
        (c.cancelled, c.end_us) = (true, Some(12_000_000));
        tr.requests[1].response = Some(c);
        tr.requests[1].output_tokens = 2;
        tr.requests[3].response = Some(Box::new(Response {
            status: 200,
            cancelled: true,
            end_us: Some(150_000),
            ..Default::default()
        }));
        tr.requests[3].output_tokens = 0;
        tr.requests[4].response = Some(Box::new(Response {
            status: 500,
            error: Some("http_500".into()),
            end_us: Some(1_000),
            ..Default::default()
        }));
        tr.requests[4].output_tokens = 0;
        let work: Vec<_> = tr.requests.iter().collect();
        t.requests = Some(crate::report::load::recorded_requests(&work));
        let q = r.requests.as_mut().unwrap();
        for i in [1, 3] {
            q.errors[i] = "cancelled_as_recorded".into();
            q.output_lens[i] = 1;
        }
        q.output_lens[4] = 4; // the 500 succeeded when sent again
        q.latency_s = (0..6).map(|i| Some((20_000 + i) as f64 / 1e6)).collect();
        let f = fidelity(&t, &r).unwrap();
        assert_eq!(f.completed_both, 3, "{f:?}");
        assert_eq!(f.recorded_apart["cancelled"].first, [1, 3]);
        assert_eq!(f.recorded_apart["http_500"].first, [4]);
        assert!(f.replay_failed.is_empty());
        assert_eq!((f.isl_exact, f.osl_exact), (1.0, 1.0));
        assert!(f.faithful, "{f:?}");
        // The 12 s cancel is in neither side's E2EL, nor the replay's cut requests: the same
        // three requests on both sides, timed alike.
        assert_eq!(
            (f.latency_ks["e2el"], f.latency_ks["ttft"]),
            (0.0, 0.0),
            "{f:?}"
        );
        // A failure of the target on a request that completed in the recording is named too.
        r.requests.as_mut().unwrap().errors[2] = "http_503".into();
        let f = fidelity(&t, &r).unwrap();
        assert_eq!(f.replay_failed["http_503"].first, [2]);
        assert_eq!(f.completed_both, 2);
    }

    #[test]
    fn time_resolution_is_the_coarsest_tick_every_offset_is_a_multiple_of() {
        assert_eq!(resolution_s(&[3.0, 5.0, 9.0]), 1.0);
        assert_eq!(resolution_s(&[0.0, 0.003, 0.017, 3.537]), 1e-3);
        assert_eq!(resolution_s(&[1.0, 1.000_250, 2.5]), 1e-5);
        assert_eq!(resolution_s(&[0.1, 0.100_001]), 1e-6);
        assert_eq!(send_tolerance_ms(1e3), 1e3, "a 1 s trace: one tick");
    }

    #[test]
    fn gaps_are_compared_at_the_coarser_time_resolution() {
        // Mooncake's integer milliseconds, bursts of 4 at one instant about every 3 s (0 ms gaps),
        // against a recording of that schedule whose burst members came 0.1-0.3 ms apart.
        let burst = |i: usize| ((i / 4) * 3000 + (i / 4) % 5) as f64;
        let ms: Vec<f64> = (0..200).map(burst).collect();
        let (t, _) = trace_and_replay(&ms, |_| 0.0);
        let recorded: Vec<f64> = (0..200).map(|i| burst(i) + 0.1 * (i % 4) as f64).collect();
        let (r, _) = trace_and_replay(&recorded, |_| 0.0);
        let w = compare(&t, &r).unwrap();
        assert_eq!(w.gaps_resolution_ms, 1.0);
        assert_eq!(w.gaps_ks.d, 0.0, "the same schedule");
        let raw = ks_2samp(
            &gaps(
                &t.trace
                    .as_ref()
                    .map(|x| {
                        x.requests
                            .iter()
                            .map(|q| q.arrival_us as f64 / 1e6)
                            .collect::<Vec<_>>()
                    })
                    .unwrap(),
            ),
            &gaps(&recorded.iter().map(|a| a / 1e3).collect::<Vec<_>>()),
        );
        assert!(raw.d > 0.5, "at microseconds they look unlike: {}", raw.d);
    }

    #[test]
    fn burstiness_of_regular_and_bursty_arrivals() {
        let regular: Vec<f64> = (0..100).map(|i| i as f64).collect();
        assert!(gap_cv(&regular) < 1e-9);
        // bursts of 10 at the same instant every 10 s
        let bursty: Vec<f64> = (0..100).map(|i| (i / 10) as f64 * 10.0).collect();
        assert!(gap_cv(&bursty) > 2.0);
    }
}
