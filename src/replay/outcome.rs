//! What a replay did with a recording's requests, beside what the recording says (pure).
//!
//! Auxiliary requests (`--include-aux`) are sent and counted here, apart from the workload's
//! samples, so they never enter vLLM's latency statistics. For a recorded trace, each measured
//! request's recorded outcome is held against the replayed one: a request that failed in
//! production should fail again the same way.

use crate::metrics::Sample;
use crate::trace::Trace;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Splits `samples` (schedule order; `aux[i]` says whether send `i` was auxiliary) into the
/// workload's samples and the auxiliary ones.
pub fn split(samples: Vec<Sample>, aux: &[bool]) -> (Vec<Sample>, Vec<Sample>) {
    let (mut work, mut side) = (Vec::with_capacity(samples.len()), Vec::new());
    for (i, s) in samples.into_iter().enumerate() {
        match aux.get(i).copied().unwrap_or(false) {
            true => side.push(s),
            false => work.push(s),
        }
    }
    (work, side)
}

/// The recorded failure kind of each planned workload request (`index`: trace index per send,
/// `aux`: as in [`split`]), or `None` when the trace holds no recorded responses.
pub fn recorded_failures(
    trace: &Trace,
    index: &[usize],
    aux: &[bool],
) -> Option<Vec<Option<String>>> {
    let work = || {
        index
            .iter()
            .zip(aux)
            .filter(|(_, a)| !**a)
            .filter_map(|(&i, _)| trace.requests.get(i))
    };
    work().any(|r| r.response.is_some()).then(|| {
        work()
            .map(|r| r.recorded_failure().map(str::to_string))
            .collect()
    })
}

fn error_counts<'a>(kinds: impl Iterator<Item = &'a str>) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for k in kinds {
        *m.entry(k.to_string()).or_default() += 1;
    }
    m
}

/// The result's `auxiliary` object: `{sent, ok, errors: {kind: n}}`, or `None` when none was sent.
pub fn auxiliary(aux: &[Sample]) -> Option<Value> {
    if aux.is_empty() {
        return None;
    }
    let ok = aux.iter().filter(|s| s.error.is_none()).count();
    let kinds: Vec<_> = aux
        .iter()
        .filter_map(|s| s.error.map(|e| e.as_str()))
        .collect();
    Some(json!({
        "sent": aux.len(),
        "ok": ok,
        "errors": error_counts(kinds.iter().map(|k| k.as_ref())),
    }))
}

/// The result's `recorded_outcomes`: recorded against replayed outcomes of the measured
/// requests (`rec[i]` is sample `i`'s recorded failure).
pub fn recorded(rec: &[Option<String>], samples: &[Sample]) -> Value {
    let (mut same, mut differently, mut now_ok, mut newly_failed) = (0u64, 0u64, 0u64, 0u64);
    for (r, s) in rec.iter().zip(samples) {
        let replayed = match s.ok() {
            true => None,
            false => Some(s.error.map_or("failed".into(), |e| e.as_str())),
        };
        match (r.as_deref(), replayed.as_deref()) {
            (Some(a), Some(b)) if a == b => same += 1,
            (Some(_), Some(_)) => differently += 1,
            (Some(_), None) => now_ok += 1,
            (None, Some(_)) => newly_failed += 1,
            (None, None) => {}
        }
    }
    json!({
        "recorded_failures": rec.iter().flatten().count(),
        "failed_again_same_way": same,
        "failed_differently": differently,
        "now_succeed": now_ok,
        "newly_failed": newly_failed,
        "recorded_errors": error_counts(rec.iter().flatten().map(String::as_str)),
    })
}

/// The console lines after vLLM's block: how the recording's failures and its side requests
/// fared (empty when there are neither).
pub fn console(rec: Option<&[Option<String>]>, samples: &[Sample], aux: &[Sample]) -> String {
    let mut s = String::new();
    if let Some(rec) = rec.filter(|r| r.iter().any(Option::is_some)) {
        let v = recorded(rec, samples);
        s.push_str(&format!(
            "Recorded failures: {} ({} failed again the same way, {} differently, {} now succeed); {} requests newly failed\n",
            v["recorded_failures"], v["failed_again_same_way"], v["failed_differently"],
            v["now_succeed"], v["newly_failed"]
        ));
    }
    if let Some(a) = auxiliary(aux) {
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
    use crate::trace::{Request, Response, TraceHeader};

    fn sample(err: Option<Failure>) -> Sample {
        Sample {
            ttft_ns: err.is_none().then_some(5),
            error: err,
            ..Default::default()
        }
    }

    #[test]
    fn recorded_and_replayed_outcomes_side_by_side() {
        let req = |err: Option<&str>| Request {
            response: Some(Box::new(Response {
                status: if err.is_some() { 404 } else { 200 },
                error: err.map(str::to_string),
                ..Default::default()
            })),
            ..Default::default()
        };
        let t = Trace {
            header: TraceHeader::imported(16, true, "t"),
            requests: vec![
                req(Some("http_404")),
                req(Some("http_400")),
                req(None),
                req(None),
                req(Some("http_404")),
                req(None),
            ],
        };
        // Send 5 is auxiliary: left out of the recorded failures.
        let aux = [false, false, false, false, false, true];
        let rec = recorded_failures(&t, &[0, 1, 2, 3, 4, 5], &aux).unwrap();
        assert_eq!(rec.len(), 5);
        let samples = vec![
            sample(Some(Failure::Http(404))),
            sample(Some(Failure::Http(404))),
            sample(None),
            sample(Some(Failure::Reset)),
            sample(None),
        ];
        let v = recorded(&rec, &samples);
        assert_eq!(v["recorded_failures"], 3);
        assert_eq!(v["failed_again_same_way"], 1);
        assert_eq!(v["failed_differently"], 1);
        assert_eq!(v["newly_failed"], 1);
        assert_eq!(v["now_succeed"], 1);
        assert_eq!(v["recorded_errors"]["http_404"], 2);
        let line = console(Some(&rec), &samples, &[]);
        assert!(line.starts_with("Recorded failures: 3 (1 failed again the same way, 1 differently, 1 now succeed); 1 requests newly failed"), "{line}");
        assert_eq!(console(None, &samples, &[]), "");
        let imported = Trace {
            header: t.header.clone(),
            requests: vec![Request::default()],
        };
        assert_eq!(recorded_failures(&imported, &[0], &[false]), None);
    }

    #[test]
    fn auxiliary_samples_are_split_off_and_counted() {
        let s = vec![
            sample(None),
            sample(None),
            sample(Some(Failure::Http(404))),
            sample(None),
        ];
        let (work, side) = split(s, &[false, true, true, false]);
        assert_eq!(work.len(), 2);
        let v = auxiliary(&side).unwrap();
        assert_eq!((v["sent"].clone(), v["ok"].clone()), (json!(2), json!(1)));
        assert_eq!(v["errors"]["http_404"], 1);
        assert_eq!(auxiliary(&[]), None);
    }
}
