//! Which speed to run next, from the verdicts so far: a fixed ladder (`--speeds`), or the
//! search. Pure: the steps are run by the caller.
//!
//! The search starts at 1× (the recorded traffic) and doubles while the SLO is met, up to
//! `--max-speed`, or halves while it is not, down to `--min-speed`; then it bisects between the
//! lowest speed not met (`hi`) and the highest met below it (`lo`) until `hi − lo` is within
//! `--precision` of `lo`, reusing every step done. A speed meets the SLO when more than
//! half of its runs did; both boundary speeds are run again until each has `--repeats` runs, or
//! until more runs could not change its verdict. A verdict that changes moves the bracket and the
//! search goes on.

/// How the speeds are chosen.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Plan {
    /// `--speeds`: each once, in order.
    Ladder(Vec<f64>),
    Search {
        min: f64,
        max: f64,
        /// Relative: 0.05 stops when `hi − lo ≤ 5 %` of `lo`.
        precision: f64,
        repeats: u32,
    },
}

/// The most steps one search runs, whatever the verdicts (a target whose answers swing from
/// step to step would otherwise keep it bisecting).
pub(crate) const MAX_STEPS: usize = 60;

/// The search's state: every speed run, with its verdicts in order.
#[derive(Debug, Clone)]
pub(crate) struct Search {
    plan: Plan,
    runs: Vec<(f64, Vec<bool>)>,
    steps: usize,
}

/// Where the search ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Answer {
    /// The highest speed that met the SLO below every speed that did not; `None`: none met it.
    pub(crate) speed: Option<f64>,
    /// The lowest speed that did not meet it above `speed`; `None`: every speed run met it (the
    /// answer is "at least").
    pub(crate) failed_at: Option<f64>,
}

impl Search {
    pub(crate) fn new(plan: Plan) -> Search {
        Search {
            plan,
            runs: Vec::new(),
            steps: 0,
        }
    }

    /// Notes a step's verdict.
    pub(crate) fn record(&mut self, speed: f64, met: bool) {
        self.steps += 1;
        match self.runs.iter_mut().find(|(s, _)| *s == speed) {
            Some((_, v)) => v.push(met),
            None => self.runs.push((speed, vec![met])),
        }
    }

    fn verdict(&self, speed: f64) -> Option<bool> {
        self.runs
            .iter()
            .find(|(s, _)| *s == speed)
            .map(|(_, v)| 2 * v.iter().filter(|m| **m).count() > v.len())
    }

    /// The bracket: the lowest speed not met, and the highest met below it.
    pub(crate) fn answer(&self) -> Answer {
        let failed_at = self
            .runs
            .iter()
            .filter(|(s, _)| self.verdict(*s) == Some(false))
            .map(|(s, _)| *s)
            .reduce(f64::min);
        let speed = self
            .runs
            .iter()
            .filter(|(s, _)| self.verdict(*s) == Some(true))
            .map(|(s, _)| *s)
            .filter(|s| failed_at.is_none_or(|f| *s < f))
            .reduce(f64::max);
        Answer { speed, failed_at }
    }

    /// The next speed to run; `None`: the search is over.
    pub(crate) fn next(&self) -> Option<f64> {
        if self.steps >= MAX_STEPS {
            return None;
        }
        let (min, max, precision, repeats) = match &self.plan {
            Plan::Ladder(speeds) => {
                return speeds.iter().copied().find(|s| self.verdict(*s).is_none())
            }
            Plan::Search {
                min,
                max,
                precision,
                repeats,
            } => (*min, *max, *precision, *repeats),
        };
        if self.runs.is_empty() {
            return Some(1.0_f64.clamp(min, max));
        }
        let a = self.answer();
        let next = match (a.speed, a.failed_at) {
            (Some(lo), None) if lo < max => Some((lo * 2.0).min(max)),
            (None, Some(hi)) if hi > min => Some((hi / 2.0).max(min)),
            (Some(lo), Some(hi)) if hi - lo > precision * lo => {
                Some(round(lo + (hi - lo) / 2.0)).filter(|m| *m > lo && *m < hi)
            }
            _ => None,
        };
        next.or_else(|| {
            [a.speed, a.failed_at]
                .into_iter()
                .flatten()
                .find(|s| self.could_change(*s, repeats))
        })
    }

    /// How many more steps the search will likely take, once it is bracketed (ladder: the
    /// speeds left); `None` while it still doubles or halves.
    pub(crate) fn steps_left_estimate(&self) -> Option<usize> {
        let (precision, repeats) = match &self.plan {
            Plan::Ladder(v) => {
                return Some(v.iter().filter(|s| self.verdict(**s).is_none()).count())
            }
            Plan::Search {
                precision, repeats, ..
            } => (*precision, *repeats as usize),
        };
        let a = self.answer();
        let (lo, hi) = (a.speed?, a.failed_at?);
        let halvings = ((hi - lo) / (precision * lo)).log2().ceil().max(0.0) as usize;
        Some(halvings + repeats.saturating_sub(1))
    }

    /// Whether more runs of `speed`, up to `repeats`, could change its verdict.
    fn could_change(&self, speed: f64, repeats: u32) -> bool {
        let Some((_, v)) = self.runs.iter().find(|(s, _)| *s == speed) else {
            return false;
        };
        let (n, met) = (v.len(), v.iter().filter(|m| **m).count());
        let left = (repeats as usize).saturating_sub(n);
        if left == 0 {
            return false;
        }
        match 2 * met > n {
            // all the rest failing would make it not met
            true => 2 * met <= n + left,
            // all the rest meeting it would make it met
            false => 2 * (met + left) > n + left,
        }
    }
}

/// A speed rounded to three decimals (at least 0.001): the steps' factors stay readable.
fn round(x: f64) -> f64 {
    ((x * 1000.0).round() / 1000.0).max(0.001)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search() -> Search {
        Search::new(Plan::Search {
            min: 0.125,
            max: 64.0,
            precision: 0.05,
            repeats: 2,
        })
    }

    /// Runs the search against a server that meets the SLO below `truth` (noise-free).
    fn run(mut s: Search, met: impl Fn(f64, usize) -> bool) -> (Search, Vec<f64>) {
        let mut order = Vec::new();
        while let Some(x) = s.next() {
            assert!(order.len() < MAX_STEPS, "{order:?}");
            let m = met(x, order.len());
            order.push(x);
            s.record(x, m);
        }
        (s, order)
    }

    #[test]
    fn doubles_then_bisects_to_the_precision_and_repeats_the_boundary() {
        let (s, order) = run(search(), |x, _| x <= 2.6);
        let a = s.answer();
        let (lo, hi) = (a.speed.unwrap(), a.failed_at.unwrap());
        assert!(lo <= 2.6 && 2.6 < hi, "{lo} {hi}");
        assert!(hi - lo <= 0.05 * lo, "{lo} {hi}");
        assert_eq!(&order[..3], &[1.0, 2.0, 4.0]);
        // the met boundary was run twice; the failed one too would not change with one more run
        assert_eq!(order.iter().filter(|x| **x == lo).count(), 2, "{order:?}");
        assert!(order.len() <= 12, "{order:?}");
    }

    #[test]
    fn one_noisy_step_at_the_boundary_does_not_move_the_answer_up() {
        // the boundary passes once by chance, then fails when repeated
        let noisy = |x: f64, i: usize| x <= 2.0 || (x < 2.4 && i < 6);
        let (s, order) = run(search(), noisy);
        let a = s.answer();
        assert!(a.speed.unwrap() <= 2.4, "{order:?} {a:?}");
        assert!(a.failed_at.unwrap() - a.speed.unwrap() <= 0.05 * a.speed.unwrap());
    }

    #[test]
    fn always_met_ends_at_the_max_and_never_met_at_the_min() {
        let (s, order) = run(search(), |_, _| true);
        assert_eq!(
            s.answer(),
            Answer {
                speed: Some(64.0),
                failed_at: None
            }
        );
        assert_eq!(order.iter().filter(|x| **x == 64.0).count(), 2);
        let (s, order) = run(search(), |_, _| false);
        assert_eq!(
            s.answer(),
            Answer {
                speed: None,
                failed_at: Some(0.125)
            }
        );
        assert_eq!(&order[..4], &[1.0, 0.5, 0.25, 0.125]);
    }

    #[test]
    fn a_ladder_runs_each_speed_once_and_answers_below_the_first_failure() {
        let (s, order) = run(
            Search::new(Plan::Ladder(vec![0.5, 1.0, 2.0, 4.0])),
            |x, _| x != 2.0,
        );
        assert_eq!(order, [0.5, 1.0, 2.0, 4.0]);
        assert_eq!(
            s.answer(),
            Answer {
                speed: Some(1.0),
                failed_at: Some(2.0)
            }
        );
    }
}
