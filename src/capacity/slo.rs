//! `--slo`: compare's rule grammar ([`crate::report::rules`]) with value thresholds only, and
//! vLLM's goodput terms; judged on one step's [`Summary`].
//!
//! `p99_ttft_ms<=500,p99_itl_ms<=80,failure_rate<=0.01`: every rule must hold. A vLLM goodput
//! term `ttft:500` (also `tpot:MS`, `e2el:MS`) reads as `p99_ttft_ms<=500` and sets the step's
//! goodput objective, so `request_goodput` is measured as `vllm bench serve --goodput` does.

use crate::metrics::{self, Stats, Summary};
use crate::replay::step::{Budget, Judged};
use crate::report::rules::{self, Op, Rule, Threshold};

/// The parsed `--slo`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Slo {
    pub(crate) rules: Vec<Rule>,
    /// The goodput objectives of vLLM's terms.
    pub(crate) goodput: metrics::Slo,
}

/// One rule judged on a step.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Judgement {
    pub(crate) rule: String,
    pub(crate) metric: String,
    /// `None`: the step has no value for it (no successful request), which never meets it.
    pub(crate) value: Option<f64>,
    pub(crate) met: bool,
}

/// Parses `--slo`; every error names the flag and the rule.
pub(crate) fn parse(spec: &str) -> Result<Slo, String> {
    let mut slo = Slo::default();
    let mut text = Vec::new();
    for item in spec
        .split([',', ' '])
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        match goodput_term(item)? {
            Some((metric, ms)) => {
                match metric {
                    "ttft" => slo.goodput.ttft_ms = Some(ms),
                    "tpot" => slo.goodput.tpot_ms = Some(ms),
                    _ => slo.goodput.e2el_ms = Some(ms),
                }
                text.push(format!("p99_{metric}_ms<={ms}"));
            }
            None => text.push(item.to_string()),
        }
    }
    let parsed =
        rules::parse(&text.join(",")).map_err(|e| format!("--slo rule `{}`: {}", e.rule, e.msg))?;
    for r in &parsed {
        if !matches!(r.threshold, Threshold::Value(_)) {
            return Err(format!(
                "--slo rule `{}`: give a value (like p99_ttft_ms<=500), not a change: an SLO has no baseline",
                r.text
            ));
        }
    }
    if parsed.is_empty() {
        return Err(format!(
            "--slo {spec:?}: give at least one rule, like p99_ttft_ms<=500"
        ));
    }
    slo.rules = parsed;
    Ok(slo)
}

/// `ttft:500` as ("ttft", 500): a vLLM goodput term; `None` for anything else.
fn goodput_term(item: &str) -> Result<Option<(&'static str, f64)>, String> {
    let Some((k, v)) = item.split_once(':') else {
        return Ok(None);
    };
    let metric = match k.trim() {
        "ttft" => "ttft",
        "tpot" => "tpot",
        "e2el" => "e2el",
        _ => return Ok(None),
    };
    match v.trim().parse::<f64>() {
        Ok(ms) if ms.is_finite() && ms >= 0.0 => Ok(Some((metric, ms))),
        _ => Err(format!(
            "--slo term `{item}`: vLLM's goodput terms are ttft:MS, tpot:MS or e2el:MS"
        )),
    }
}

impl Slo {
    /// Every rule judged on `s`.
    pub(crate) fn judge(&self, s: &Summary) -> Vec<Judgement> {
        self.rules
            .iter()
            .map(|r| {
                let value = value(s, &r.metric).filter(|v| v.is_finite());
                let Threshold::Value(t) = r.threshold else {
                    unreachable!("parse keeps value thresholds only")
                };
                Judgement {
                    rule: r.text.clone(),
                    metric: r.metric.clone(),
                    value,
                    met: value.is_some_and(|v| r.op.holds(v, t)),
                }
            })
            .collect()
    }

    /// The rules a step can lose for good before it ends ([`crate::replay::step`]): `pP` and
    /// median bounds from above on TTFT, TPOT and E2EL, and the failure rate's.
    pub(crate) fn budgets(&self) -> Vec<Budget> {
        self.rules.iter().filter_map(budget).collect()
    }
}

fn budget(r: &Rule) -> Option<Budget> {
    let Threshold::Value(threshold) = r.threshold else {
        return None;
    };
    let strict = match r.op {
        Op::Le => false,
        Op::Lt => true,
        Op::Gt | Op::Ge => return None,
    };
    let (judged, percentile) = match r.metric.as_str() {
        "failure_rate" => (Judged::Failed, None),
        m => {
            let (stat, rest) = m.strip_suffix("_ms")?.split_once('_')?;
            let p = match stat {
                "median" => 50.0,
                _ => stat.strip_prefix('p')?.parse().ok()?,
            };
            let judged = match rest {
                "ttft" => Judged::TtftMs,
                "tpot" => Judged::TpotMs,
                "e2el" => Judged::E2elMs,
                _ => return None,
            };
            (judged, Some(p))
        }
    };
    Some(Budget {
        text: r.text.clone(),
        judged,
        threshold,
        strict,
        percentile,
    })
}

/// The percentiles a step reports so that every rule finds its value.
pub(crate) const PERCENTILES: [f64; 3] = [50.0, 90.0, 99.0];

/// The value of a rule's metric in `s` (compare's row keys).
pub(crate) fn value(s: &Summary, metric: &str) -> Option<f64> {
    let total = s.completed + s.failed;
    match metric {
        "request_throughput" => return Some(s.request_throughput),
        "output_throughput" => return Some(s.output_throughput),
        "total_token_throughput" => return Some(s.total_token_throughput),
        "request_goodput" => return s.request_goodput,
        "failure_rate" => return (total > 0).then(|| s.failed as f64 / total as f64),
        _ => {}
    }
    let (stat, rest) = metric.strip_suffix("_ms")?.split_once('_')?;
    let stats = stats_of(s, rest)?;
    if stats.count == 0 {
        return None;
    }
    match stat {
        "mean" => Some(stats.mean),
        "median" => Some(stats.median),
        p => {
            let p: f64 = p.strip_prefix('p')?.parse().ok()?;
            stats
                .percentiles
                .iter()
                .find(|(q, _)| *q == p)
                .map(|(_, v)| *v)
        }
    }
}

fn stats_of<'a>(s: &'a Summary, name: &str) -> Option<&'a Stats> {
    Some(match name {
        "ttft" => &s.ttft,
        "tpot" => &s.tpot,
        "itl" => &s.itl,
        "e2el" => &s.e2el,
        "client_queue" => &s.client_queue,
        "server_queue" => &s.server_queue,
        "server_ttft" => &s.server_ttft,
        "unattributed" => &s.unattributed,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(p99_ttft: f64, failed: u64) -> Summary {
        Summary {
            completed: 99,
            failed,
            ttft: Stats {
                count: 99,
                mean: p99_ttft / 2.0,
                median: p99_ttft / 3.0,
                percentiles: vec![(50.0, p99_ttft / 3.0), (90.0, 1.0), (99.0, p99_ttft)],
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn rules_hold_on_a_steps_summary_and_goodput_terms_read_as_p99() {
        let slo = parse("p99_ttft_ms<=500, failure_rate<=0.01").unwrap();
        let j = slo.judge(&summary(400.0, 1));
        assert!(j.iter().all(|j| j.met), "{j:?}");
        let j = slo.judge(&summary(600.0, 2));
        assert_eq!(j.iter().map(|j| j.met).collect::<Vec<_>>(), [false, false]);
        assert_eq!(j[0].value, Some(600.0));
        let v = parse("ttft:500 tpot:50").unwrap();
        assert_eq!(v.goodput.ttft_ms, Some(500.0));
        assert_eq!(v.goodput.tpot_ms, Some(50.0));
        assert_eq!(v.rules[0].text, "p99_ttft_ms<=500");
    }

    #[test]
    fn a_metric_without_a_value_never_meets_its_rule() {
        let slo = parse("p99_itl_ms<=80").unwrap();
        let j = slo.judge(&summary(1.0, 0));
        assert_eq!((j[0].value, j[0].met), (None, false));
    }

    #[test]
    fn errors_name_the_flag_and_changes_are_refused() {
        for (spec, want) in [
            ("p99_ttft_ms<=+10%", "not a change"),
            ("p99_ttft_ms<=+5", "not a change"),
            ("p98_ttft_ms<=5", "unknown metric"),
            ("ttft:abc", "goodput terms"),
            ("", "at least one rule"),
        ] {
            let e = parse(spec).unwrap_err();
            assert!(e.starts_with("--slo"), "{e}");
            assert!(e.contains(want), "{spec}: {e}");
        }
    }

    #[test]
    fn budgets_are_made_for_bounds_a_step_can_lose_for_good() {
        let slo = parse("p99_ttft_ms<=500,median_e2el_ms<2000,mean_tpot_ms<=50,p99_itl_ms<=80,failure_rate<=0.01,request_throughput>=1").unwrap();
        let b = slo.budgets();
        let got: Vec<(Judged, Option<f64>, bool)> = b
            .iter()
            .map(|b| (b.judged, b.percentile, b.strict))
            .collect();
        assert_eq!(
            got,
            [
                (Judged::TtftMs, Some(99.0), false),
                (Judged::E2elMs, Some(50.0), true),
                (Judged::Failed, None, false),
            ]
        );
    }
}
