//! The console table of the steps and the answer's line.

use super::slo::Slo;
use std::fmt::Write as _;

/// One step's row.
pub(crate) struct Row {
    pub(crate) speed: f64,
    pub(crate) offered_rps: f64,
    pub(crate) achieved_rps: f64,
    pub(crate) offered_output_tps: f64,
    pub(crate) achieved_output_tps: f64,
    pub(crate) p50_ttft_ms: Option<f64>,
    pub(crate) p99_ttft_ms: Option<f64>,
    pub(crate) p99_itl_ms: Option<f64>,
    pub(crate) goodput: Option<f64>,
    /// Failed requests, those the early cut stopped aside.
    pub(crate) failed: u64,
    /// Requests a step given up early cut in flight or did not send.
    pub(crate) cut: u64,
    pub(crate) slo_met: bool,
    pub(crate) because: Option<String>,
}

/// The answer, as the line says it.
pub(crate) struct AnswerView {
    pub(crate) speed: Option<f64>,
    pub(crate) at_least: bool,
    /// The load offered at the answer's factor (what the deployment took within the SLO; the
    /// achieved rate is in the step's row, lower by the drain).
    pub(crate) rps: Option<f64>,
    pub(crate) output_tps: Option<f64>,
    /// The metric (or the reason) the first step past the answer failed on.
    pub(crate) limited_by: Option<String>,
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

/// The steps in the order they ran.
pub(crate) fn render(rows: &[Row], slo: &Slo) -> String {
    let rules: Vec<&str> = slo.rules.iter().map(|r| r.text.as_str()).collect();
    let mut out = format!("Capacity search, SLO {}\n", rules.join(","));
    let _ = writeln!(
        out,
        "{:>8} {:>9} {:>9} {:>10} {:>10} {:>9} {:>9} {:>9} {:>8} {:>6}  SLO",
        "factor",
        "offer r/s",
        "got r/s",
        "offer t/s",
        "got t/s",
        "p50 TTFT",
        "p99 TTFT",
        "p99 ITL",
        "goodput",
        "failed"
    );
    for r in rows {
        let verdict = match (&r.because, r.slo_met) {
            (_, true) => "met".to_string(),
            // The whole reason is in the result file (`not_met_because`).
            (Some(why), false) if why.starts_with("given up") => {
                format!("NOT met (given up early; {} cut)", r.cut)
            }
            (Some(why), false) => format!("NOT met ({why})"),
            (None, false) => "NOT met".to_string(),
        };
        let _ = writeln!(
            out,
            "{:>7}× {:>9.2} {:>9.2} {:>10.0} {:>10.0} {:>9} {:>9} {:>9} {:>8} {:>6}  {verdict}",
            r.speed,
            r.offered_rps,
            r.achieved_rps,
            r.offered_output_tps,
            r.achieved_output_tps,
            ms(r.p50_ttft_ms),
            ms(r.p99_ttft_ms),
            ms(r.p99_itl_ms),
            r.goodput.map_or("-".into(), |g| format!("{g:.2}")),
            r.failed,
        );
    }
    out
}

/// A rule's metric in words (`p99_ttft_ms` → "p99 TTFT").
fn words(metric: &str) -> String {
    let m = metric.strip_suffix("_ms").unwrap_or(metric);
    match m.split_once('_') {
        Some((stat, name)) if ["mean", "median"].contains(&stat) || stat.starts_with('p') => {
            format!("{stat} {}", name.replace('_', " ").to_uppercase())
        }
        _ => m.replace('_', " "),
    }
}

fn tokens(t: f64) -> String {
    match t >= 1000.0 {
        true => format!("{:.1}k", t / 1000.0),
        false => format!("{t:.0}"),
    }
}

/// `capacity: 2.6× the recorded traffic (41 req/s, 9.8k output tok/s) within p99_ttft_ms<=500;
/// limited by p99 TTFT`.
pub(crate) fn answer_line(a: &AnswerView, slo: &Slo) -> String {
    let rules: Vec<&str> = slo.rules.iter().map(|r| r.text.as_str()).collect();
    let within = rules.join(",");
    let Some(speed) = a.speed else {
        let why = a
            .limited_by
            .as_deref()
            .map_or(String::new(), |m| format!("; limited by {}", words(m)));
        return format!(
            "capacity: the SLO {within} was not met at any speed tried, down to the lowest{why}"
        );
    };
    let rate = match (a.rps, a.output_tps) {
        (Some(r), Some(t)) => format!(" (offered {r:.1} req/s, {} output tok/s)", tokens(t)),
        _ => String::new(),
    };
    let tail = match (&a.limited_by, a.at_least) {
        (_, true) => "; met at the highest speed tried: at least that".to_string(),
        (Some(m), false) => format!("; limited by {}", words(m)),
        (None, false) => String::new(),
    };
    let least = if a.at_least { "at least " } else { "" };
    format!("capacity: {least}{speed}× the recorded traffic{rate} within {within}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step given up early counts the requests its cut stopped apart from its failures.
    #[test]
    fn a_given_up_step_shows_its_cut_requests_apart_from_its_failures() {
        let slo = super::super::slo::parse("p99_ttft_ms<=500").unwrap();
        let row = Row {
            speed: 8.0,
            offered_rps: 80.0,
            achieved_rps: 20.0,
            offered_output_tps: 800.0,
            achieved_output_tps: 200.0,
            p50_ttft_ms: Some(900.0),
            p99_ttft_ms: Some(2000.0),
            p99_itl_ms: Some(10.0),
            goodput: None,
            failed: 3,
            cut: 41,
            slo_met: false,
            because: Some("given up: 12 of 200 requests missed".into()),
        };
        let text = render(&[row], &slo);
        let line = text.lines().nth(2).unwrap();
        assert!(
            line.ends_with("      3  NOT met (given up early; 41 cut)"),
            "{line}"
        );
    }

    #[test]
    fn the_answer_says_the_factor_the_rates_and_the_limit() {
        let slo = super::super::slo::parse("p99_ttft_ms<=500").unwrap();
        let a = AnswerView {
            speed: Some(2.6),
            at_least: false,
            rps: Some(41.0),
            output_tps: Some(9_800.0),
            limited_by: Some("p99_ttft_ms".into()),
        };
        assert_eq!(
            answer_line(&a, &slo),
            "capacity: 2.6× the recorded traffic (offered 41.0 req/s, 9.8k output tok/s) within p99_ttft_ms<=500; limited by p99 TTFT"
        );
        let all = AnswerView {
            at_least: true,
            limited_by: None,
            ..a
        };
        assert!(answer_line(&all, &slo).starts_with("capacity: at least 2.6×"));
        let none = AnswerView {
            speed: None,
            at_least: false,
            rps: None,
            output_tps: None,
            limited_by: Some("failure_rate".into()),
        };
        assert_eq!(
            answer_line(&none, &slo),
            "capacity: the SLO p99_ttft_ms<=500 was not met at any speed tried, down to the lowest; limited by failure rate"
        );
    }
}
