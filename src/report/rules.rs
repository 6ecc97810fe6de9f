//! `--fail-on` rules for CI gating: parsing and evaluation against a [`Comparison`].
//!
//! Grammar: comma-separated `METRIC OP THRESHOLD`, `OP` one of `>`, `>=`, `<`, `<=`.
//! - `p99_ttft_ms>+10%`: relative change (candidate vs baseline) above +10 % (a `%` threshold is
//!   always a relative change; the sign is optional);
//! - `mean_tpot_ms>+2.5`: signed number = absolute change in the metric's unit;
//! - `failure_rate>0.01`: unsigned number = the candidate's own value.
//!
//! `METRIC` is a comparison row key: `{mean,median,p90,p99}_{ttft,tpot,itl,e2el,client_queue,
//! server_queue,server_ttft,unattributed}_ms`, `request_throughput`, `output_throughput`,
//! `total_token_throughput`, `request_goodput`, `failure_rate`.
//!
//! A change rule does not trip when the comparison judged the change not significant (inside the
//! confidence interval, the `--noise` band, or below `--min-effect`): it is reported as ignored.
//! A change rule on a row with too few samples (`n/a`) is "not judged", neither pass nor fail.
//! Value rules always apply. Nothing missing or NaN ever passes: a rule whose metric is missing
//! from an input is an error, a NaN fails, and when the candidate's failure rate rose by more than
//! [`FAILURE_GUARD`] (or every request failed) every rule but `failure_rate`'s fails, saying why.
//! This module prints nothing.

use super::compare::Comparison;
use serde::Serialize;

/// Comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) enum Op {
    Gt,
    Ge,
    Lt,
    Le,
}

impl Op {
    pub(crate) fn holds(self, a: f64, b: f64) -> bool {
        match self {
            Op::Gt => a > b,
            Op::Ge => a >= b,
            Op::Lt => a < b,
            Op::Le => a <= b,
        }
    }
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Op::Gt => ">",
            Op::Ge => ">=",
            Op::Lt => "<",
            Op::Le => "<=",
        }
    }
}

/// What the threshold is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Threshold {
    /// Relative change, as a fraction (+10 % → 0.10).
    Relative(f64),
    /// Absolute change in the metric's unit.
    Absolute(f64),
    /// The candidate's value.
    Value(f64),
}

/// One parsed rule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rule {
    pub(crate) text: String,
    pub(crate) metric: String,
    pub(crate) op: Op,
    pub(crate) threshold: Threshold,
}

/// A rule that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--fail-on rule `{rule}`: {msg}")]
pub struct RuleError {
    pub(crate) rule: String,
    pub(crate) msg: String,
}

const STATS: [&str; 4] = ["mean", "median", "p90", "p99"];
const METRICS: [&str; 8] = [
    "ttft",
    "tpot",
    "itl",
    "e2el",
    "client_queue",
    "server_queue",
    "server_ttft",
    "unattributed",
];
const SCALARS: [&str; 5] = [
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "request_goodput",
    "failure_rate",
];

fn known_metric(m: &str) -> bool {
    if SCALARS.contains(&m) {
        return true;
    }
    let Some(rest) = m.strip_suffix("_ms") else {
        return false;
    };
    STATS.iter().any(|s| {
        rest.strip_prefix(s)
            .and_then(|r| r.strip_prefix('_'))
            .is_some_and(|r| METRICS.contains(&r))
    })
}

/// Parses a `--fail-on` list.
pub fn parse(spec: &str) -> Result<Vec<Rule>, RuleError> {
    let mut out = Vec::new();
    for raw in spec.split(',') {
        let text = raw.trim();
        if text.is_empty() {
            continue;
        }
        let err = |msg: String| RuleError {
            rule: text.to_string(),
            msg,
        };
        let pos = text.find(['>', '<']).ok_or_else(|| {
            err("no operator; write METRIC>THRESHOLD, e.g. p99_ttft_ms>+10%".into())
        })?;
        let metric = text[..pos].trim();
        let rest = &text[pos..];
        let (op, thr) = if let Some(r) = rest.strip_prefix(">=") {
            (Op::Ge, r)
        } else if let Some(r) = rest.strip_prefix("<=") {
            (Op::Le, r)
        } else if let Some(r) = rest.strip_prefix('>') {
            (Op::Gt, r)
        } else {
            (Op::Lt, &rest[1..])
        };
        if metric.is_empty() {
            return Err(err("missing metric name before the operator".into()));
        }
        if !known_metric(metric) {
            return Err(err(format!(
                "unknown metric `{metric}`; use {{mean,median,p90,p99}}_{{{}}}_ms or one of {}",
                METRICS.join(","),
                SCALARS.join(", ")
            )));
        }
        let thr = thr.trim();
        if thr.is_empty() {
            return Err(err("missing threshold after the operator".into()));
        }
        let signed = thr.starts_with(['+', '-']);
        let threshold = if let Some(num) = thr.strip_suffix('%') {
            let v: f64 = num
                .trim()
                .parse()
                .map_err(|_| err(format!("`{thr}` is not a percentage like +10%")))?;
            Threshold::Relative(v / 100.0)
        } else {
            let v: f64 = thr.parse().map_err(|_| {
                err(format!(
                    "`{thr}` is not a number (use +N% for a relative change, +N for an absolute change, N for a value)"
                ))
            })?;
            if signed {
                Threshold::Absolute(v)
            } else {
                Threshold::Value(v)
            }
        };
        let finite = match threshold {
            Threshold::Relative(v) | Threshold::Absolute(v) | Threshold::Value(v) => v.is_finite(),
        };
        if !finite {
            return Err(err("threshold must be finite".into()));
        }
        out.push(Rule {
            text: text.to_string(),
            metric: metric.to_string(),
            op,
            threshold,
        });
    }
    Ok(out)
}

/// The outcome of one rule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuleOutcome {
    pub(crate) rule: String,
    pub tripped: bool,
    /// The threshold was crossed but the change is not significant.
    pub(crate) ignored_as_noise: bool,
    /// Too few samples to judge the change (the row's `n/a`): neither a pass nor a failure.
    pub(crate) not_judged: bool,
    /// The value compared with the threshold.
    pub observed: f64,
    pub message: String,
    /// The message in a few words, for the verdict line (`p99_ttft_ms +12.00% > +10%`).
    pub(crate) brief: String,
}

/// A rule that cannot be evaluated (its metric is missing from an input).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--fail-on rule `{rule}` cannot be evaluated: {msg}")]
pub struct EvalError {
    pub(crate) rule: String,
    pub(crate) msg: String,
}

/// Evaluates every rule.
pub fn evaluate(rules: &[Rule], cmp: &Comparison) -> Result<Vec<RuleOutcome>, EvalError> {
    rules.iter().map(|rule| evaluate_one(rule, cmp)).collect()
}

fn evaluate_one(rule: &Rule, cmp: &Comparison) -> Result<RuleOutcome, EvalError> {
    let outcome = |observed: f64, message: String| RuleOutcome {
        rule: rule.text.clone(),
        tripped: false,
        ignored_as_noise: false,
        not_judged: false,
        observed,
        message,
        brief: rule.text.clone(),
    };
    let err = |msg: &str| EvalError {
        rule: rule.text.clone(),
        msg: msg.to_string(),
    };
    // Before anything is read: a failed candidate's figures may be missing altogether.
    if let Some(why) = failed_candidate(cmp).filter(|_| rule.metric != "failure_rate") {
        let message = format!("FAIL {}: {why}", rule.text);
        return Ok(RuleOutcome {
            tripped: true,
            brief: format!("{}: the candidate's failure rate rose", rule.metric),
            ..outcome(f64::NAN, message)
        });
    }
    let row = cmp
        .row(&rule.metric)
        .ok_or_else(|| err("neither input has this metric"))?;
    let (a, t, a_text, t_text, what) = match rule.threshold {
        Threshold::Relative(t) => {
            let r = row.rel_change.ok_or_else(|| {
                err("no relative change (missing on one side, or a baseline of 0)")
            })?;
            let (r_text, t_text) = (format!("{:+.2}%", r * 100.0), format!("{:+}%", t * 100.0));
            (r, t, r_text, t_text, "change")
        }
        Threshold::Absolute(t) => {
            let a = row.abs_change.ok_or_else(|| err("missing on one side"))?;
            (a, t, format!("{a:+.4}"), format!("{t:+}"), "change")
        }
        Threshold::Value(t) => {
            let v = row
                .candidate
                .ok_or_else(|| err("missing in the candidate"))?;
            (v, t, format!("{v:.4}"), format!("{t}"), "value")
        }
    };
    if !a.is_finite() {
        let message = format!("FAIL {}: {what} is {a_text}, which never passes", rule.text);
        return Ok(RuleOutcome {
            tripped: true,
            brief: format!("{} {what} {a_text}", rule.metric),
            ..outcome(a, message)
        });
    }
    let is_change = what == "change";
    if is_change && row.significant.is_none() {
        let message = format!(
            "not judged {}: {what} {a_text}, too few samples to tell it from noise",
            rule.text
        );
        return Ok(RuleOutcome {
            not_judged: true,
            brief: format!("{}: too few samples", rule.metric),
            ..outcome(a, message)
        });
    }
    let crossed = rule.op.holds(a, t);
    let noise = is_change && crossed && row.significant == Some(false);
    let tripped = crossed && !noise;
    let message = if tripped {
        format!(
            "FAIL {}: {what} {a_text} {} {t_text} (baseline {}, candidate {})",
            rule.text,
            rule.op.as_str(),
            fmt_opt(row.baseline),
            fmt_opt(row.candidate)
        )
    } else if noise {
        format!(
            "ignored {}: {what} {a_text} crosses {t_text} but is not significant (within the confidence interval or noise band)",
            rule.text
        )
    } else {
        format!("ok {}: {what} {a_text}", rule.text)
    };
    let brief = match tripped {
        true => format!("{} {a_text} {} {t_text}", rule.metric, rule.op.as_str()),
        false => rule.text.clone(),
    };
    Ok(RuleOutcome {
        tripped,
        ignored_as_noise: noise,
        brief,
        ..outcome(a, message)
    })
}

/// A rise of the candidate's failure rate beyond this (absolute) makes its latency and
/// throughput incomparable with the baseline's: every rule on them fails.
pub(crate) const FAILURE_GUARD: f64 = 0.05;

/// Why the candidate's figures cannot pass, if its failure rate rose beyond [`FAILURE_GUARD`]
/// (a candidate with no successful request included) or is unknown.
fn failed_candidate(cmp: &Comparison) -> Option<String> {
    let row = cmp.row("failure_rate")?;
    let (b, c) = (row.baseline.unwrap_or(0.0), row.candidate?);
    if !c.is_finite() || c - b > FAILURE_GUARD || c >= 1.0 {
        return Some(format!(
            "the candidate's failure rate is {:.1}% (baseline {:.1}%): its latency and throughput are not comparable",
            c * 100.0,
            b * 100.0
        ));
    }
    None
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.4}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::compare::tests::{strict_compare, synth_run};
    use crate::report::compare::{compare, MinEffect, Settings, Verdict};
    use crate::report::load::Run;

    #[test]
    fn parses_the_documented_forms() {
        let r = parse("p99_ttft_ms>+10%, mean_tpot_ms>+5%,failure_rate>0.01,request_throughput<-5%,mean_itl_ms>=+2.5")
            .unwrap();
        assert_eq!(r.len(), 5);
        assert_eq!(r[0].metric, "p99_ttft_ms");
        assert_eq!(r[0].op, Op::Gt);
        assert_eq!(r[0].threshold, Threshold::Relative(0.10));
        assert_eq!(r[2].threshold, Threshold::Value(0.01));
        assert_eq!(r[3].op, Op::Lt);
        assert_eq!(r[3].threshold, Threshold::Relative(-0.05));
        assert_eq!(r[4].op, Op::Ge);
        assert_eq!(r[4].threshold, Threshold::Absolute(2.5));
    }

    #[test]
    fn bad_rules_are_named() {
        for (spec, bad, words) in [
            (
                "p99_ttft_ms>+10%,p99_tfft_ms>+10%",
                "p99_tfft_ms>+10%",
                "unknown metric",
            ),
            ("p99_ttft_ms 10%", "p99_ttft_ms 10%", "no operator"),
            (">5", ">5", "missing metric"),
            ("p99_ttft_ms>", "p99_ttft_ms>", "missing threshold"),
            ("p99_ttft_ms>+ten%", "p99_ttft_ms>+ten%", "not a percentage"),
            ("failure_rate>abc", "failure_rate>abc", "not a number"),
        ] {
            let e = parse(spec).unwrap_err();
            assert_eq!(e.rule, bad);
            let text = e.to_string();
            assert!(text.contains(words) && text.contains(bad), "{text}");
        }
    }

    #[test]
    fn evaluation_trips_ignores_noise_and_refuses_missing() {
        let b = synth_run(1500, 100.0, 1);
        let c = synth_run(1500, 110.0, 2);
        let cmp = strict_compare(&b, &c, &[], 7, 200);
        let o = evaluate(
            &parse("median_ttft_ms>+5%,failure_rate>0.01").unwrap(),
            &cmp,
        )
        .unwrap();
        assert!(o[0].tripped, "{:?}", o[0]);
        assert!(o[0].message.starts_with("FAIL median_ttft_ms>+5%"));
        assert!(!o[1].tripped);
        // Same distribution: a +0.1 % threshold is crossed by chance but is noise.
        let c2 = synth_run(1500, 100.0, 3);
        let cmp = strict_compare(&b, &c2, &[], 7, 200);
        let rel = cmp.row("median_ttft_ms").unwrap().rel_change.unwrap();
        let rule = if rel > 0.0 {
            "median_ttft_ms>+0%"
        } else {
            "median_ttft_ms<-0%"
        };
        let o = evaluate(&parse(rule).unwrap(), &cmp).unwrap();
        assert!(!o[0].tripped && o[0].ignored_as_noise, "{:?}", o[0]);
        // No server metrics in either run.
        let e = evaluate(&parse("p99_server_ttft_ms>+1%").unwrap(), &cmp).unwrap_err();
        assert!(e.to_string().contains("p99_server_ttft_ms"));
    }

    fn cmp_of(b: &Run, c: &Run) -> Comparison {
        compare(
            b,
            c,
            &[],
            &Settings {
                seed: 7,
                resamples: 200,
                ..Default::default()
            },
        )
    }

    #[test]
    fn a_candidate_whose_requests_all_failed_fails_every_latency_rule() {
        let b = synth_run(500, 100.0, 1);
        let mut c = synth_run(500, 100.0, 2);
        let r = c.requests.as_mut().unwrap();
        for i in 0..r.len() {
            r.errors[i] = "http_503".into();
            r.ttft_s[i] = None;
            r.latency_s[i] = None;
            r.itls_s[i].clear();
        }
        c.scalars.insert("completed".into(), 0.0);
        c.scalars.insert("failed".into(), 500.0);
        let cmp = cmp_of(&b, &c);
        let fr = cmp.row("failure_rate").unwrap();
        let (lo, hi) = fr.ci.unwrap();
        assert!(
            (-1.0..=1.0).contains(&lo) && (-1.0..=1.0).contains(&hi),
            "{fr:?}"
        );
        let o = evaluate(
            &parse("p99_ttft_ms>+10%,mean_tpot_ms>+5%,failure_rate>0.5").unwrap(),
            &cmp,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        for x in &o {
            assert!(x.tripped, "{x:?}");
        }
        assert!(
            o[0].message.contains("failure rate is 100.0%"),
            "{}",
            o[0].message
        );
    }

    #[test]
    fn too_few_samples_is_not_judged_and_nan_never_passes() {
        let cmp = cmp_of(&synth_run(200, 100.0, 1), &synth_run(200, 100.0, 2));
        let o = evaluate(&parse("p99_ttft_ms>+5%,p99_ttft_ms<-5%").unwrap(), &cmp).unwrap();
        for x in &o {
            assert!(x.not_judged && !x.tripped, "{x:?}");
            assert!(x.message.starts_with("not judged"), "{}", x.message);
        }
        let mut cmp = cmp_of(&synth_run(1500, 100.0, 1), &synth_run(1500, 100.0, 2));
        let row = cmp.rows.iter_mut().find(|r| r.key == "p90_itl_ms").unwrap();
        row.rel_change = Some(f64::NAN);
        let o = evaluate(&parse("p90_itl_ms>+10%").unwrap(), &cmp).unwrap();
        assert!(o[0].tripped && o[0].message.contains("NaN"), "{:?}", o[0]);
    }

    #[test]
    fn a_change_below_the_minimum_effect_is_no_change() {
        let b = synth_run(1500, 100.0, 1);
        let mut c = b.clone();
        for itls in &mut c.requests.as_mut().unwrap().itls_s {
            for v in itls.iter_mut() {
                *v += 0.00003; // +0.03 ms on 11 ms: 0.27 %
            }
        }
        let strict = strict_compare(&b, &c, &[], 7, 200);
        assert_eq!(strict.row("mean_itl_ms").unwrap().verdict, Verdict::Worse);
        let default = cmp_of(&b, &c); // MinEffect::DEFAULT
        assert_eq!(default.row("mean_itl_ms").unwrap().verdict, Verdict::Same);
        let o = evaluate(&parse("mean_itl_ms>+0.1%").unwrap(), &default).unwrap();
        assert!(!o[0].tripped && o[0].ignored_as_noise, "{:?}", o[0]);
        assert_eq!(
            MinEffect::parse("0.5%").unwrap(),
            MinEffect::Relative(0.005)
        );
        assert_eq!(MinEffect::parse("2").unwrap(), MinEffect::Absolute(2.0));
        assert!(MinEffect::parse("-1%")
            .unwrap_err()
            .contains("--min-effect"));
        // Every interval holds its own point estimate.
        for r in strict.rows.iter().chain(&default.rows) {
            if let (Some((lo, hi)), Some(d)) = (r.ci, r.abs_change) {
                assert!(lo <= d && d <= hi, "{r:?}");
            }
        }
    }
}
