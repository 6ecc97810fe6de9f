//! The replay result file (`--result-json`): vLLM's keys, ours, and whole histograms.
//!
//! One JSON object. Schema `retrace.replay/1` (documented in `docs/result-format.md`, held by the
//! snapshot test below):
//!
//! - **vLLM keys** (same names, units and definitions as `vllm bench serve --save-result`):
//!   `date`, `backend`, `endpoint_type`, `model_id`, `num_prompts`, `request_rate`, `max_concurrency`,
//!   `duration` (s, first dispatch to last completion), `completed`, `failed`,
//!   `total_input_tokens`, `total_output_tokens`, `request_throughput`, `request_goodput` (null without `--goodput`),
//!   `output_throughput`, `total_token_throughput`, `max_concurrent_requests`, and for each metric
//!   `M` in `ttft`, `tpot`, `itl`, `e2el`: `mean_M_ms`, `median_M_ms`, `std_M_ms`, `pP_M_ms` for
//!   every `--percentiles` value P (`p99`, `p99.9`).
//! - **ours**: `schema`, `retrace_version`, `trace`, `target` (URL only; headers and keys are never
//!   written), `speed`, `seed`, `block_size`, `prompt_mode`, `drift_limit_ms` (`--max-drift-ms`), `valid` (false
//!   when p99 drift exceeded it), `invalid_reason`, `errors_by_kind` ({kind: count}), and the same
//!   mean/median/std/pP/min/max family for `ttft_from_intended`, `e2el_from_intended` (latency from
//!   the intended send time, free of coordinated omission), `drift` (send drift: actual send −
//!   intended − client queue, i.e. the dispatcher's lateness plus the hand-over to the request's
//!   task; negative = early), `client_queue` (waiting for a concurrency slot), `server_queue`, `server_ttft` (vLLM
//!   per-request `metrics`, when the server sent them) and `unattributed` (client TTFT − server queue
//!   − server TTFT), plus `server_reported` (requests with server metrics) and `inexact_prompts`.
//! - **histograms**: `{name: base64 HdrHistogram V2}` for `ttft_us`, `tpot_us`, `itl_us`,
//!   `e2el_us`, `drift_abs_ns`, `client_queue_ns` (successful requests; drift/queue of all).
//! - **with `--detailed`**, index-aligned per-request arrays in seconds like vLLM's: `input_lens`,
//!   `output_lens`, `ttfts` (0 when none), `itls` (lists), `latencies` (E2EL, 0 when none),
//!   `start_times` (actual send, s from t0), `errors` ("" on success, else `kind: detail`),
//!   `server_queue_times`, `server_ttfts` (null where unknown), and ours: `intended_times`,
//!   `drifts`, `client_queue_times`.
//!
//! This module builds the JSON value; it does not print or write files.

use crate::metrics::{ns_to_s, percentile_label, Failure, Histograms, Sample, Stats, Summary};
use serde_json::{json, Map, Value};

/// Schema identifier written into every result.
pub const SCHEMA: &str = "retrace.replay/1";

/// Run facts that are not measurements.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    pub date: String,
    pub trace: String,
    pub target: String,
    pub model: String,
    pub endpoint: String,
    pub speed: f64,
    pub max_concurrency: Option<usize>,
    pub seed: u64,
    pub block_size: u32,
    pub prompt_mode: String,
    /// `--max-drift-ms`, when given.
    pub drift_limit_ms: Option<f64>,
    pub valid: bool,
    pub invalid_reason: Option<String>,
    pub inexact_prompts: u64,
}

/// Writes `s` as vLLM's `mean_/median_/std_/pP_{name}_ms` keys; `extra` adds `min_`, `max_` and
/// `count_` (also used by `retrace merge`).
pub(crate) fn put_stats(m: &mut Map<String, Value>, name: &str, s: &Stats, extra: bool) {
    m.insert(format!("mean_{name}_ms"), json!(s.mean));
    m.insert(format!("median_{name}_ms"), json!(s.median));
    m.insert(format!("std_{name}_ms"), json!(s.std));
    for (p, v) in &s.percentiles {
        m.insert(format!("p{}_{name}_ms", percentile_label(*p)), json!(v));
    }
    if extra {
        m.insert(format!("min_{name}_ms"), json!(s.min));
        m.insert(format!("max_{name}_ms"), json!(s.max));
        m.insert(format!("count_{name}"), json!(s.count));
    }
}

/// Builds the result object; `detailed` adds the per-request arrays.
pub fn build(
    info: &RunInfo,
    sum: &Summary,
    hist: &Histograms,
    samples: &[Sample],
    detailed: bool,
) -> Value {
    let mut m = Map::new();
    m.insert("schema".into(), json!(SCHEMA));
    m.insert("retrace_version".into(), json!(env!("CARGO_PKG_VERSION")));
    m.insert("date".into(), json!(info.date));
    m.insert("backend".into(), json!("retrace"));
    m.insert("endpoint_type".into(), json!(info.endpoint));
    m.insert("model_id".into(), json!(info.model));
    m.insert("num_prompts".into(), json!(samples.len()));
    m.insert("request_rate".into(), json!("trace"));
    m.insert("max_concurrency".into(), json!(info.max_concurrency));
    m.insert("duration".into(), json!(sum.duration_s));
    m.insert("completed".into(), json!(sum.completed));
    m.insert("failed".into(), json!(sum.failed));
    m.insert("total_input_tokens".into(), json!(sum.total_input_tokens));
    m.insert("total_output_tokens".into(), json!(sum.total_output_tokens));
    m.insert("request_throughput".into(), json!(sum.request_throughput));
    m.insert("request_goodput".into(), json!(sum.request_goodput));
    m.insert("output_throughput".into(), json!(sum.output_throughput));
    m.insert(
        "total_token_throughput".into(),
        json!(sum.total_token_throughput),
    );
    m.insert(
        "max_concurrent_requests".into(),
        json!(sum.max_concurrent_requests),
    );
    for (name, s) in [
        ("ttft", &sum.ttft),
        ("tpot", &sum.tpot),
        ("itl", &sum.itl),
        ("e2el", &sum.e2el),
    ] {
        put_stats(&mut m, name, s, false);
    }
    // ours
    m.insert("trace".into(), json!(info.trace));
    m.insert("target".into(), json!(info.target));
    m.insert("speed".into(), json!(info.speed));
    m.insert("seed".into(), json!(info.seed));
    m.insert("block_size".into(), json!(info.block_size));
    m.insert("prompt_mode".into(), json!(info.prompt_mode));
    m.insert("drift_limit_ms".into(), json!(info.drift_limit_ms));
    m.insert("valid".into(), json!(info.valid));
    m.insert("invalid_reason".into(), json!(info.invalid_reason));
    m.insert("inexact_prompts".into(), json!(info.inexact_prompts));
    m.insert("errors_by_kind".into(), json!(sum.errors));
    m.insert("server_reported".into(), json!(sum.server_reported));
    for (name, s) in [
        ("ttft_from_intended", &sum.ttft_from_intended),
        ("e2el_from_intended", &sum.e2el_from_intended),
        ("drift", &sum.drift),
        ("client_queue", &sum.client_queue),
        ("server_queue", &sum.server_queue),
        ("server_ttft", &sum.server_ttft),
        ("unattributed", &sum.unattributed),
    ] {
        put_stats(&mut m, name, s, true);
    }
    m.insert("histograms".into(), json!(hist.encode()));
    if detailed {
        let s = samples;
        let opt_s = |v: Option<u64>| v.map_or(0.0, ns_to_s);
        m.insert(
            "input_lens".into(),
            json!(s.iter().map(|x| x.input_tokens).collect::<Vec<_>>()),
        );
        m.insert(
            "output_lens".into(),
            json!(s.iter().map(|x| x.output_tokens).collect::<Vec<_>>()),
        );
        m.insert(
            "ttfts".into(),
            json!(s.iter().map(|x| opt_s(x.ttft_ns)).collect::<Vec<_>>()),
        );
        m.insert(
            "itls".into(),
            json!(s
                .iter()
                .map(|x| x.itls_ns.iter().map(|&n| ns_to_s(n)).collect::<Vec<_>>())
                .collect::<Vec<_>>()),
        );
        m.insert(
            "latencies".into(),
            json!(s.iter().map(|x| opt_s(x.e2el_ns)).collect::<Vec<_>>()),
        );
        m.insert(
            "start_times".into(),
            json!(s.iter().map(|x| ns_to_s(x.sent_ns)).collect::<Vec<_>>()),
        );
        m.insert(
            "errors".into(),
            json!(s
                .iter()
                .map(|x| match (&x.error, &x.error_detail) {
                    (None, _) if x.ok() => String::new(),
                    (None, _) => Failure::NoContent.to_string(),
                    (Some(k), Some(d)) => format!("{k}: {d}"),
                    (Some(k), None) => k.to_string(),
                })
                .collect::<Vec<_>>()),
        );
        m.insert(
            "server_queue_times".into(),
            json!(s
                .iter()
                .map(|x| x.server.queue_ms.map(|v| v / 1000.0))
                .collect::<Vec<_>>()),
        );
        m.insert(
            "server_ttfts".into(),
            json!(s
                .iter()
                .map(|x| x.server.ttft_ms.map(|v| v / 1000.0))
                .collect::<Vec<_>>()),
        );
        m.insert(
            "intended_times".into(),
            json!(s.iter().map(|x| ns_to_s(x.intended_ns)).collect::<Vec<_>>()),
        );
        m.insert(
            "drifts".into(),
            json!(s
                .iter()
                .map(|x| x.drift_ns() as f64 / 1e9)
                .collect::<Vec<_>>()),
        );
        m.insert(
            "client_queue_times".into(),
            json!(s
                .iter()
                .map(|x| ns_to_s(x.client_queue_ns()))
                .collect::<Vec<_>>()),
        );
    }
    Value::Object(m)
}

/// Adds the `--sessions` report as `sessions`: `{sessions, turns, dependent_turns,
/// released_after_failure, drift: {count, mean_ms, median_ms, std_ms, min_ms, max_ms, pP_ms}}`
/// (drift = actual release − recorded arrival of each dependent turn, ms).
pub fn add_sessions(result: &mut Value, r: &crate::replay::sessions::SessionReport) {
    let mut d = Map::new();
    d.insert("count".into(), json!(r.drift.count));
    d.insert("mean_ms".into(), json!(r.drift.mean));
    d.insert("median_ms".into(), json!(r.drift.median));
    d.insert("std_ms".into(), json!(r.drift.std));
    d.insert("min_ms".into(), json!(r.drift.min));
    d.insert("max_ms".into(), json!(r.drift.max));
    for (p, v) in &r.drift.percentiles {
        d.insert(format!("p{}_ms", percentile_label(*p)), json!(v));
    }
    if let Value::Object(m) = result {
        m.insert(
            "sessions".into(),
            json!({
                "sessions": r.sessions,
                "turns": r.turns,
                "dependent_turns": r.dependent_turns,
                "released_after_failure": r.released_after_failure,
                "drift": Value::Object(d),
            }),
        );
    }
}

/// Run facts that are not in [`RunInfo`]: how the run was measured and what ran beside it.
#[derive(Debug, Clone, Default)]
pub struct RunExtras {
    /// `--start-at`, as displayed.
    pub start_at: Option<String>,
    /// `kernel` or `read` (see [`crate::replay::pool::Pool::rx_stamp`]).
    pub rx_stamp: &'static str,
    /// Reader threads and their batch window, when bodies were read on them.
    pub readers: Option<(usize, std::time::Duration)>,
    pub cpu_setup_s: f64,
    pub cpu_run_s: f64,
    pub embedded_target: bool,
    /// `--scrape-metrics`'s summary.
    pub server_metrics: Option<Value>,
    /// `--probe-request-rate`'s summary.
    pub probes: Option<Value>,
}

/// Adds `start_at` (with `--start-at`), `rx_stamp`, `body_readers` (`{threads, batch_us}` or
/// null), `client_cpu` (`{setup_s, run_s, embedded_target}`), `server_metrics` and `probes` (when
/// they ran).
pub fn add_run(result: &mut Value, x: &RunExtras) {
    let Value::Object(m) = result else { return };
    if let Some(at) = &x.start_at {
        m.insert("start_at".into(), json!(at));
    }
    m.insert("rx_stamp".into(), json!(x.rx_stamp));
    let readers = x.readers.map(|(n, batch)| {
        json!({
            "threads": n,
            "batch_us": batch.as_micros() as u64,
        })
    });
    m.insert("body_readers".into(), json!(readers));
    m.insert(
        "client_cpu".into(),
        json!({
            "setup_s": x.cpu_setup_s,
            "run_s": x.cpu_run_s,
            "embedded_target": x.embedded_target,
        }),
    );
    if let Some(sm) = &x.server_metrics {
        m.insert("server_metrics".into(), sm.clone());
    }
    if let Some(p) = &x.probes {
        m.insert("probes".into(), p.clone());
    }
}

/// What the replay sent of a recording, and how it compares with the recording.
#[derive(Debug, Clone, Default)]
pub struct Selected {
    /// `--include-aux`, `--skip-recorded-failures`.
    pub selection: Value,
    /// Requests left out, by reason.
    pub left_out: Value,
    /// `METHOD path` → requests sent.
    pub by_endpoint: Value,
    /// Side requests sent (`--include-aux`): `{sent, ok, errors}`.
    pub auxiliary: Option<Value>,
    /// Recorded against replayed outcomes (recorded traces).
    pub recorded_outcomes: Option<Value>,
    /// With `--detailed`: each measured request's recorded failure.
    pub recorded_errors: Option<Value>,
}

/// Adds `selection`, `left_out`, `requests_by_endpoint`, and when present `auxiliary`,
/// `recorded_outcomes` and `recorded_errors`.
pub fn add_selection(result: &mut Value, x: &Selected) {
    let Value::Object(m) = result else { return };
    m.insert("selection".into(), x.selection.clone());
    m.insert("left_out".into(), x.left_out.clone());
    m.insert("requests_by_endpoint".into(), x.by_endpoint.clone());
    for (k, v) in [
        ("auxiliary", &x.auxiliary),
        ("recorded_outcomes", &x.recorded_outcomes),
        ("recorded_errors", &x.recorded_errors),
    ] {
        if let Some(v) = v {
            m.insert(k.into(), v.clone());
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::metrics::{summarize, ServerTimes};

    const MS: u64 = 1_000_000;

    fn samples() -> Vec<Sample> {
        vec![
            Sample {
                input_tokens: 100,
                output_tokens: 3,
                intended_ns: 0,
                dispatched_ns: 10_000,
                slot_wait_ns: 10_000,
                sent_ns: 20_000,
                ttft_ns: Some(50 * MS),
                e2el_ns: Some(70 * MS),
                itls_ns: vec![10 * MS, 10 * MS],
                end_ns: 70 * MS + 20_000,
                server: ServerTimes {
                    queue_ms: Some(1.0),
                    ttft_ms: Some(40.0),
                },
                ..Default::default()
            },
            Sample {
                input_tokens: 200,
                intended_ns: 5 * MS,
                dispatched_ns: 5 * MS,
                sent_ns: 5 * MS,
                end_ns: 6 * MS,
                error: Some(crate::metrics::Failure::Http(500)),
                error_detail: Some("boom".into()),
                ..Default::default()
            },
        ]
    }

    /// A fixed run description for tests (also used by `report::merge`'s tests).
    pub(crate) fn info() -> RunInfo {
        RunInfo {
            date: "20260101-000000".into(),
            trace: "t.jsonl".into(),
            target: "http://127.0.0.1:1".into(),
            model: "m".into(),
            endpoint: "completions".into(),
            speed: 1.0,
            max_concurrency: None,
            seed: 0,
            block_size: 512,
            prompt_mode: "token-ids".into(),
            drift_limit_ms: None,
            valid: true,
            invalid_reason: None,
            inexact_prompts: 0,
        }
    }

    /// The schema contract: key names and value types. A change here is a format change: bump
    /// SCHEMA and update docs/result-format.md.
    #[test]
    fn schema_snapshot() {
        let s = samples();
        let sum = summarize(&s, 0.1, &[50.0, 99.0]);
        let h = Histograms::from_samples(&s);
        let mut v = build(&info(), &sum, &h, &s, true);
        // The optional sections (`--sessions`, `--scrape-metrics`) are part of the contract.
        let r = crate::replay::sessions::SessionReport {
            sessions: 2,
            turns: 5,
            dependent_turns: 3,
            released_after_failure: 1,
            drift: Stats::from_seconds(&[0.010, -0.002, 0.030], &[50.0, 99.0]),
        };
        add_sessions(&mut v, &r);
        let point = |t_s: f64, x: f64| crate::replay::scrape::Point {
            t_s,
            running: Some(x),
            waiting: Some(0.0),
            kv_usage: Some(x / 8.0),
            hits: Some(100.0 * x),
            queries: Some(1000.0 * x),
            prompt_tokens: Some(1000.0 * x),
            generation_tokens: None,
        };
        let series = crate::replay::scrape::Series {
            url: "http://127.0.0.1:1/metrics".into(),
            points: vec![point(-0.02, 0.0), point(1.0, 2.0), point(1.5, 3.0)],
            before_ok: true,
            after_ok: true,
            ..Default::default()
        };
        let theory = crate::replay::scrape::Theory {
            hits: 320,
            queries: 3000,
            server_block_size: 16,
        };
        v["server_metrics"] = crate::replay::scrape::summarize(&series, &theory);
        v["probes"] = crate::replay::probe::summarize(2.0, &s[..1], 0.5, &[50.0, 99.0]);
        // histograms are binary blobs: check they decode, snapshot only their names
        let hist = v["histograms"].as_object_mut().unwrap();
        for (_, b64) in hist.iter_mut() {
            assert!(Histograms::decode(b64.as_str().unwrap()).is_ok());
            *b64 = json!("<base64>");
        }
        insta::assert_json_snapshot!(v);
    }

    #[test]
    fn vllm_keys_present_without_detail() {
        let s = samples();
        let sum = summarize(&s, 0.1, &[99.0]);
        let v = build(&info(), &sum, &Histograms::from_samples(&s), &s, false);
        for k in [
            "completed",
            "failed",
            "duration",
            "mean_ttft_ms",
            "median_ttft_ms",
            "std_ttft_ms",
            "p99_ttft_ms",
            "p99_itl_ms",
            "mean_tpot_ms",
            "mean_e2el_ms",
            "request_throughput",
            "output_throughput",
            "total_token_throughput",
            "max_concurrent_requests",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        assert!(v.get("ttfts").is_none());
        assert_eq!(v["completed"], 1);
        assert_eq!(v["errors_by_kind"]["http_500"], 1);
    }
}
