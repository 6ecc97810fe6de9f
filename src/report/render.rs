//! Rendering a [`Comparison`] (and `--fail-on` outcomes) as text, Markdown or JSON; the HTML pages
//! are [`super::html`]'s. Callers write the returned string. Does not compute anything.
//!
//! JSON (`retrace.compare/1`): the [`Comparison`] fields (`baseline`, `candidate`, `noise` (a list),
//! `seed`, `confidence`, `resamples`, `rows[]` with `key`, `label`, `unit`, `baseline`,
//! `candidate`, `abs_change`, `rel_change`, `better`, `ci` ([lo, hi] of candidate − baseline),
//! `noise`, `significant`, `verdict`, `approx`; `paired`; `workload`; `notes`) plus `rules[]`
//! (`rule`, `tripped`, `ignored_as_noise`, `not_judged`, `observed`, `message`, `brief`), `failed`
//! and `verdict` ([`Overall`]). Text and Markdown open with the verdict line.

use super::compare::{Comparison, MetricRow, Verdict};
use super::rules::RuleOutcome;
use super::workload::{Shape, WorkloadCmp};
use serde::Serialize;
use std::fmt::Write;

/// Output format of `compare` (`--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenderFormat {
    Text,
    Markdown,
    Json,
}

pub fn render(cmp: &Comparison, rules: &[RuleOutcome], format: RenderFormat) -> String {
    match format {
        RenderFormat::Text => table(cmp, rules, false),
        RenderFormat::Markdown => table(cmp, rules, true),
        RenderFormat::Json => json(cmp, rules),
    }
}

/// The whole comparison in one verdict: how many rows got each verdict, and the `--fail-on` gate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Overall {
    pub(crate) worse: usize,
    pub(crate) better: usize,
    pub(crate) unchanged: usize,
    /// Rows whose significance could not be judged (`n/a`).
    pub(crate) not_judged: usize,
    /// Rows one side lacks.
    pub(crate) missing: usize,
    /// Absent without `--fail-on` rules.
    pub(crate) gate: Option<Gate>,
    /// The line text and Markdown print first.
    pub(crate) line: String,
}

/// The `--fail-on` rules together: `fail` when one tripped, else `not_judged` when one could not
/// be judged, else `pass` (exit 1, 4, 0).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Gate {
    pub(crate) result: &'static str,
    /// The rules that decided it (tripped, or not judged): `rule`, `brief`.
    pub(crate) failing: Vec<GateRule>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct GateRule {
    pub(crate) rule: String,
    pub(crate) brief: String,
}

impl Overall {
    pub(crate) fn of(cmp: &Comparison, rules: &[RuleOutcome]) -> Overall {
        let n = |v: Verdict| cmp.rows.iter().filter(|r| r.verdict == v).count();
        let (worse, better, unchanged) = (n(Verdict::Worse), n(Verdict::Better), n(Verdict::Same));
        let (not_judged, missing) = (n(Verdict::Unknown), n(Verdict::Missing));
        let noun = if worse == 1 { "metric" } else { "metrics" };
        let mut line = format!("{worse} {noun} worse, {better} better, {unchanged} unchanged");
        for (k, what) in [(not_judged, "not judged"), (missing, "missing")] {
            if k > 0 {
                let _ = write!(line, ", {k} {what}");
            }
        }
        let gate = (!rules.is_empty()).then(|| gate(rules));
        if let Some(g) = &gate {
            let briefs: Vec<&str> = g.failing.iter().map(|r| r.brief.as_str()).collect();
            let why = match g.result {
                "pass" if rules.len() == 1 => "1 rule".to_string(),
                "pass" => format!("{} rules", rules.len()),
                _ => briefs.join("; "),
            };
            let result = g.result.replace('_', " ").to_uppercase();
            let _ = write!(line, "; gate: {result} ({why})");
        }
        Overall {
            worse,
            better,
            unchanged,
            not_judged,
            missing,
            gate,
            line,
        }
    }
}

fn gate(rules: &[RuleOutcome]) -> Gate {
    let tripped = rules.iter().any(|o| o.tripped);
    let unjudged = rules.iter().any(|o| o.not_judged);
    let (result, decided): (_, fn(&RuleOutcome) -> bool) = match (tripped, unjudged) {
        (true, _) => ("fail", |o| o.tripped),
        (false, true) => ("not_judged", |o| o.not_judged),
        _ => ("pass", |_| false),
    };
    let failing = rules
        .iter()
        .filter(|o| decided(o))
        .map(|o| GateRule {
            rule: o.rule.clone(),
            brief: o.brief.clone(),
        })
        .collect();
    Gate { result, failing }
}

/// Human form of a number: 4 significant-ish digits.
pub(crate) fn num(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 {
        "0".into()
    } else if a >= 1000.0 || (v.fract() == 0.0 && a < 1e15) {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.001 {
        format!("{v:.4}")
    } else {
        format!("{v:.2e}")
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), num)
}

fn signed(v: Option<f64>) -> String {
    match v {
        Some(0.0) => "0".into(),
        Some(v) if v > 0.0 => format!("+{}", num(v)),
        Some(v) => num(v),
        None => "-".into(),
    }
}

fn pct(v: Option<f64>) -> String {
    match v {
        Some(0.0) => "0%".into(),
        Some(v) => format!("{:+.1}%", v * 100.0),
        None => "-".into(),
    }
}

fn ci(r: &MetricRow) -> String {
    r.ci.map_or_else(
        || "-".into(),
        |(a, b)| format!("[{}, {}]", signed(Some(a)), signed(Some(b))),
    )
}

pub(super) fn verdict(v: Verdict, md: bool) -> &'static str {
    match (v, md) {
        (Verdict::Worse, false) => "WORSE",
        (Verdict::Worse, true) => "**worse**",
        (Verdict::Better, _) => "better",
        (Verdict::Same, _) => "no change",
        (Verdict::Unknown, _) => "n/a",
        (Verdict::Missing, _) => "-",
    }
}

/// A row's label with its unit, `~` when approximate.
pub(super) fn label(r: &MetricRow) -> String {
    let unit = if r.unit.is_empty() {
        String::new()
    } else {
        format!(" ({})", r.unit)
    };
    format!("{}{unit}{}", r.label, if r.approx { " ~" } else { "" })
}

fn header_lines(cmp: &Comparison) -> Vec<String> {
    let side = |name: &str, s: &super::compare::Side| {
        format!(
            "{name}: {} ({}{})",
            s.path,
            s.kind,
            s.requests
                .map_or(String::new(), |n| format!(", {n} requests"))
        )
    };
    let mut v = vec![
        side("baseline ", &cmp.baseline),
        side("candidate", &cmp.candidate),
    ];
    for n in &cmp.noise {
        v.push(side("noise    ", n));
    }
    v.push(format!(
        "significance: {:.0}% bootstrap interval of the change ({} resamples, seed {}){}",
        cmp.confidence * 100.0,
        cmp.resamples,
        cmp.seed,
        if !cmp.noise.is_empty() {
            "; a change must also exceed the largest |noise - baseline|"
        } else {
            ""
        }
    ));
    v
}

fn shape_cells(s: &Shape) -> Vec<String> {
    vec![
        s.requests.to_string(),
        s.auxiliary_left_out.to_string(),
        format!("{:.1}", s.duration_s),
        format!("{:.3}", s.rate_rps),
        format!("{:.2}", s.gap_cv),
        format!("{:.0} / {:.0} / {:.0}", s.isl.mean, s.isl.p50, s.isl.p99),
        format!("{:.0} / {:.0} / {:.0}", s.osl.mean, s.osl.p50, s.osl.p99),
        s.reuse
            .as_ref()
            .map_or("-".into(), |r| format!("{:.1}%", r.block_reuse * 100.0)),
        s.reuse.as_ref().map_or("-".into(), |r| {
            format!("{:.1}%", r.mean_prefix_hit_rate * 100.0)
        }),
        mix(&s.models),
        mix(&s.endpoints),
    ]
}

fn mix(m: &std::collections::BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "-".into();
    }
    let total: u64 = m.values().sum();
    m.iter()
        .map(|(k, v)| format!("{k} {:.0}%", *v as f64 * 100.0 / total.max(1) as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

const WORKLOAD_ROWS: [&str; 11] = [
    "requests",
    "side requests left out",
    "duration (s)",
    "arrival rate (req/s)",
    "burstiness (CV of gaps)",
    "ISL mean / p50 / p99",
    "OSL mean / p50 / p99",
    "block reuse",
    "prefix hit rate (mean)",
    "models",
    "endpoints",
];

fn workload_lines(w: &WorkloadCmp, md: bool) -> String {
    let mut s = String::new();
    let (b, c) = (shape_cells(&w.baseline), shape_cells(&w.candidate));
    if md {
        s.push_str("\n### Workload\n\n| | baseline | candidate |\n|---|---:|---:|\n");
        for (i, name) in WORKLOAD_ROWS.iter().enumerate() {
            let _ = writeln!(s, "| {name} | {} | {} |", b[i], c[i]);
        }
        s.push('\n');
    } else {
        s.push_str("\nWorkload\n");
        let _ = writeln!(s, "  {:<26} {:>22} {:>22}", "", "baseline", "candidate");
        for (i, name) in WORKLOAD_ROWS.iter().enumerate() {
            let _ = writeln!(s, "  {name:<26} {:>22} {:>22}", b[i], c[i]);
        }
    }
    let _ = writeln!(
        s,
        "{}ISL two-sample KS: D = {:.4}, p = {}; OSL: D = {:.4}, p = {}; gaps (at {} ms): D = {:.4}, p = {}",
        if md { "" } else { "  " },
        w.isl_ks.d,
        pval(w.isl_ks.p_value),
        w.osl_ks.d,
        pval(w.osl_ks.p_value),
        w.gaps_resolution_ms,
        w.gaps_ks.d,
        pval(w.gaps_ks.p_value)
    );
    if let Some(f) = &w.fidelity {
        let _ = writeln!(
            s,
            "{}Fidelity (trace vs its replay, {} requests paired, speed {}): arrival error p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; input length exact {:.1}% ({} counted by the server{}); output length exact {:.1}% (mean |diff| {:.2} tokens){}",
            if md { "\n" } else { "  " },
            f.paired,
            f.speed,
            f.arrival_error_ms.p50,
            f.arrival_error_ms.p99,
            f.arrival_error_ms.max,
            f.isl_exact * 100.0,
            f.isl_server_counted,
            if f.isl_estimated > 0 {
                format!("; {} estimated at record time, not judged", f.isl_estimated)
            } else {
                String::new()
            },
            f.osl_exact * 100.0,
            f.osl_mean_abs_diff,
            f.inexact_prompts
                .map_or(String::new(), |n| format!("; inexact prompts {n}"))
        );
        let _ = writeln!(s, "{}{}", if md { "\n" } else { "  " }, fidelity_verdict(f));
        if let Some(apart) = apart_line(f) {
            let _ = writeln!(s, "{}{apart}", if md { "\n" } else { "  " });
        }
        if !f.latency_ks.is_empty() {
            let ks: Vec<String> = f
                .latency_ks
                .iter()
                .map(|(k, d)| format!("{} D = {d:.3}", k.to_uppercase()))
                .collect();
            let _ = writeln!(
                s,
                "{}Latency agreement (two-sample KS, recorded vs replayed): {}",
                if md { "\n" } else { "  " },
                ks.join(", ")
            );
        }
        let _ = writeln!(
            s,
            "{}Prefix sharing is not in result files: compare the server's prefix-cache counters with `retrace inspect --cache-blocks`.",
            if md { "\n" } else { "  " }
        );
    }
    s
}

/// `http_500 1 (request 4)`, `cancelled 3 (requests 1, 5, 9)`: each kind, its count and the
/// first request indices.
fn named(m: &std::collections::BTreeMap<String, crate::report::workload::Apart>) -> String {
    m.iter()
        .map(|(kind, a)| {
            let idx: Vec<String> = a.first.iter().map(usize::to_string).collect();
            let more = if a.count > a.first.len() { ", ..." } else { "" };
            let word = if a.count == 1 { "request" } else { "requests" };
            format!("{kind} {} ({word} {}{more})", a.count, idx.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The cancels and failures counted apart, named, and whom they blame; `None` when there are
/// none.
fn apart_line(f: &crate::report::workload::Fidelity) -> Option<String> {
    let mut parts = Vec::new();
    if !f.recorded_apart.is_empty() {
        parts.push(format!(
            "did not complete in the recording: {} (the recording's clients or upstream, not the replay: a cancel is replayed as a cancel, a failure sent again)",
            named(&f.recorded_apart)
        ));
    }
    if !f.replay_failed.is_empty() {
        parts.push(format!(
            "failed in the replay only: {} (the target's failures)",
            named(&f.replay_failed)
        ));
    }
    (!parts.is_empty()).then(|| {
        format!(
            "Cancels and failures apart (lengths and latency judged on the {} requests that completed on both sides): {}.",
            f.completed_both,
            parts.join("; ")
        )
    })
}

/// "Faithful replay" or what kept it from being one.
fn fidelity_verdict(f: &crate::report::workload::Fidelity) -> String {
    let estimated = match f.isl_estimated {
        0 => String::new(),
        n => format!(
            " {n} input lengths were estimated at record time (no usage, no tokenizer): not judged."
        ),
    };
    if f.faithful {
        return format!(
            "Faithful replay: every request sent, lengths reproduced, schedule as recorded (sent within {:.2} ms at p99){}.{estimated}",
            f.send_tolerance_ms,
            match f.recorded_apart.values().map(|a| a.count).sum::<usize>() {
                0 => String::new(),
                k => format!("; {k} recorded cancels and failures apart (below)"),
            }
        );
    }
    let mut why = Vec::new();
    if f.left_out > 0 {
        why.push(format!(
            "{} workload requests left out by the replay (its result's `left_out` says why)",
            f.left_out
        ));
    }
    if f.unpaired > 0 {
        why.push(format!("{} requests not sent", f.unpaired));
    }
    if f.isl_exact < 1.0 || f.osl_exact < 1.0 {
        why.push("lengths differ".to_string());
    }
    let sched = f.schedule_error_ms.as_ref().unwrap_or(&f.arrival_error_ms);
    if sched.p99 > crate::report::workload::FAITHFUL_SCHEDULE_MS {
        why.push(format!("schedule off by {:.2} ms at p99", sched.p99));
    } else if !f.sent_on_time {
        why.push(format!(
            "sent late: the actual sends were {:.2} ms off the recording at p99 (tolerance {:.2} ms; the client or its machine was behind the schedule it planned)",
            f.arrival_error_ms.p99, f.send_tolerance_ms
        ));
    }
    format!("Not a faithful replay: {}.{estimated}", why.join(", "))
}

fn pval(p: f64) -> String {
    if p >= 0.001 {
        format!("{p:.3}")
    } else {
        format!("{p:.1e}")
    }
}

fn paired_line(cmp: &Comparison) -> Option<String> {
    let p = cmp.paired.as_ref()?;
    Some(format!(
        "Paired TTFT (same {} requests): candidate/baseline geometric mean {:.3} ({:.0}% CI {:.3}..{:.3}, {}); ratio p10 {:.3}, p50 {:.3}, p90 {:.3}; {:.1}% of requests >10% slower, {:.1}% >10% faster",
        p.n,
        p.geo_mean_ratio,
        cmp.confidence * 100.0,
        p.ci.0,
        p.ci.1,
        if p.significant { "significant" } else { "not significant" },
        p.p10,
        p.p50,
        p.p90,
        p.slower_10pct * 100.0,
        p.faster_10pct * 100.0
    ))
}

const COLUMNS: [&str; 7] = [
    "metric",
    "baseline",
    "candidate",
    "change",
    "rel",
    "interval of change",
    "verdict",
];

/// One line of the metrics table: aligned columns, or a Markdown row.
fn table_row(c: [&str; 7], md: bool) -> String {
    if md {
        return format!("| {} |", c.join(" | "));
    }
    format!(
        "{:<36} {:>11} {:>11} {:>11} {:>8} {:>26}  {}",
        c[0], c[1], c[2], c[3], c[4], c[5], c[6]
    )
}

/// The text (`md` false) or Markdown report: the same sections in the same order.
fn table(cmp: &Comparison, rules: &[RuleOutcome], md: bool) -> String {
    let line = Overall::of(cmp, rules).line;
    let mut s = match md {
        true => format!("**{line}**\n\n## retrace compare\n\n"),
        false => format!("{line}\n\n"),
    };
    for l in header_lines(cmp) {
        let l = if md {
            format!("- {}", l.replace("  ", " "))
        } else {
            l
        };
        let _ = writeln!(s, "{l}");
    }
    s.push('\n');
    if cmp.rows.is_empty() && md {
        s.push_str("No latency or throughput in either input: workload comparison only.\n");
    } else if cmp.rows.is_empty() {
        s.push_str("no latency or throughput in either input: workload comparison only\n");
    } else {
        let _ = writeln!(s, "{}", table_row(COLUMNS, md));
        if md {
            s.push_str("|---|---:|---:|---:|---:|---:|---|\n");
        }
    }
    for r in &cmp.rows {
        let cells = [
            label(r),
            opt(r.baseline),
            opt(r.candidate),
            signed(r.abs_change),
            pct(r.rel_change),
            ci(r),
            verdict(r.verdict, md).to_string(),
        ];
        let _ = writeln!(s, "{}", table_row(cells.each_ref().map(String::as_str), md));
    }
    if cmp.rows.iter().any(|r| r.approx) {
        s.push_str(if md { "\n" } else { "" });
        s.push_str("~ from HdrHistogram buckets (0.1% precision)\n");
    }
    if let Some(p) = paired_line(cmp) {
        let _ = writeln!(s, "\n{p}");
    }
    if let Some(w) = &cmp.workload {
        s.push_str(&workload_lines(w, md));
    }
    if !cmp.notes.is_empty() {
        s.push('\n');
        for n in &cmp.notes {
            let _ = writeln!(s, "{}note: {n}", if md { "> " } else { "" });
        }
    }
    if !rules.is_empty() {
        s.push_str(if md { "\n### --fail-on\n\n" } else { "\n" });
        for o in rules {
            let _ = writeln!(s, "{}{}", if md { "- " } else { "" }, o.message);
        }
    }
    s
}

fn json(cmp: &Comparison, rules: &[RuleOutcome]) -> String {
    let mut v = serde_json::to_value(cmp).unwrap_or_default();
    if let Some(m) = v.as_object_mut() {
        m.insert(
            "rules".into(),
            serde_json::to_value(rules).unwrap_or_default(),
        );
        m.insert(
            "failed".into(),
            serde_json::Value::Bool(rules.iter().any(|o| o.tripped)),
        );
        m.insert(
            "verdict".into(),
            serde_json::to_value(Overall::of(cmp, rules)).unwrap_or_default(),
        );
    }
    let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::compare::tests::{strict_compare, synth_run};

    /// No change prints as 0 (not `+0`, `+0.0%` or a float's rounding error); a change keeps
    /// its sign.
    #[test]
    fn no_change_prints_0() {
        assert_eq!(signed(Some(0.0)), "0");
        assert_eq!(signed(Some(-0.0)), "0");
        assert_eq!(pct(Some(0.0)), "0%");
        assert_eq!(signed(Some(0.26)), "+0.2600");
        assert_eq!(signed(Some(-1.5)), "-1.50");
        assert_eq!(pct(Some(0.161)), "+16.1%");
    }

    /// `s` with each bootstrap interval's bounds masked, in the same width: a snapshot holds the
    /// layout and the point figures, not the resampler's draws (what the intervals find is
    /// tested in compare.rs).
    fn mask_intervals(s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        while let Some(i) = rest.find(['[', 'C']) {
            out.push_str(&rest[..i]);
            rest = &rest[i..];
            if let Some(tail) = rest.strip_prefix("CI ") {
                let end = tail.find(',').unwrap_or(tail.len());
                out.push_str("CI lo..hi");
                rest = &tail[end..];
            } else if let Some(end) = rest.find(']').filter(|&e| e >= 7 && rest.starts_with('[')) {
                let inner = &rest[1..end];
                let bounds = inner.contains(", ") && !inner.contains('\n');
                if bounds && inner.bytes().any(|b| b.is_ascii_digit()) {
                    out.push_str(&format!("{:>w$}", "[lo, hi]", w = end + 1));
                } else {
                    out.push_str(&rest[..=end]);
                }
                rest = &rest[end + 1..];
            } else {
                out.push_str(&rest[..1]);
                rest = &rest[1..];
            }
        }
        out.push_str(rest);
        out
    }

    /// The text and Markdown layouts, intervals masked ([`mask_intervals`]).
    #[test]
    fn text_and_markdown_snapshots() {
        let b = synth_run(300, 100.0, 1);
        let c = synth_run(300, 120.0, 2);
        let cmp = strict_compare(&b, &c, &[], 5, 50);
        let rules = crate::report::rules::evaluate(
            &crate::report::rules::parse("median_ttft_ms>+10%,failure_rate>0.01").unwrap(),
            &cmp,
        )
        .unwrap();
        let mut t = render(&cmp, &rules, RenderFormat::Text);
        // the synthetic runs' paths are not files; keep the snapshot free of them
        t = t
            .replace("synthetic-1.json", "BASE")
            .replace("synthetic-2.json", "CAND");
        insta::assert_snapshot!("compare_text", mask_intervals(&t));
        let m = render(&cmp, &rules, RenderFormat::Markdown)
            .replace("synthetic-1.json", "BASE")
            .replace("synthetic-2.json", "CAND");
        insta::assert_snapshot!("compare_markdown", mask_intervals(&m));
    }

    #[test]
    fn formats_show_every_row_and_the_verdict() {
        let b = synth_run(500, 100.0, 1);
        let c = synth_run(500, 150.0, 2);
        let cmp = strict_compare(&b, &c, &[], 1, 100);
        let t = render(&cmp, &[], RenderFormat::Text);
        assert!(t.contains("mean TTFT (ms)") && t.contains("WORSE"), "{t}");
        let m = render(&cmp, &[], RenderFormat::Markdown);
        assert!(
            m.contains("| mean TTFT (ms) |") && m.contains("**worse**"),
            "{m}"
        );
        let j: serde_json::Value =
            serde_json::from_str(&render(&cmp, &[], RenderFormat::Json)).unwrap();
        assert_eq!(j["schema"], "retrace.compare/1");
        assert_eq!(j["failed"], false);
        let row = j["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == "mean_ttft_ms")
            .unwrap();
        assert_eq!(row["verdict"], "worse");
        assert_eq!(row["better"], "lower");
    }
}
