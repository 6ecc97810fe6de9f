//! Self-contained HTML pages: the run report (`retrace report`) and the comparison page
//! (`compare --html`). One file: inline CSS (`report.css`) and the script `report.js`, which draws
//! SVG charts and one canvas timeline with hover read-outs and a zoomable time axis; no network
//! fetches, no external fonts or scripts.
//!
//! The report page answers first: its headline (the verdict and cards, [`super::headline`]), then
//! latency over time, then the distributions, the raw figures folded last; the comparison page
//! opens with its verdict line and the `--fail-on` gate.
//!
//! Rust computes everything the page shows (downsampled so 100,000 requests stay under 1 MB):
//! CDF points, percentile tables, the timeline rows (at most [`TIMELINE_ROWS`] requests: an even
//! stride plus the slowest, each with its index, TTFT, tokens, error and runs of ITL gaps grouped
//! by threshold class as vLLM's `--timeline-itl-thresholds` does; above that, also a detail
//! window of [`DETAIL_ROWS`] consecutive requests around the worst TTFT), time series in at most
//! [`SERIES_BINS`] bins, length histograms and the server-side breakdown. The data goes in a
//! `<script type="application/json">` block; the script draws it and, only after every chart
//! rendered without an exception, sets `data-rendered` on `<body>` and adds `#render-ok` (a script
//! error sets `data-render-error` instead), which the browser test checks. This module does not
//! read files or compute comparisons.

use super::compare::{Comparison, Verdict};
use super::headline::{
    cards, human_label, intended_table, percentile_table, table_head, verdict, DEFAULT_PERCENTILES,
};
use super::load::{Metric, Requests, Run};
use super::render::{label, num, verdict as verdict_word, Overall};
use super::rules::RuleOutcome;
use super::weighted::Weighted;
use serde_json::{json, Value};

/// Most requests drawn in the timeline.
pub(crate) const TIMELINE_ROWS: usize = 1500;
/// Requests in the detail window of a large run's timeline.
pub(crate) const DETAIL_ROWS: usize = 300;
/// Most ITL runs kept per timeline row (the rest merge into the last run).
const RUNS_PER_ROW: usize = 120;
/// Most bins of a time series.
pub(crate) const SERIES_BINS: usize = 300;
const CDF_POINTS: usize = 200;
const HIST_BINS: usize = 40;
/// Longest error message kept per distinct error in the timeline.
const ERROR_CHARS: usize = 200;

fn r3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn cdf_json(w: &Weighted) -> Value {
    Value::Array(
        w.cdf_points(CDF_POINTS)
            .into_iter()
            .map(|(x, y)| json!([r3(x), r3(y)]))
            .collect(),
    )
}

fn class_of(ms: f64, t: (f64, f64)) -> u8 {
    if ms < t.0 {
        0
    } else if ms < t.1 {
        1
    } else {
        2
    }
}

/// Timeline rows: `[index, start_s, ttft_ms|null, ok, [dur_ms, class, ...], e2el_ms, input_tokens,
/// output_tokens, error|null]`, `error` an index into `errors` (each distinct message once).
fn rows_of(q: &Requests, idx: &[usize], t: (f64, f64), errors: &mut Vec<String>) -> Vec<Value> {
    idx.iter()
        .map(|&i| {
            let mut runs: Vec<(f64, u8)> = Vec::new();
            for &g in &q.itls_s[i] {
                let ms = g * 1e3;
                let c = class_of(ms, t);
                let full = runs.len() >= RUNS_PER_ROW;
                match runs.last_mut() {
                    Some((d, lc)) if *lc == c || full => {
                        *d += ms;
                        *lc = (*lc).max(c);
                    }
                    _ => runs.push((ms, c)),
                }
            }
            let flat: Vec<Value> = runs
                .iter()
                .flat_map(|(d, c)| [json!(r3(*d)), json!(c)])
                .collect();
            let ttft = q.ttft_s[i].map(|v| r3(v * 1e3));
            let end = (q.end_s(i) - q.start_s[i]) * 1e3;
            let err = (!q.errors[i].is_empty()).then(|| {
                let e: String = q.errors[i].chars().take(ERROR_CHARS).collect();
                errors.iter().position(|x| *x == e).unwrap_or_else(|| {
                    errors.push(e);
                    errors.len() - 1
                })
            });
            let (isl, osl) = (q.input_lens[i], q.output_lens[i]);
            json!([
                i,
                r3(q.start_s[i]),
                ttft,
                q.ok(i),
                flat,
                r3(end),
                isl,
                osl,
                err
            ])
        })
        .collect()
}

/// The whole-run timeline (every request, or an even stride plus the slowest by E2EL when there
/// are more than [`TIMELINE_ROWS`]) and, for large runs, a detail window: every request of the
/// [`DETAIL_ROWS`] around the one with the worst TTFT.
fn timeline(run: &Run, t: (f64, f64)) -> Option<Value> {
    let q = run.requests.as_ref()?;
    let n = q.len();
    if n == 0 {
        return None;
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| q.start_s[a].total_cmp(&q.start_s[b]));
    let mut idx: Vec<usize> = if n <= TIMELINE_ROWS {
        order.clone()
    } else {
        let slow_budget = TIMELINE_ROWS / 10;
        let mut by_e2el: Vec<usize> = (0..n).collect();
        by_e2el.sort_by(|&a, &b| {
            q.latency_s[b]
                .unwrap_or(0.0)
                .total_cmp(&q.latency_s[a].unwrap_or(0.0))
        });
        let mut keep = vec![false; n];
        for &i in by_e2el.iter().take(slow_budget) {
            keep[i] = true;
        }
        let stride = n as f64 / (TIMELINE_ROWS - slow_budget) as f64;
        for k in 0..TIMELINE_ROWS - slow_budget {
            keep[order[((k as f64 * stride) as usize).min(n - 1)]] = true;
        }
        (0..n).filter(|&i| keep[i]).collect()
    };
    idx.sort_by(|&a, &b| q.start_s[a].total_cmp(&q.start_s[b]));
    let detail = (n > TIMELINE_ROWS).then(|| {
        let worst = (0..n)
            .max_by(|&a, &b| {
                q.ttft_s[a]
                    .unwrap_or(0.0)
                    .total_cmp(&q.ttft_s[b].unwrap_or(0.0))
            })
            .unwrap_or(0);
        let pos = order.iter().position(|&i| i == worst).unwrap_or(0);
        let lo = pos.saturating_sub(DETAIL_ROWS / 2).min(n - DETAIL_ROWS.min(n));
        let win = &order[lo..(lo + DETAIL_ROWS).min(n)];
        let mut errors = Vec::new();
        json!({"rows": rows_of(q, win, t, &mut errors), "errors": errors, "shown": win.len(), "total": n,
               "from_s": r3(q.start_s[win[0]]), "worst_ttft_ms": q.ttft_s[worst].map(|v| r3(v * 1e3))})
    });
    let mut errors = Vec::new();
    let rows = rows_of(q, &idx, t, &mut errors);
    Some(json!({"rows": rows, "errors": errors, "shown": idx.len(), "total": n, "detail": detail}))
}

/// Time series: completions/s, output tokens/s, in-flight requests, client queue depth.
fn series(run: &Run) -> Option<Value> {
    let q = run.requests.as_ref()?;
    let n = q.len();
    if n == 0 {
        return None;
    }
    let t_end = (0..n).map(|i| q.end_s(i)).fold(0.0, f64::max);
    if t_end <= 0.0 {
        return None;
    }
    // bins of at least 0.25 s, at most SERIES_BINS of them
    let bins = SERIES_BINS.min(((t_end / 0.25).ceil() as usize).max(4));
    let w = t_end / bins as f64;
    let bin = |t: f64| ((t / w) as usize).min(bins - 1);
    let mut done = vec![0f64; bins];
    let mut toks = vec![0f64; bins];
    for i in 0..n {
        if q.ok(i) {
            done[bin(q.end_s(i))] += 1.0;
            let mut t = q.start_s[i] + q.ttft_s[i].unwrap_or(0.0);
            toks[bin(t)] += 1.0;
            for g in &q.itls_s[i] {
                t += g;
                toks[bin(t)] += 1.0;
            }
        }
    }
    // Peak level of a set of intervals within each bin.
    let peak = |iv: &mut Vec<(f64, i64)>| -> Vec<f64> {
        iv.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut out = vec![0f64; bins];
        let mut level = 0i64;
        let mut cur_bin = 0usize;
        for &(t, d) in iv.iter() {
            let b = bin(t.max(0.0));
            while cur_bin < b {
                cur_bin += 1;
                out[cur_bin] = out[cur_bin].max(level as f64);
            }
            level += d;
            out[b] = out[b].max(level as f64);
        }
        out
    };
    let mut inflight: Vec<(f64, i64)> = Vec::with_capacity(2 * n);
    let mut queued: Vec<(f64, i64)> = Vec::new();
    let mut server_queued: Vec<(f64, i64)> = Vec::new();
    for i in 0..n {
        // vLLM reports how long a request queued, not when: placed at its send time.
        if let Some(sq) = q.server_queue_s[i].filter(|v| *v > 0.0) {
            server_queued.push((q.start_s[i], 1));
            server_queued.push((q.start_s[i] + sq, -1));
        }
        inflight.push((q.start_s[i], 1));
        inflight.push((q.end_s(i), -1));
        if let Some(cq) = q.client_queue_s[i].filter(|v| *v > 0.0) {
            queued.push((q.start_s[i] - cq, 1));
            queued.push((q.start_s[i], -1));
        }
    }
    let (ttft_p50, ttft_p99) = ttft_over_time(q, bins, &bin, w);
    let conc = peak(&mut inflight);
    let qd = peak(&mut queued);
    let sqd = peak(&mut server_queued);
    let times: Vec<f64> = (0..bins).map(|b| r3((b as f64 + 0.5) * w)).collect();
    let per_s = |v: Vec<f64>| -> Vec<f64> { v.into_iter().map(|x| r3(x / w)).collect() };
    // `--scrape-metrics`: the server's own gauges, as [t, value] points (nulls dropped).
    let scraped = |col: &str| -> Value {
        let Some(s) = &run.server_series else {
            return Value::Null;
        };
        let (Some(t), Some(v)) = (s["t"].as_array(), s[col].as_array()) else {
            return Value::Null;
        };
        let pts: Vec<[f64; 2]> = t
            .iter()
            .zip(v)
            .filter_map(|(t, v)| Some([r3(t.as_f64()?), v.as_f64()?]))
            .take(SERIES_BINS * 4)
            .collect();
        if pts.is_empty() {
            Value::Null
        } else {
            json!(pts)
        }
    };
    Some(json!({
        "server_running": scraped("running"),
        "server_waiting": scraped("waiting"),
        "server_kv": scraped("kv_cache_usage"),
        "t": times,
        "ttft_p50": ttft_p50,
        "ttft_p99": ttft_p99,
        "completions": per_s(done),
        "tokens": per_s(toks),
        "concurrency": conc,
        "queue": if queued.is_empty() { Value::Null } else { json!(qd) },
        "server_queue": if server_queued.is_empty() { Value::Null } else { json!(sqd) },
    }))
}

/// TTFT over time: the p50 and p99 of the successful requests sent in each bin, as `[t, ms]`
/// points (bins with no such request left out).
fn ttft_over_time(q: &Requests, bins: usize, bin: &dyn Fn(f64) -> usize, w: f64) -> (Value, Value) {
    let mut by_bin: Vec<Vec<f64>> = vec![Vec::new(); bins];
    for i in (0..q.len()).filter(|&i| q.ok(i)) {
        if !q.non_streamed.get(i).copied().unwrap_or(false) {
            by_bin[bin(q.start_s[i].max(0.0))].extend(q.ttft_s[i].map(|t| t * 1e3));
        }
    }
    let at = |p: f64| -> Value {
        let pts: Vec<Value> = by_bin
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_empty())
            .map(|(b, v)| {
                json!([
                    r3((b as f64 + 0.5) * w),
                    r3(Weighted::from_samples(v).percentile(p))
                ])
            })
            .collect();
        Value::Array(pts)
    };
    (at(50.0), at(99.0))
}

fn histogram(v: &[f64]) -> Option<Value> {
    if v.is_empty() {
        return None;
    }
    let max = v.iter().copied().fold(0.0, f64::max).max(1.0);
    let w = (max / HIST_BINS as f64).ceil().max(1.0);
    let mut counts = vec![0u64; HIST_BINS];
    for &x in v {
        counts[((x / w) as usize).min(HIST_BINS - 1)] += 1;
    }
    Some(json!({"width": w, "counts": counts}))
}

fn lengths(run: &Run) -> (Vec<f64>, Vec<f64>) {
    super::workload::lengths(run).unwrap_or_default()
}

/// Client TTFT split into server queue, server TTFT and unattributed time (mean and median of
/// each component over requests with a server TTFT; a server that reports no queue time has
/// its queue wait in the unattributed part: [`crate::metrics::unattributed`]).
fn breakdown(run: &Run) -> Option<Value> {
    let q = run.requests.as_ref()?;
    let mut parts: [Vec<f64>; 4] = Default::default();
    for i in 0..q.len() {
        if !q.ok(i) {
            continue;
        }
        let (Some(t), Some(st)) = (q.ttft_s[i], q.server_ttft_s[i]) else {
            continue;
        };
        let sq = q.server_queue_s[i];
        parts[0].push(sq.unwrap_or(0.0) * 1e3);
        parts[1].push(st * 1e3);
        parts[2].push(crate::metrics::unattributed(t, sq, st) * 1e3);
        parts[3].push(t * 1e3);
    }
    if parts[0].is_empty() {
        return None;
    }
    let stats: Vec<Value> = parts
        .iter()
        .map(|p| {
            let w = Weighted::from_samples(p);
            let qd = w.quad();
            json!([r3(qd.mean), r3(qd.p50), r3(qd.p90), r3(qd.p99)])
        })
        .collect();
    Some(
        json!({"n": parts[0].len(), "queue": stats[0], "server_ttft": stats[1], "unattributed": stats[2], "client_ttft": stats[3]}),
    )
}

fn summary(run: &Run) -> Value {
    let mut out = Vec::new();
    for (k, label) in [
        ("completed", "completed"),
        ("failed", "failed"),
        ("duration", "duration (s)"),
        ("request_throughput", "request throughput (req/s)"),
        ("output_throughput", "output throughput (tok/s)"),
        ("total_token_throughput", "total token throughput (tok/s)"),
        (
            "max_concurrent_requests",
            "peak concurrent requests (vLLM's: successes active in the busiest second)",
        ),
        (
            "peak_in_flight",
            "peak requests in flight (at one instant, failures included)",
        ),
        ("request_goodput", "request goodput (req/s)"),
        ("server_reported", "requests with server metrics"),
    ] {
        if let Some(v) = run.scalar(k) {
            out.push(json!([label, num(v), k]));
        }
    }
    for k in [
        "model_id",
        "target",
        "trace",
        "date",
        "valid",
        "invalid_reason",
        "source",
    ] {
        if let Some(v) = run.info.get(k) {
            out.push(json!([human_label(k), v, k]));
        }
    }
    // --sessions / --probe-request-rate / --scrape-metrics summaries, one row per leaf
    for (k, v) in &run.sections {
        let shown = match v {
            Value::Number(n) => n.as_f64().map_or_else(|| v.clone(), |f| json!(num(f))),
            _ => v.clone(),
        };
        out.push(json!([human_label(k), shown, k]));
    }
    Value::Array(out)
}

/// The report page for one run, at the default percentiles.
pub fn report_page(run: &Run, thresholds: (f64, f64)) -> String {
    report_page_at(run, thresholds, &DEFAULT_PERCENTILES)
}

/// The report page for one run: the headline (verdict and cards) first, then latency over time,
/// then the distributions at the percentiles `ps`, the raw figures last.
pub(crate) fn report_page_at(run: &Run, thresholds: (f64, f64), ps: &[f64]) -> String {
    let (pct, cdfs) = percentile_table(run, ps, cdf_json);
    let (isl, osl) = lengths(run);
    let data = json!({
        "page": "report",
        "title": format!("retrace report: {}", run.label()),
        "subtitle": format!("{} · {}", run.kind.as_str(), run.path.display()),
        "thresholds": [thresholds.0, thresholds.1],
        "verdict": verdict(run),
        "cards": cards(run),
        "summary": summary(run),
        "percentile_head": table_head(ps),
        "percentiles": pct,
        "intended": intended_table(run, ps),
        "cdfs": cdfs,
        "timeline": timeline(run, thresholds),
        "series": series(run),
        "isl": histogram(&isl),
        "osl": histogram(&osl),
        "breakdown": breakdown(run),
        "shadows": shadows(run, thresholds),
    });
    page(&data)
}

/// Each latency metric's CDF of `base` beside `cand`'s (and `noise`'s), where both have it.
fn cdfs_beside(base: &Run, cand: &Run, noise: Option<&Run>) -> Vec<Value> {
    let mut cdfs = Vec::new();
    for m in Metric::ALL {
        let (Some(b), Some(c)) = (base.dist(m), cand.dist(m)) else {
            continue;
        };
        cdfs.push(json!({
            "key": m.key(),
            "label": m.label(),
            "base": cdf_json(&b),
            "cand": cdf_json(&c),
            "noise": noise.and_then(|n| n.dist(m)).map(|w| cdf_json(&w)),
        }));
    }
    cdfs
}

/// The shadows of a shadowed recording, or the results beside a `replay --shadow` result, each
/// beside the primary: the CDFs of both sides, the CDF of the paired per-request change (TTFT,
/// E2EL) with its median, and the shadow's timeline. A shadow's result that cannot be paired
/// leaves the shadows out, said on stderr.
fn shadows(run: &Run, t: (f64, f64)) -> Vec<Value> {
    let sides = match (&run.trace, &run.requests) {
        (Some(trace), _) => super::shadow::beside(trace),
        (None, Some(rows)) if run.kind == super::run::Kind::Retrace => {
            match super::shadow::beside_results(&run.path, rows) {
                Ok(sides) => sides,
                Err(e) => {
                    eprintln!("retrace report: the shadows are left out: {e:#}");
                    Vec::new()
                }
            }
        }
        _ => Vec::new(),
    };
    let primary = match run.trace {
        Some(_) => "primary",
        None => "target",
    };
    let side = |b: super::shadow::Beside| {
        let shadow = Run {
            path: run.path.clone(),
            kind: run.kind,
            scalars: Default::default(),
            info: Default::default(),
            requests: Some(b.requests),
            hists: Default::default(),
            trace: None,
            server_series: None,
            sections: Vec::new(),
            selection: None,
        };
        let deltas: Vec<Value> = [
            ("ttft", "TTFT", b.ttft_delta_ms),
            ("e2el", "E2EL", b.e2el_delta_ms),
        ]
        .into_iter()
        .filter(|(_, _, d)| !d.is_empty())
        .map(|(key, label, mut d)| {
            d.sort_by(f64::total_cmp);
            let median = crate::metrics::np_percentile_sorted(&d, 50.0);
            json!({"key": key, "label": label, "n": d.len(), "median": r3(median),
                       "pts": cdf_json(&Weighted::from_samples(&d))})
        })
        .collect();
        json!({
            "name": b.name,
            "primary": primary,
            "pairs": b.pairs,
            "cdfs": cdfs_beside(run, &shadow, None),
            "deltas": deltas,
            "timeline": timeline(&shadow, t),
        })
    };
    sides.into_iter().map(side).collect()
}

/// The comparison page: its verdict line and the `--fail-on` gate (`rules`) first.
pub fn compare_page(
    cmp: &Comparison,
    rules: &[RuleOutcome],
    base: &Run,
    cand: &Run,
    noise: &[Run],
) -> String {
    let rows: Vec<Value> = cmp
        .rows
        .iter()
        .map(|r| {
            let v = match r.verdict {
                Verdict::Worse => "worse",
                v => verdict_word(v, false),
            };
            json!([
                label(r),
                r.baseline.map(num),
                r.candidate.map(num),
                r.abs_change.map(num),
                r.rel_change.map(|x| format!("{:+.1}%", x * 100.0)),
                r.ci.map(|(a, b)| format!("[{}, {}]", num(a), num(b))),
                v
            ])
        })
        .collect();
    let cdfs = cdfs_beside(base, cand, noise.first());
    let mut lens = Vec::new();
    let ((bi, bo), (ci, co)) = (lengths(base), lengths(cand));
    for (key, label, b, c) in [
        ("isl", "input length", bi, ci),
        ("osl", "output length", bo, co),
    ] {
        if b.is_empty() || c.is_empty() {
            continue;
        }
        lens.push(json!({"key": key, "label": label,
            "base": cdf_json(&Weighted::from_samples(&b)), "cand": cdf_json(&Weighted::from_samples(&c))}));
    }
    let paired = cmp.paired.as_ref().map(|p| {
        json!({
            "n": p.n,
            "text": format!("geometric mean ratio {:.3} ({:.0}% CI {:.3}..{:.3}); p10 {:.3}, p50 {:.3}, p90 {:.3}; {:.1}% >10% slower, {:.1}% >10% faster",
                p.geo_mean_ratio, cmp.confidence * 100.0, p.ci.0, p.ci.1, p.p10, p.p50, p.p90, p.slower_10pct * 100.0, p.faster_10pct * 100.0),
            "pts": p.cdf.iter().map(|(x, y)| json!([r3(*x * 1000.0) / 1000.0, r3(*y)])).collect::<Vec<_>>(),
        })
    });
    let text = super::render::render(cmp, rules, super::render::RenderFormat::Text);
    let overall = Overall::of(cmp, rules);
    let data = json!({
        "page": "compare",
        "verdict": {"line": overall.line, "gate": overall.gate.as_ref().map(|g| g.result),
                    "rules": rules.iter().map(|o| json!([o.tripped, o.not_judged, o.message])).collect::<Vec<_>>()},
        "title": format!("retrace compare: {} vs {}", base.label(), cand.label()),
        "subtitle": format!("baseline {} · candidate {}{}", base.path.display(), cand.path.display(),
            noise.iter().map(|n| format!(" · noise {}", n.path.display())).collect::<String>()),
        "rows": rows,
        "cdfs": cdfs,
        "paired": paired,
        "lengths": lens,
        "text": text,
        "notes": cmp.notes,
    });
    page(&data)
}

/// The page of a capacity search (see [`super::capacity`]).
pub(crate) fn capacity_page(data: &Value) -> String {
    page(data)
}

fn page(data: &Value) -> String {
    // Inside the script element the HTML tokenizer reads `</script` as its end and `<!--` with
    // `<script` as its double-escaped state (which blanks the page): no `<` is left in the data.
    // `<` only occurs inside JSON strings, where `\u003c` means the same; U+2028 and U+2029
    // likewise, for any script that evaluates the block.
    let json = data
        .to_string()
        .replace('<', "\\u003c")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029");
    let title = data["title"]
        .as_str()
        .unwrap_or("retrace")
        .replace('&', "&amp;")
        .replace('<', "&lt;");
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\n<style>{CSS}</style></head>\n<body><div id=\"app\"></div>\n<script id=\"retrace-data\" type=\"application/json\">{json}</script>\n<script>{JS}</script>\n</body></html>\n"
    )
}

const CSS: &str = include_str!("report.css");
const JS: &str = include_str!("report.js");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::compare::tests::synth_run;

    #[test]
    fn report_page_is_self_contained_and_carries_the_charts() {
        let run = synth_run(300, 80.0, 1);
        let p = report_page(&run, (25.0, 50.0));
        assert!(p.starts_with("<!DOCTYPE html>"));
        for needle in [
            "\"timeline\":{",
            "\"series\":{",
            "\"isl\":{",
            "chart-timeline",
        ] {
            assert!(p.contains(needle), "missing {needle}");
        }
        // No fetches: the only URL is the SVG namespace name.
        for forbidden in [
            "https://",
            "src=",
            "href=",
            "url(",
            "@import",
            "fetch(",
            "XMLHttpRequest",
        ] {
            assert!(!p.contains(forbidden), "page contains {forbidden}");
        }
        assert_eq!(p.matches("http://").count(), 1);
        assert!(p.contains("'http://www.w3.org/2000/svg'"));
    }

    /// A recording's length histograms count what compare's workload counts: side requests left
    /// out, output lengths of the requests that succeeded only.
    #[test]
    fn recording_length_histograms_leave_out_side_requests_and_failures() {
        use crate::trace::{Endpoint, Request, Response, Trace, TraceHeader};
        let req = |input: u64, output: u64, status: u16, method: Option<&str>| Request {
            method: method.map(str::to_string),
            endpoint: Endpoint::Completions,
            input_tokens: input,
            output_tokens: output,
            response: Some(Box::new(Response {
                status,
                ..Default::default()
            })),
            ..Default::default()
        };
        let mut run = synth_run(1, 80.0, 1);
        run.requests = None;
        run.trace = Some(Trace {
            header: TraceHeader::imported(16, false, "test"),
            requests: vec![
                req(10, 5, 200, None),
                req(20, 7, 500, None),
                req(0, 0, 200, Some("GET")),
            ],
        });
        let (isl, osl) = lengths(&run);
        assert_eq!((isl, osl), (vec![10.0, 20.0], vec![5.0]));
    }

    /// Scraped server gauges (`--scrape-metrics`) join the queue-depth chart; nulls are dropped.
    #[test]
    fn scraped_server_gauges_join_the_queue_chart() {
        let mut run = synth_run(50, 80.0, 1);
        assert!(report_page(&run, (25.0, 50.0)).contains("\"server_running\":null"));
        run.server_series = Some(json!({
            "t": [-0.02, 1.0, 2.0],
            "running": [0.0, 4.0, null],
            "waiting": [0.0, 1.0, 0.0],
            "kv_cache_usage": [0.0, 0.5, 0.25],
        }));
        let p = report_page(&run, (25.0, 50.0));
        assert!(
            p.contains("\"server_running\":[[-0.02,0.0],[1.0,4.0]]"),
            "nulls dropped"
        );
        assert!(p.contains("\"server_waiting\":[[-0.02,0.0],[1.0,1.0],[2.0,0.0]]"));
        assert!(p.contains("\"server_kv\":[[-0.02,0.0],[1.0,0.5],[2.0,0.25]]"));
        assert!(p.contains("chart-server-kv"));
    }

    #[test]
    fn timeline_is_downsampled_with_the_slowest_kept() {
        let mut run = synth_run(20_000, 80.0, 2);
        let q = run.requests.as_mut().unwrap();
        q.latency_s[12_345] = Some(99.0);
        let tl = timeline(&run, (25.0, 50.0)).unwrap();
        let rows = tl["rows"].as_array().unwrap();
        assert!(rows.len() <= TIMELINE_ROWS && rows.len() > TIMELINE_ROWS / 2);
        assert_eq!(tl["total"], 20_000);
        // the 99 s request is kept (E2EL 99,000 ms)
        assert!(rows.iter().any(|r| r[5].as_f64() == Some(99_000.0)));
        // the detail window holds consecutive requests around the worst TTFT
        run.requests.as_mut().unwrap().ttft_s[777] = Some(5.0);
        let tl = timeline(&run, (25.0, 50.0)).unwrap();
        let d = &tl["detail"];
        assert_eq!(d["shown"], DETAIL_ROWS);
        assert_eq!(d["worst_ttft_ms"], 5000.0);
        let rows = d["rows"].as_array().unwrap();
        assert!(rows.iter().any(|r| r[2].as_f64() == Some(5000.0)));
    }

    /// The hover needs each row's request index, tokens and error; errors are stored once.
    #[test]
    fn timeline_rows_carry_index_tokens_and_error() {
        let mut run = synth_run(4, 80.0, 1);
        let q = run.requests.as_mut().unwrap();
        q.start_s.swap(0, 3);
        q.errors[1] = "HTTP 503".into();
        q.errors[2] = "HTTP 503".into();
        q.itls_s[0] = vec![0.010, 0.030, 0.030, 0.060];
        let tl = timeline(&run, (25.0, 50.0)).unwrap();
        assert_eq!(tl["errors"], json!(["HTTP 503"]));
        let rows = tl["rows"].as_array().unwrap();
        // sorted by send time: request 3 (sent at 0 s) first, request 0 last
        assert_eq!(rows[0][0], 3);
        let r0 = &rows[3];
        assert_eq!(r0[0], 0);
        assert_eq!(r0[4], json!([10.0, 0, 60.0, 1, 60.0, 2]));
        assert_eq!((r0[6].as_u64(), r0[7].as_u64()), (Some(100), Some(10)));
        assert_eq!(
            (&r0[8], &rows[1][8], &rows[2][8]),
            (&Value::Null, &json!(0), &json!(0))
        );
    }

    /// 100,000 requests whose every gap changes colour: the page stays under 1 MB.
    #[test]
    fn report_page_of_100k_requests_stays_under_a_megabyte() {
        let mut run = synth_run(100_000, 80.0, 1);
        let q = run.requests.as_mut().unwrap();
        for (i, itls) in q.itls_s.iter_mut().enumerate() {
            *itls = (0..9).map(|k| [0.010, 0.030, 0.060][(i + k) % 3]).collect();
            if i % 100 == 7 {
                q.errors[i] = format!("HTTP 500 for request {i}");
            }
        }
        let p = report_page(&run, (25.0, 50.0));
        eprintln!("report page of 100,000 requests: {} bytes", p.len());
        assert!(p.len() < 1_000_000, "{} bytes", p.len());
    }

    #[test]
    fn script_end_tag_in_data_is_escaped() {
        let p = page(&json!({"title": "x</script><b>", "page": "report"}));
        assert_eq!(p.matches("</script>").count(), 2);
    }

    /// A hostile server string (`<!--` then `<script`) cannot put the tokenizer in its
    /// double-escaped state: the data block holds no `<` at all, and reads back the same.
    #[test]
    fn no_angle_bracket_or_line_separator_is_left_in_the_data_block() {
        let hostile = "<!-- <script> x \u{2028} \u{2029} </script>";
        let data = json!({"title": "t", "page": "report", "notes": [hostile]});
        let p = page(&data);
        let start = p.find("type=\"application/json\">").unwrap() + 24;
        let end = start + p[start..].find("</script>").unwrap();
        let block = &p[start..end];
        assert!(
            !block.contains('<') && !block.contains('\u{2028}'),
            "{block}"
        );
        let back: Value = serde_json::from_str(block).unwrap();
        assert_eq!(back["notes"][0], hostile);
    }
}
