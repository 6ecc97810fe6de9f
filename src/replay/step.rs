//! A measured stretch of a replay, as `retrace capacity` runs its steps: the requests planned in
//! the warm-up before it are sent and not measured, and budgets of requests that miss an
//! objective, past which the objective is lost whatever the rest of the run does, so the run is
//! given up ([`Watch`]).
//!
//! The rule is a count, never a guess. A `pP` objective over N planned requests is lost once
//! `N − ⌊(N − 1)·P/100⌋` measured requests miss it: numpy's `pP` of any n ≤ N values then lies
//! among the values that missed. A failure-rate objective `≤ r` is lost once more than `r·N`
//! requests failed. Means are never judged early.

use crate::metrics::Sample;

/// What a request is judged by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Judged {
    /// It failed.
    Failed,
    /// Its TTFT (successful streamed requests), ms.
    TtftMs,
    /// Its TPOT (successful streamed requests with two tokens or more), ms.
    TpotMs,
    /// Its E2EL (successful streamed requests), ms.
    E2elMs,
}

impl Judged {
    /// The request's value, when it has one: 1 for a failure, else its latency in ms.
    fn value(self, s: &Sample) -> Option<f64> {
        let streamed = s.ok() && !s.non_streamed;
        let ms = |ns: Option<u64>| ns.map(|n| n as f64 / 1e6);
        match self {
            Judged::Failed => Some(if s.ok() { 0.0 } else { 1.0 }),
            Judged::TtftMs if streamed => ms(s.ttft_ns),
            Judged::TpotMs if streamed => s.tpot_s().map(|t| t * 1000.0),
            Judged::E2elMs if streamed => ms(s.e2el_ns),
            _ => None,
        }
    }
}

/// One objective a step is judged by, as the budget counts it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Budget {
    /// The objective as the user wrote it (named when it is lost).
    pub(crate) text: String,
    pub(crate) judged: Judged,
    /// A request misses it with a value above `threshold` (at or above it when `strict`).
    pub(crate) threshold: f64,
    pub(crate) strict: bool,
    /// `Some(P)`: the objective is on the `pP` of the values; `None`: on the share of requests
    /// that miss it (the failure rate).
    pub(crate) percentile: Option<f64>,
}

impl Budget {
    fn misses(&self, s: &Sample) -> bool {
        match self.judged.value(s) {
            Some(v) if self.strict => v >= self.threshold,
            Some(v) => v > self.threshold,
            None => false,
        }
    }

    /// How many of `planned` requests must miss it for the objective to be lost.
    fn limit(&self, planned: usize) -> u64 {
        let n = planned as f64;
        let k = match self.percentile {
            Some(p) => n - ((n - 1.0).max(0.0) * p / 100.0).floor(),
            // failed/N > r ⟺ failed > r·N (≥ for a strict bound).
            None if self.strict => (self.threshold * n).ceil(),
            None => (self.threshold * n).floor() + 1.0,
        };
        k.max(1.0) as u64
    }
}

/// The measured stretch of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Stretch {
    /// Requests planned before this offset from t0 (ns) are the warm-up: sent, not measured.
    pub(crate) warmup_ns: u64,
    /// The objectives whose loss gives the run up.
    pub(crate) budgets: Vec<Budget>,
}

/// What a stretch measured, beside the run's result.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Measured {
    /// Requests of the warm-up (sent, not measured).
    pub(crate) warmup: u64,
    /// Why the run was given up.
    pub(crate) gave_up: Option<String>,
}

/// A running stretch: which request is measured, and when an objective is lost.
pub(crate) struct Watch {
    warmup_ns: u64,
    budgets: Vec<(Budget, u64, u64)>,
    /// Requests of the warm-up.
    pub(crate) warmup: u64,
    /// The last end of a measured request, ns from t0.
    pub(crate) last_end_ns: u64,
    /// Why the run was given up.
    pub(crate) lost: Option<String>,
}

impl Watch {
    /// For `s` over a plan of `planned` workload requests (the warm-up's included: a larger N
    /// only makes a budget later, never wrong).
    pub(crate) fn new(s: &Stretch, planned: usize) -> Watch {
        Watch {
            warmup_ns: s.warmup_ns,
            budgets: s
                .budgets
                .iter()
                .map(|b| (b.clone(), b.limit(planned), 0))
                .collect(),
            warmup: 0,
            last_end_ns: 0,
            lost: None,
        }
    }

    /// Whether `s` is measured (else it is counted as warm-up).
    pub(crate) fn measures(&mut self, s: &Sample) -> bool {
        if s.intended_ns < self.warmup_ns {
            self.warmup += 1;
            return false;
        }
        self.last_end_ns = self.last_end_ns.max(s.end_ns);
        true
    }

    /// Counts measured `s` against the budgets; true the first time an objective is lost.
    pub(crate) fn lose(&mut self, s: &Sample) -> bool {
        if self.lost.is_some() {
            return false;
        }
        for (b, limit, missed) in &mut self.budgets {
            if b.misses(s) {
                *missed += 1;
                if *missed >= *limit {
                    self.lost = Some(format!(
                        "{} lost for good: {missed} measured requests missed it, {limit} of the plan's were enough",
                        b.text
                    ));
                    return true;
                }
            }
        }
        false
    }

    pub(crate) fn measured(&self) -> Measured {
        Measured {
            warmup: self.warmup,
            gave_up: self.lost.clone(),
        }
    }

    /// The measured stretch's duration: from the warm-up's end to the last measured request's
    /// end, s (`None` without a warm-up: the run's own duration stands).
    pub(crate) fn duration_s(&self) -> Option<f64> {
        (self.warmup_ns > 0).then(|| self.last_end_ns.saturating_sub(self.warmup_ns) as f64 / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok_with_ttft(ms: u64, intended_ms: u64) -> Sample {
        let mut s = Sample::default();
        s.intended_ns = intended_ms * 1_000_000;
        s.sent_ns = s.intended_ns;
        s.ttft_ns = Some(ms * 1_000_000);
        s.e2el_ns = Some(ms * 1_000_000 + 1);
        s.end_ns = s.sent_ns + ms * 1_000_000 + 1;
        s.output_tokens = 2;
        s
    }

    fn p99_ttft(ms: f64) -> Budget {
        Budget {
            text: format!("p99_ttft_ms<={ms}"),
            judged: Judged::TtftMs,
            threshold: ms,
            strict: false,
            percentile: Some(99.0),
        }
    }

    #[test]
    fn a_percentile_is_lost_once_enough_values_miss_that_it_lies_among_them() {
        // N = 300: numpy's p99 of 300 sorted values sits between ranks 296 and 297 (0-based), so
        // 4 values above the bound put it above, and 3 may not.
        assert_eq!(p99_ttft(500.0).limit(300), 4);
        let p99 = |missed: usize| {
            let mut v: Vec<f64> = vec![1.0; 300 - missed];
            v.extend(std::iter::repeat_n(600.0, missed));
            crate::metrics::np_percentile_sorted(&v, 99.0)
        };
        assert!(p99(3) <= 500.0, "3 missed: {}", p99(3));
        assert!(p99(4) > 500.0, "4 missed: {}", p99(4));
        let median = Budget {
            percentile: Some(50.0),
            ..p99_ttft(500.0)
        };
        assert_eq!(median.limit(4), 3);
        assert_eq!(p99_ttft(500.0).limit(1), 1);
    }

    #[test]
    fn a_failure_rate_is_lost_past_its_share_of_the_plan() {
        let b = Budget {
            text: "failure_rate<=0.01".into(),
            judged: Judged::Failed,
            threshold: 0.01,
            strict: false,
            percentile: None,
        };
        assert_eq!(b.limit(300), 4, "3 of 300 is 1 %: still met");
        assert_eq!(Budget { strict: true, ..b }.limit(300), 3);
    }

    #[test]
    fn the_warm_up_is_not_measured_and_the_stretch_runs_from_its_end() {
        let stretch = Stretch {
            warmup_ns: 1_000_000_000,
            budgets: vec![p99_ttft(500.0)],
        };
        let mut w = Watch::new(&stretch, 2);
        assert!(!w.measures(&ok_with_ttft(900, 10)));
        assert!(w.measures(&ok_with_ttft(100, 1_000)));
        assert_eq!(w.warmup, 1);
        assert!((w.duration_s().unwrap() - 0.1).abs() < 1e-6);
        // N = 2: p99 sits between the two values; both must miss
        assert!(!w.lose(&ok_with_ttft(900, 1_000)));
        assert!(w.lose(&ok_with_ttft(900, 1_000)));
        assert!(w
            .lost
            .as_deref()
            .unwrap()
            .starts_with("p99_ttft_ms<=500 lost"));
        assert!(!w.lose(&ok_with_ttft(900, 1_000)), "lost once");
    }

    #[test]
    fn failed_requests_have_no_latency_to_judge() {
        let mut f = ok_with_ttft(900, 0);
        f.error = Some(crate::metrics::Failure::Http(500));
        assert!(!p99_ttft(500.0).misses(&f));
        let failed = Budget {
            text: "failure_rate<=0".into(),
            judged: Judged::Failed,
            threshold: 0.0,
            strict: false,
            percentile: None,
        };
        assert!(failed.misses(&f));
        assert!(!failed.misses(&ok_with_ttft(900, 0)));
    }
}
