//! `--probe-request-rate R`: small probe requests sent beside the workload at a steady rate, to
//! measure how much the workload slows unrelated traffic.
//!
//! A probe is a fresh [`PROBE_PROMPT_TOKENS`]-token prompt (its own hash id, so it shares no
//! prefix with the trace or with other probes) asking for one output token. Probes go out every
//! 1/R s from t0 until the workload's last request ends, each in its own task: outside
//! `--max-concurrency` (they never wait for a slot and never take one from the workload), on the
//! same connection pool. Their samples are summarised on their own ([`summarize`]: TTFT, E2EL,
//! failures), never mixed into the workload's metrics. Bodies are built before t0 like every
//! other ([`bodies_needed`] of them, for the planned span); when a run outlasts its plan (slow
//! server, `--sessions`) the bodies are reused in turn: a repeated prompt shorter than a KV block
//! still never hits the prefix cache. Probes release on tokio's timer (about a millisecond), not
//! the workload's precise dispatcher; their drift is reported. This module builds no bodies and
//! does not print.

use crate::metrics::{self, Failure, Sample, Scalars};
use crate::replay::http::client::{Client, SendTimes};
use crate::replay::http::request::BuiltRequest;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Prompt length of a probe, tokens (shorter than any KV block in use: it never hits the cache).
pub(crate) const PROBE_PROMPT_TOKENS: u64 = 8;

/// Distinct probe bodies to build for a plan spanning `span_ns` at `rate` per second: one per
/// planned probe plus one, at most `cap`.
pub(crate) fn bodies_needed(span_ns: u64, rate: f64, cap: usize) -> usize {
    let n = (span_ns as f64 / 1e9 * rate).ceil();
    if n.is_finite() && n >= 0.0 {
        (n as usize).saturating_add(1).clamp(1, cap.max(1))
    } else {
        1
    }
}

/// The send offset of probe `k`, ns from t0.
pub(crate) fn offset_ns(k: u64, rate: f64) -> u64 {
    (k as f64 * 1e9 / rate).round() as u64
}

/// A running prober.
pub(crate) struct Prober {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Vec<Sample>>,
}

/// Starts sending probes at `t0 + k / rate`.
pub(crate) fn start(
    rate: f64,
    bodies: Arc<Vec<BuiltRequest>>,
    client: Arc<Client>,
    t0: Instant,
) -> Prober {
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        let mut set = tokio::task::JoinSet::new();
        let mut k = 0u64;
        if !bodies.is_empty() {
            loop {
                let at_ns = offset_ns(k, rate);
                let at = tokio::time::Instant::from_std(t0 + Duration::from_nanos(at_ns));
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = stopped.changed() => break,
                }
                let times = SendTimes {
                    intended_ns: at_ns,
                    dispatched_ns: Instant::now().saturating_duration_since(t0).as_nanos() as u64,
                    slot_wait_ns: 0,
                };
                let (client, bodies) = (client.clone(), bodies.clone());
                let idx = (k % bodies.len() as u64) as usize;
                set.spawn(async move { client.send(&bodies[idx], times, t0, None).await });
                k += 1;
            }
        }
        let mut samples = Vec::with_capacity(k as usize);
        while let Some(r) = set.join_next().await {
            samples.push(r.unwrap_or_else(|e| Sample {
                scalars: Scalars {
                    error: Some(Failure::Local),
                    ..Default::default()
                },
                error_detail: Some(format!("probe task: {e}")),
                ..Default::default()
            }));
        }
        samples.sort_by_key(|s| s.intended_ns);
        samples
    });
    Prober { stop, task }
}

impl Prober {
    /// Stops sending (the workload is done) and waits for the probes in flight.
    pub(crate) async fn finish(self) -> Vec<Sample> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// The result file's `probes` object (pure): rate, counts, failures by kind, and the TTFT, E2EL
/// and dispatch-drift distributions of the probes.
pub(crate) fn summarize(
    rate: f64,
    samples: &[Sample],
    duration_s: f64,
    percentiles: &[f64],
) -> Value {
    let sum = metrics::summarize(samples, duration_s, percentiles);
    json!({
        "rate": rate,
        "prompt_tokens": PROBE_PROMPT_TOKENS,
        "sent": samples.len(),
        "completed": sum.completed,
        "failed": sum.failed,
        "errors_by_kind": sum.errors,
        "ttft": sum.ttft.to_json_ms(),
        "e2el": sum.e2el.to_json_ms(),
        "drift": sum.drift.to_json_ms(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_and_body_counts() {
        assert_eq!(offset_ns(0, 4.0), 0);
        assert_eq!(offset_ns(3, 4.0), 750_000_000);
        assert_eq!(offset_ns(1, 3.0), 333_333_333);
        assert_eq!(bodies_needed(10_000_000_000, 2.0, 1000), 21);
        assert_eq!(bodies_needed(0, 2.0, 1000), 1);
        assert_eq!(bodies_needed(u64::MAX, 1e6, 500), 500);
    }

    #[test]
    fn summary_keeps_probes_apart() {
        let ok = |ttft_ms: u64| Sample {
            scalars: Scalars {
                input_tokens: PROBE_PROMPT_TOKENS,
                output_tokens: 1,
                ttft_ns: Some(ttft_ms * 1_000_000),
                e2el_ns: Some(ttft_ms * 1_000_000 + 500_000),
                end_ns: ttft_ms * 1_000_000,
                ..Default::default()
            },
            ..Default::default()
        };
        let bad = Sample {
            scalars: Scalars {
                error: Some(Failure::Http(503)),
                ..Default::default()
            },
            ..Default::default()
        };
        let v = summarize(2.0, &[ok(10), ok(30), bad], 1.0, &[99.0]);
        assert_eq!(v["sent"], 3);
        assert_eq!(v["completed"], 2);
        assert_eq!(v["failed"], 1);
        assert_eq!(v["errors_by_kind"]["http_503"], 1);
        assert_eq!(v["ttft"]["mean_ms"], 20.0);
        assert_eq!(v["ttft"]["count"], 2);
        assert_eq!(v["e2el"]["max_ms"], 30.5);
        assert!(v["ttft"]["p99_ms"].as_f64().unwrap() > 29.0);
    }
}
