//! The schedule: which trace request is sent when, as a pure function of the trace and options.
//!
//! [`plan`] keeps the first `limit` requests in arrival order and maps each arrival to an offset
//! from the replay's t0: `(arrival − first arrival) / speed`. The result is sorted by offset (stable,
//! so requests sharing a timestamp keep trace order). Workload shaping (rate overrides, time-shifted
//! overlays, session ordering) slots in here as other pure functions producing the same
//! [`PlannedSend`] list; the driver only executes a plan. No clock, no I/O.

use crate::trace::Trace;

/// One planned request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedSend {
    /// Index into `trace.requests`.
    pub index: usize,
    /// Send offset from t0, ns.
    pub at_ns: u64,
}

/// What shapes the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleOptions {
    /// Time compression: 2 = twice as fast. Must be finite and > 0.
    pub speed: f64,
    /// Keep only the first N requests (by arrival).
    pub limit: Option<usize>,
    /// Measure offsets from this arrival instead of the first one kept (a shard keeps the whole
    /// trace's timeline).
    pub origin_us: Option<u64>,
}

impl Default for ScheduleOptions {
    fn default() -> Self {
        ScheduleOptions {
            speed: 1.0,
            limit: None,
            origin_us: None,
        }
    }
}

/// Plans the sends of `trace`.
pub fn plan(trace: &Trace, opts: &ScheduleOptions) -> Vec<PlannedSend> {
    let mut order: Vec<usize> = (0..trace.requests.len()).collect();
    order.sort_by_key(|&i| trace.requests[i].arrival_us);
    if let Some(n) = opts.limit {
        order.truncate(n);
    }
    let first = order.first().map_or(0, |&i| trace.requests[i].arrival_us);
    let first = opts.origin_us.map_or(first, |o| o.min(first));
    let speed = if opts.speed.is_finite() && opts.speed > 0.0 {
        opts.speed
    } else {
        1.0
    };
    order
        .into_iter()
        .map(|index| {
            let rel_us = trace.requests[index].arrival_us - first;
            let at_ns = (rel_us as f64 * 1000.0 / speed).round() as u64;
            PlannedSend { index, at_ns }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Request, TraceHeader};

    fn trace(arrivals_ms: &[u64]) -> Trace {
        Trace {
            header: TraceHeader::imported(512, true, "test"),
            requests: arrivals_ms
                .iter()
                .map(|&ms| Request {
                    arrival_us: ms * 1000,
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn offsets_are_relative_to_first_arrival() {
        let p = plan(&trace(&[1000, 1500, 3000]), &ScheduleOptions::default());
        let at: Vec<u64> = p.iter().map(|p| p.at_ns).collect();
        assert_eq!(at, [0, 500_000_000, 2_000_000_000]);
    }

    #[test]
    fn speed_scales_gaps() {
        let opts = ScheduleOptions {
            origin_us: None,
            speed: 4.0,
            limit: None,
        };
        let p = plan(&trace(&[0, 1000, 3000]), &opts);
        let at: Vec<u64> = p.iter().map(|p| p.at_ns).collect();
        assert_eq!(at, [0, 250_000_000, 750_000_000]);
        let slow = ScheduleOptions {
            origin_us: None,
            speed: 0.5,
            limit: None,
        };
        assert_eq!(plan(&trace(&[0, 10]), &slow)[1].at_ns, 20_000_000);
    }

    #[test]
    fn limit_keeps_first_arrivals() {
        let opts = ScheduleOptions {
            origin_us: None,
            speed: 1.0,
            limit: Some(2),
        };
        let p = plan(&trace(&[0, 5, 9]), &opts);
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].index, 1);
        assert_eq!(
            plan(
                &trace(&[0]),
                &ScheduleOptions {
                    limit: Some(0),
                    ..opts
                }
            )
            .len(),
            0
        );
    }

    #[test]
    fn ordering_is_by_arrival_and_stable_for_ties() {
        // An unsorted trace (the model allows it in memory) is planned in arrival order.
        let p = plan(&trace(&[20, 10, 10, 0]), &ScheduleOptions::default());
        let idx: Vec<usize> = p.iter().map(|p| p.index).collect();
        assert_eq!(idx, [3, 1, 2, 0]);
        assert!(p.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
        assert_eq!(p.last().map(|p| p.at_ns), Some(20_000_000));
    }

    #[test]
    fn empty_trace_is_an_empty_plan() {
        assert!(plan(&trace(&[]), &ScheduleOptions::default()).is_empty());
    }
}
