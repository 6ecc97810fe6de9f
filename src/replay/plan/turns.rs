//! Session ordering (`--sessions`): which planned send waits for which, and how far the
//! session-ordered replay drifted from the recorded arrivals.
//!
//! In a multi-turn trace (kv-cache-tester / WEKA sessions) a turn is the user's reply to the
//! previous answer, so a faithful replay sends turn k only after turn k−1 of the same session
//! finished, plus the recorded think time (divided by `--speed`). [`link`] turns a plan into that
//! dependency chain, purely: for every plan slot its predecessor and successor in its session
//! (turn order, then arrival) and its think time. A slot without a predecessor in the plan (the
//! first turn, a request without a session, or a turn whose earlier turns were cut by `--limit`) is
//! a root: it keeps its planned offset. The driver releases the others at run time, when their
//! predecessor ends (failed or not). [`report`] measures, per dependent turn, actual release −
//! recorded (planned) offset: positive = later than recorded (the server was slower than the one
//! recorded, or think time is longer than the recorded gap), negative = earlier. A turn without a
//! recorded think time is sent right after its predecessor (think time 0). This module does not
//! run anything and has no clock.

use crate::metrics::{Scalars, Stats};
use crate::replay::plan::source::Planned;
use std::collections::HashMap;

/// The dependency chain over plan slots (indices into the plan).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Links {
    /// The previous turn of the slot's session, when it is planned.
    pub(crate) pred: Vec<Option<usize>>,
    /// The next turn of the slot's session, when it is planned.
    pub succ: Vec<Option<usize>>,
    /// Think time before the slot is sent, after its predecessor ends, ns (already `/ speed`).
    pub think_ns: Vec<u64>,
    /// Distinct sessions among the planned sends.
    pub sessions: usize,
    /// Each slot's planned offset, ns (a root is released then).
    pub(crate) at_ns: Vec<u64>,
}

impl Links {
    /// Whether the slot is released by the plan (no predecessor) rather than by a completion.
    pub fn is_root(&self, slot: usize) -> bool {
        self.pred.get(slot).is_none_or(|p| p.is_none())
    }
}

/// Links the planned sends of each session in turn order. Errors when no planned request belongs
/// to a session (the message is for the `--sessions` flag).
pub fn link(plan: &[Planned], speed: f64) -> Result<Links, String> {
    let speed = if speed.is_finite() && speed > 0.0 {
        speed
    } else {
        1.0
    };
    let n = plan.len();
    let mut by_session: HashMap<&str, Vec<usize>> = HashMap::new();
    for (slot, p) in plan.iter().enumerate() {
        if let Some(s) = &p.record.session {
            by_session.entry(s.id.as_str()).or_default().push(slot);
        }
    }
    if by_session.is_empty() && n > 0 {
        return Err("--sessions: the trace has no session ids (a multi-turn trace is needed, e.g. kv-cache-tester session JSON)".into());
    }
    let mut links = Links {
        pred: vec![None; n],
        succ: vec![None; n],
        think_ns: vec![0; n],
        sessions: by_session.len(),
        at_ns: plan.iter().map(|p| p.at_ns).collect(),
    };
    for slots in by_session.values_mut() {
        slots.sort_by_key(|&s| {
            let turn = plan[s].record.session.as_ref().map_or(0, |x| x.turn);
            (turn, plan[s].at_ns, s)
        });
        for w in slots.windows(2) {
            let (a, b) = (w[0], w[1]);
            links.pred[b] = Some(a);
            links.succ[a] = Some(b);
            let think_us = plan[b]
                .record
                .session
                .as_ref()
                .and_then(|s| s.think_us)
                .unwrap_or(0);
            links.think_ns[b] = (think_us as f64 * 1000.0 / speed).round() as u64;
        }
    }
    let held = longest_hold_ns(&links, plan);
    if held > crate::replay::MAX_SCHEDULE.as_nanos() as u64 {
        return Err(format!(
            "--sessions: a session's first send and think times add up to {:.0} days at --speed {speed} (more than {}): check the trace's think_time values and --speed",
            held as f64 / 86_400e9,
            crate::replay::MAX_SCHEDULE.as_secs() / 86_400
        ));
    }
    Ok(links)
}

/// The longest a session waits before its last turn is released, ns: its first planned send
/// plus every think time after it (the server's time comes on top).
fn longest_hold_ns(links: &Links, plan: &[Planned]) -> u64 {
    let chain = |root: usize| {
        let (mut t, mut s) = (plan[root].at_ns, links.succ[root]);
        while let Some(n) = s {
            t = t.saturating_add(links.think_ns[n]);
            s = links.succ[n];
        }
        t
    };
    (0..plan.len())
        .filter(|&s| links.is_root(s))
        .map(chain)
        .max()
        .unwrap_or(0)
}

/// How the session-ordered replay went.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionReport {
    pub(crate) sessions: usize,
    /// Planned sends (all turns).
    pub(crate) turns: usize,
    /// Turns released by their predecessor's completion.
    pub dependent_turns: usize,
    /// Dependent turns whose predecessor failed (they were still sent).
    pub(crate) released_after_failure: usize,
    /// Per dependent turn: actual release − recorded offset, ms (negative = earlier than recorded).
    pub(crate) drift: Stats,
}

/// Summarises a session-ordered run. `samples` and `recorded_ns` are slot-aligned with `links`.
pub(crate) fn report(
    links: &Links,
    recorded_ns: &[u64],
    samples: &[Option<Scalars>],
    percentiles: &[f64],
) -> SessionReport {
    let mut drifts = Vec::new();
    let mut after_failure = 0;
    for (slot, pred) in links.pred.iter().enumerate() {
        let (Some(p), Some(Some(s)), Some(&rec)) = (pred, samples.get(slot), recorded_ns.get(slot))
        else {
            continue;
        };
        drifts.push((s.dispatched_ns as f64 - rec as f64) / 1e9);
        if samples.get(*p).is_some_and(|x| x.is_none_or(|x| !x.ok())) {
            after_failure += 1;
        }
    }
    SessionReport {
        sessions: links.sessions,
        turns: links.pred.len(),
        dependent_turns: drifts.len(),
        released_after_failure: after_failure,
        drift: Stats::from_seconds(&drifts, percentiles),
    }
}

impl SessionReport {
    /// The report as the result's `sessions`: `{sessions, turns, dependent_turns,
    /// released_after_failure, drift}` (drift = actual release − recorded arrival of each
    /// dependent turn, ms).
    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "sessions": self.sessions,
            "turns": self.turns,
            "dependent_turns": self.dependent_turns,
            "released_after_failure": self.released_after_failure,
            "drift": self.drift.to_json_ms(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Request, Session};

    fn req(arrival_ms: u64, session: Option<(&str, u32, u64)>) -> Request {
        Request {
            arrival_us: arrival_ms * 1000,
            session: session.map(|(id, turn, think_ms)| Session {
                id: id.into(),
                turn,
                think_us: Some(think_ms * 1000),
            }),
            ..Default::default()
        }
    }

    /// The sends of requests given in arrival order, offset from the first.
    fn plan(reqs: Vec<Request>) -> Vec<Planned> {
        let first = reqs.first().map_or(0, |r| r.arrival_us);
        let at = |r: &Request| (r.arrival_us - first) * 1000;
        let sends = reqs.into_iter().enumerate();
        sends
            .map(|(index, record)| Planned {
                index,
                at_ns: at(&record),
                record,
            })
            .collect()
    }

    #[test]
    fn turns_chain_per_session_with_scaled_think_time() {
        let p = plan(vec![
            req(0, Some(("a", 0, 0))),
            req(5, Some(("b", 0, 0))),
            req(100, Some(("a", 1, 40))),
            req(150, Some(("b", 1, 20))),
            req(300, Some(("a", 2, 60))),
            req(310, None),
        ]);
        let l = link(&p, 2.0).unwrap();
        assert_eq!(l.sessions, 2);
        assert_eq!(l.pred, [None, None, Some(0), Some(1), Some(2), None]);
        assert_eq!(l.succ, [Some(2), Some(3), Some(4), None, None, None]);
        assert_eq!(l.think_ns, [0, 0, 20_000_000, 10_000_000, 30_000_000, 0]);
        assert!(l.is_root(0) && l.is_root(5) && !l.is_root(4));
    }

    #[test]
    fn turn_order_wins_over_arrival_and_limit_makes_roots() {
        // Turn numbers decide the chain even when arrivals tie.
        let p = plan(vec![
            req(10, Some(("s", 1, 5))),
            req(10, Some(("s", 0, 0))),
            req(20, Some(("s", 2, 5))),
        ]);
        let l = link(&p, 1.0).unwrap();
        // slot 0 = request 0 (turn 1), slot 1 = request 1 (turn 0)
        assert_eq!(l.pred, [Some(1), None, Some(0)]);
        // A plan cut by --limit keeps only earlier turns: the rest stays consistent.
        let cut = &p[..2];
        let l = link(cut, 1.0).unwrap();
        assert_eq!(l.pred, [Some(1), None]);
        assert_eq!(l.succ, [None, Some(0)]);
    }

    #[test]
    fn trace_without_sessions_is_refused_naming_the_flag() {
        let e = link(&plan(vec![req(0, None), req(1, None)]), 1.0).unwrap_err();
        assert!(e.starts_with("--sessions:"), "{e}");
        assert!(link(&[], 1.0).is_ok());
    }

    #[test]
    fn report_measures_drift_of_dependent_turns_and_counts_failed_predecessors() {
        let l = Links {
            pred: vec![None, Some(0), Some(1), None],
            succ: vec![Some(1), Some(2), None, None],
            think_ns: vec![0; 4],
            sessions: 1,
            at_ns: vec![0, 100_000_000, 200_000_000, 50_000_000],
        };
        let recorded = l.at_ns.clone();
        let mk = |dispatched_ms: u64, ok: bool| Scalars {
            dispatched_ns: dispatched_ms * 1_000_000,
            ttft_ns: ok.then_some(1),
            error: (!ok).then_some(crate::metrics::Failure::Http(500)),
            ..Default::default()
        };
        let samples = [mk(0, false), mk(130, true), mk(190, true), mk(60, true)].map(Some);
        let r = report(&l, &recorded, &samples, &[50.0, 99.0]);
        assert_eq!((r.sessions, r.turns, r.dependent_turns), (1, 4, 2));
        assert_eq!(r.released_after_failure, 1);
        assert!((r.drift.mean - 10.0).abs() < 1e-9, "{}", r.drift.mean);
        assert!((r.drift.min + 10.0).abs() < 1e-9);
        assert!((r.drift.max - 30.0).abs() < 1e-9);
    }
}
