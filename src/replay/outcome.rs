//! What a replay did with a recording's requests, beside what the recording says (pure).
//!
//! Auxiliary requests (`--include-aux`) are sent and counted here, apart from the workload's
//! samples, so they never enter vLLM's latency statistics. For a recorded trace, each measured
//! request's recorded outcome is held against the replayed one: a request that failed in
//! production should fail again the same way. A run in which no measured request succeeded is
//! a failed run ([`all_failed`]), unless every request failed exactly as it was recorded to.

use crate::metrics::{Sample, Scalars};
use serde_json::{json, Value};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// How many distinct failure messages the console shows, and how many characters of each.
pub(crate) const FIRST_ERRORS: usize = 3;
const MESSAGE_CHARS: usize = 200;

/// The side requests sent (`--include-aux`), folded as they finish.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Auxiliary {
    sent: u64,
    ok: u64,
    errors: BTreeMap<String, u64>,
}

impl Auxiliary {
    pub(crate) fn add(&mut self, s: &Scalars) {
        self.sent += 1;
        match s.error {
            None => self.ok += 1,
            Some(e) => *self.errors.entry(e.as_str().into_owned()).or_default() += 1,
        }
    }

    /// The result's `auxiliary` object: `{sent, ok, errors: {kind: n}}`, or `None` when none
    /// was sent.
    pub(crate) fn to_json(&self) -> Option<Value> {
        (self.sent > 0).then(|| json!({"sent": self.sent, "ok": self.ok, "errors": self.errors}))
    }
}

/// How a replayed request failed (its kind's wire name), `None` when it succeeded.
pub(crate) fn replayed_failure(s: &Scalars) -> Option<Cow<'static, str>> {
    match s.ok() {
        true => None,
        false => Some(s.error.map_or("failed".into(), |e| e.as_str())),
    }
}

/// Whether the run failed as a whole: requests were measured (`measured`), none succeeded
/// (`completed`), and not every one of them failed the way it was recorded to (`same`, as in
/// [`RecordedOutcomes`]; a recording whose requests all failed, replayed faithfully, is not a failed run).
pub(crate) fn all_failed(measured: u64, completed: u64, same: u64) -> bool {
    measured > 0 && completed == 0 && same < measured
}

/// A failure message and how many measured requests failed with it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FirstError {
    pub(crate) kind: String,
    /// The detail (an error body's first bytes, the I/O error) on one line, at most 200 chars.
    pub(crate) message: String,
    pub(crate) count: u64,
}

/// Folds `s` into `out`: the first [`FIRST_ERRORS`] distinct (kind, message) failures, in the
/// order they first came, each with its count.
pub(crate) fn note_error(out: &mut Vec<FirstError>, s: &Sample) {
    let Some(kind) = replayed_failure(&s.scalars) else {
        return;
    };
    let message = one_line(s.error_detail.as_deref().unwrap_or(""), MESSAGE_CHARS);
    match out
        .iter()
        .position(|e| e.kind == kind && e.message == message)
    {
        Some(i) => out[i].count += 1,
        None if out.len() < FIRST_ERRORS => out.push(FirstError {
            kind: kind.into_owned(),
            message,
            count: 1,
        }),
        None => {}
    }
}

/// `text` with runs of whitespace and control characters as one space, cut at `max` characters
/// (an ellipsis says so).
fn one_line(text: &str, max: usize) -> String {
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
        .collect();
    let line = words.join(" ");
    match line.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

/// RecordedOutcomes against replayed outcomes of the measured requests, folded as they finish (the
/// result's `recorded_outcomes`).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RecordedOutcomes {
    pub(crate) recorded_failures: u64,
    /// Failed again the same way.
    pub(crate) same: u64,
    pub(crate) differently: u64,
    pub(crate) now_ok: u64,
    pub(crate) newly_failed: u64,
    /// Cut where the client cancelled them in the recording: done as recorded, in none of the
    /// counts above.
    pub(crate) cancelled_as_recorded: u64,
    errors: BTreeMap<String, u64>,
}

/// How a replay cuts a request the client cancelled (the result's `cancelled_as_recorded.rule`).
pub(crate) const CUT_RULE: &str = "a request the client cancelled in the recording is cut where it was: after its recorded number of events when some came, else at its recorded end (from the send); the connection is closed there, so the server sees the abort";

impl RecordedOutcomes {
    /// Folds in a request recorded to fail with `rec` (or to succeed) and replayed as `s`.
    pub(crate) fn add(&mut self, rec: Option<&str>, s: &Scalars) {
        if let Some(k) = rec {
            self.recorded_failures += 1;
            *self.errors.entry(k.to_string()).or_default() += 1;
        }
        if s.error == Some(crate::metrics::Failure::CancelledAsRecorded) {
            self.cancelled_as_recorded += 1;
            return;
        }
        let replayed = replayed_failure(s);
        match (rec, replayed.as_deref()) {
            (Some(a), Some(b)) if a == b => self.same += 1,
            (Some(_), Some(_)) => self.differently += 1,
            (Some(_), None) => self.now_ok += 1,
            (None, Some(_)) => self.newly_failed += 1,
            (None, None) => {}
        }
    }

    /// The result's `cancelled_as_recorded`: `{count, rule}`.
    pub(crate) fn cancelled_json(&self) -> Value {
        json!({"count": self.cancelled_as_recorded, "rule": CUT_RULE})
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({
            "recorded_failures": self.recorded_failures,
            "failed_again_same_way": self.same,
            "failed_differently": self.differently,
            "now_succeed": self.now_ok,
            "newly_failed": self.newly_failed,
            "recorded_errors": self.errors,
        })
    }
}

/// The console lines after vLLM's block: how the recording's failures and its side requests
/// fared (empty when there are neither).
pub(crate) fn console(rec: Option<&RecordedOutcomes>, aux: &Auxiliary) -> String {
    let mut s = String::new();
    if let Some(v) = rec.filter(|r| r.recorded_failures > 0) {
        s.push_str(&format!(
            "RecordedOutcomes failures: {} ({} failed again the same way, {} differently, {} now succeed); {} requests newly failed\n",
            v.recorded_failures, v.same, v.differently, v.now_ok, v.newly_failed
        ));
    }
    if let Some(v) = rec.filter(|r| r.cancelled_as_recorded > 0) {
        s.push_str(&format!(
            "Cancelled as recorded: {} requests cut where the client cancelled them (after the recorded events, or at the recorded end when none came); not failures of the target\n",
            v.cancelled_as_recorded
        ));
    }
    if let Some(a) = aux.to_json() {
        s.push_str(&format!(
            "Side requests (--include-aux): {} sent, {} answered 2xx, errors {}\n",
            a["sent"], a["ok"], a["errors"]
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Failure;

    fn sample(err: Option<Failure>) -> Sample {
        Sample {
            scalars: Scalars {
                ttft_ns: err.is_none().then_some(5),
                error: err,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn recorded_and_replayed_outcomes_side_by_side() {
        let rec = [
            Some("http_404"),
            Some("http_400"),
            None,
            None,
            Some("http_404"),
        ];
        let samples = vec![
            sample(Some(Failure::Http(404))),
            sample(Some(Failure::Http(404))),
            sample(None),
            sample(Some(Failure::Reset)),
            sample(None),
        ];
        let mut r = RecordedOutcomes::default();
        for (rec, s) in rec.iter().zip(scalars(&samples)) {
            r.add(*rec, &s);
        }
        let v = r.to_json();
        assert_eq!(v["recorded_failures"], 3);
        assert_eq!(v["failed_again_same_way"], 1);
        assert_eq!(v["failed_differently"], 1);
        assert_eq!(v["newly_failed"], 1);
        assert_eq!(v["now_succeed"], 1);
        assert_eq!(v["recorded_errors"]["http_404"], 2);
        let line = console(Some(&r), &Auxiliary::default());
        assert!(line.starts_with("RecordedOutcomes failures: 3 (1 failed again the same way, 1 differently, 1 now succeed); 1 requests newly failed"), "{line}");
        let none = Auxiliary::default();
        assert_eq!(console(None, &none), "");
        assert_eq!(console(Some(&RecordedOutcomes::default()), &none), "");
    }

    fn scalars(s: &[Sample]) -> Vec<Scalars> {
        s.iter().map(|x| x.scalars).collect()
    }

    fn failed(kind: Failure, detail: &str) -> Sample {
        Sample {
            error_detail: Some(detail.into()),
            ..sample(Some(kind))
        }
    }

    /// A recording whose requests failed, replayed faithfully, is not a failed run; one that
    /// fails some other way is.
    #[test]
    fn recorded_failures_that_fail_again_the_same_way_are_not_a_failed_run() {
        let fold = |rec: &[Option<&str>], s: &[Sample]| {
            let mut r = RecordedOutcomes::default();
            for (rec, s) in rec.iter().zip(scalars(s)) {
                r.add(*rec, &s);
            }
            let ok = s.iter().filter(|x| x.ok()).count() as u64;
            all_failed(s.len() as u64, ok, r.same)
        };
        let rec = [Some("http_404"), Some("http_400")];
        let same = [
            failed(Failure::Http(404), "a"),
            failed(Failure::Http(400), "b"),
        ];
        assert!(!fold(&rec, &same));
        let other = [failed(Failure::Http(404), "a"), failed(Failure::Reset, "b")];
        assert!(fold(&rec, &other));
        let both_404 = [
            failed(Failure::Http(404), "a"),
            failed(Failure::Http(404), "a"),
        ];
        assert!(fold(&[Some("http_404"), None], &both_404));
        // Without a recording: no success is a failed run, one success is not.
        assert!(fold(&[None, None], &both_404) && !fold(&[], &[]));
        assert!(!fold(&[None, None], &[both_404[0].clone(), sample(None)]));
    }

    #[test]
    fn first_errors_are_distinct_bounded_and_one_line() {
        let long = "x".repeat(500);
        let s = vec![
            failed(Failure::Http(503), "busy\n  try later"),
            failed(Failure::Connect, "connect 127.0.0.1:9: refused"),
            failed(Failure::Http(503), "busy try later"),
            failed(Failure::Http(500), &long),
            failed(Failure::Reset, "a fourth kind is not shown"),
            sample(None),
        ];
        let mut f = Vec::new();
        for x in &s {
            note_error(&mut f, x);
        }
        let got: Vec<(&str, u64)> = f.iter().map(|e| (e.kind.as_str(), e.count)).collect();
        assert_eq!(got, [("http_503", 2), ("connect", 1), ("http_500", 1)]);
        assert_eq!(f[0].message, "busy try later");
        assert_eq!(f[2].message, format!("{}…", "x".repeat(200)));
    }
}
