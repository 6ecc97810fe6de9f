//! Reading the inputs `compare` and `report` accept into one comparable model ([`Run`]): a
//! retrace replay result (`retrace.replay/1`), a `vllm bench serve --save-result` JSON file, an
//! AIPerf export (read by [`super::aiperf`]), or a recorded trace (any format
//! [`crate::trace::import`] reads; its recorded responses give the latencies).
//!
//! A result file is read and checked by [`crate::result::read`]; here its typed per-request
//! arrays become [`Requests`] (times from the first send), its whole HdrHistograms [`Weighted`]
//! distributions, and its top-level numbers keep their vLLM key names in [`Run::scalars`]. Errors
//! name the file and the key. This module does not compute comparisons or statistics beyond
//! turning inputs into samples.

use super::run::add_totals;
pub use super::run::{Kind, Metric, Requests, Run};
use super::weighted::Weighted;
use crate::result::read::{self, Origin, ReadError, ResultFile};
use crate::trace::{self, Trace};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// A load failure naming the file (and key).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "{path}: not a retrace result, a vllm bench serve result, an AIPerf export, or a trace: {msg}"
    )]
    Unknown { path: String, msg: String },
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Aiperf(#[from] super::aiperf::AiperfError),
}

/// Reads any supported input.
pub fn load(path: &Path) -> Result<Run, LoadError> {
    let data = trace::rows::read_whole(path).map_err(|e| LoadError::Io {
        path: path.display().to_string(),
        source: e,
    })?;
    load_bytes(path, &data)
}

/// What a file given to `report` is: a run, or a capacity result (`retrace capacity
/// --result-json`), which has a page of its own.
pub(crate) enum Input {
    Run(Box<Run>),
    Capacity(Value),
}

/// [`load`] of the file `path` already read into `data`; a capacity result is an error naming
/// what to give instead.
fn load_bytes(path: &Path, data: &[u8]) -> Result<Run, LoadError> {
    match read_input(path, data)? {
        Input::Run(r) => Ok(*r),
        Input::Capacity(_) => Err(LoadError::Unknown {
            path: path.display().to_string(),
            msg: "a capacity result: give one of its steps' results (`steps[i].result`, a replay result)".into(),
        }),
    }
}

/// The file `path`, already read into `data`, as a run or a capacity result, its JSON parsed
/// once.
pub(crate) fn read_input(path: &Path, data: &[u8]) -> Result<Input, LoadError> {
    let name = path.display().to_string();
    let first = data.iter().find(|b| !b.is_ascii_whitespace()).copied();
    if matches!(first, Some(b'{' | b'[')) {
        if let Some(at) = read::too_deep(data) {
            return Err(ReadError::TooDeep { path: name, at }.into());
        }
    }
    if first == Some(b'{') {
        if let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(data) {
            let schema = obj.get("schema").and_then(Value::as_str).unwrap_or("");
            if schema.starts_with(super::capacity::SCHEMA_PREFIX) {
                return Ok(Input::Capacity(Value::Object(obj)));
            }
            if let Some(origin) = read::origin(&obj) {
                read::with_sidecar(path, &mut obj)?;
                let run = from_result(path, read::check(path, &obj, origin)?)?;
                return Ok(Input::Run(Box::new(run)));
            }
        }
    }
    if let Some(format) = super::aiperf::detect(data) {
        return Ok(Input::Run(Box::new(super::aiperf::read(
            path, data, format,
        )?)));
    }
    match trace::import::read_bytes(&name, data, &Default::default()) {
        Ok((t, _)) => Ok(Input::Run(Box::new(from_trace(path, t)))),
        Err(e) => Err(LoadError::Unknown {
            path: name,
            msg: e.to_string(),
        }),
    }
}

/// A result object already in memory (`replay --report-html`, a merged result); `path` names it
/// in errors and labels.
pub fn from_value(path: &Path, v: &Value) -> Result<Run, LoadError> {
    match read::from_value(path, v)? {
        Some(f) => from_result(path, f),
        None => Err(LoadError::Unknown {
            path: path.display().to_string(),
            msg: "the result is not a JSON object".into(),
        }),
    }
}

/// A result file as a [`Run`]: its numbers and strings, its whole histograms in ms, its
/// per-request arrays from the first send, and its sections flattened for the report.
fn from_result(path: &Path, f: ResultFile<'_>) -> Result<Run, LoadError> {
    let mut hists = BTreeMap::new();
    for m in Metric::ALL {
        let Some((name, unit)) = m.histogram() else {
            continue;
        };
        if let Some(h) = f.histogram(name)? {
            hists.insert(m, Weighted::from_histogram(&h, unit));
        }
    }
    let doc = f.doc;
    Ok(Run {
        path: path.to_path_buf(),
        kind: match f.origin {
            Origin::Retrace => Kind::Retrace,
            Origin::Vllm => Kind::Vllm,
        },
        requests: f.columns.as_ref().map(Requests::from_columns),
        hists,
        trace: None,
        server_series: doc
            .get("server_metrics")
            .and_then(|m| m.get("series"))
            .filter(|v| v.is_object())
            .cloned(),
        sections: ["sessions", "probes", "server_metrics"]
            .iter()
            .filter_map(|k| doc.get(*k).map(|v| (*k, v)))
            .flat_map(|(k, v)| flatten(k, v))
            .collect(),
        selection: doc
            .get("selection")
            .and_then(|v| serde_json::from_value(v.clone()).ok()),
        scalars: f.scalars,
        info: f.info,
    })
}

/// Scalar leaves of `v` under `prefix` (`a.b.c`), arrays and the `series` object skipped, at most
/// three levels deep.
fn flatten(prefix: &str, v: &Value) -> Vec<(String, Value)> {
    fn walk(prefix: String, v: &Value, depth: usize, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(m) if depth < 3 => {
                for (k, x) in m {
                    if k != "series" {
                        walk(format!("{prefix}.{k}"), x, depth + 1, out);
                    }
                }
            }
            Value::Number(_) | Value::String(_) | Value::Bool(_) => out.push((prefix, v.clone())),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(prefix.to_string(), v, 0, &mut out);
    out
}

/// A recording's exchanges as per-request arrays, by the one rule of recorded latency
/// ([`trace::Response::completed`], shared with `inspect`): an exchange that did not complete
/// (cancelled, an error, a status of 400 or more) is a failure with its kind and no latency; a
/// completed one is timed from its arrival, a whole body apart (E2E only), as a replay times it.
pub(crate) fn recorded_requests(work: &[&trace::Request]) -> Requests {
    let t0 = work.iter().map(|q| q.arrival_us).min().unwrap_or(0);
    let rows = work.iter().map(|q| Answered {
        input_tokens: q.input_tokens,
        output_tokens: q.output_tokens,
        arrival_us: q.arrival_us,
        response: q.response.as_deref(),
    });
    answered_requests(rows, t0)
}

/// One recorded answer: the primary's, or a shadow's copy of the same request.
pub(crate) struct Answered<'a> {
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    pub(crate) arrival_us: u64,
    pub(crate) response: Option<&'a trace::Response>,
}

/// The per-request columns of recorded answers, their start times from `t0_us`.
pub(crate) fn answered_requests<'a>(
    rows: impl Iterator<Item = Answered<'a>>,
    t0_us: u64,
) -> Requests {
    let mut r = Requests::default();
    for q in rows {
        r.input_lens.push(q.input_tokens);
        r.output_lens.push(q.output_tokens);
        r.start_s
            .push(q.arrival_us.saturating_sub(t0_us) as f64 / 1e6);
        let resp = q.response;
        r.errors.push(match resp {
            None => "no_response".to_string(),
            Some(p) if p.completed() => String::new(),
            Some(p) if p.cancelled => "cancelled".into(),
            Some(p) if p.status >= 400 => format!("http_{}", p.status),
            Some(p) => p.error.clone().unwrap_or_else(|| "failed".into()),
        });
        let streamed = resp.and_then(trace::Response::streamed_latency_us);
        let whole = resp.and_then(trace::Response::whole_body_e2e_us);
        r.ttft_s
            .push(streamed.map(|(t, _)| t).or(whole).map(|v| v as f64 / 1e6));
        r.latency_s
            .push(streamed.map(|(_, e)| e).or(whole).map(|v| v as f64 / 1e6));
        let itls = resp.filter(|p| p.completed()).map_or_else(Vec::new, |p| {
            p.events
                .windows(2)
                .map(|w| w[1].offset_us.saturating_sub(w[0].offset_us) as f64 / 1e6)
                .collect()
        });
        r.itls_s.push(itls);
        let sm = resp.and_then(|p| p.server_metrics.as_ref());
        r.client_queue_s.push(None);
        r.server_queue_s
            .push(sm.and_then(|m| m.queue_time_ms).map(|v| v / 1e3));
        r.server_ttft_s
            .push(sm.and_then(|m| m.time_to_first_token_ms).map(|v| v / 1e3));
        r.server_input_lens.push(None);
        r.non_streamed.push(whole.is_some());
    }
    r
}

/// A trace: workload always; latency from recorded responses when present.
fn from_trace(path: &Path, t: Trace) -> Run {
    let mut scalars = BTreeMap::new();
    let mut info = BTreeMap::new();
    info.insert("source".to_string(), t.header.source.clone());
    // The workload only: side requests (/tokenize, GET /v1/models, ...) are counted apart.
    let work: Vec<&trace::Request> = t.requests.iter().filter(|r| r.is_workload()).collect();
    let aux = t.requests.len() - work.len();
    if aux > 0 {
        scalars.insert("auxiliary_left_out".to_string(), aux as f64);
    }
    let recorded = work.iter().any(|r| r.response.is_some());
    let requests = recorded.then(|| recorded_requests(&work));
    if let Some(r) = &requests {
        add_totals(r, &mut scalars);
    }
    Run {
        path: path.to_path_buf(),
        kind: Kind::Trace,
        scalars,
        info,
        requests,
        hists: BTreeMap::new(),
        trace: Some(t),
        server_series: None,
        sections: Vec::new(),
        selection: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(p: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(p)
    }

    #[test]
    fn reads_real_vllm_result() {
        let r = load(&fixture(
            "fixtures/vllm/bench_serve_result_timed_trace.json",
        ))
        .unwrap();
        assert_eq!(r.kind, Kind::Vllm);
        assert_eq!(r.scalar("completed"), Some(30.0));
        let q = r.requests.as_ref().unwrap();
        assert_eq!(q.len(), 30);
        assert_eq!(q.start_s.iter().copied().fold(f64::INFINITY, f64::min), 0.0);
        // Our TTFT statistics from its per-request arrays equal vLLM's own keys.
        let ttft = r.samples_ms(Metric::Ttft).unwrap();
        let mean = ttft.iter().sum::<f64>() / ttft.len() as f64;
        assert!((mean - r.scalar("mean_ttft_ms").unwrap()).abs() < 1e-6);
        let tpot = r.samples_ms(Metric::Tpot).unwrap();
        let mean = tpot.iter().sum::<f64>() / tpot.len() as f64;
        assert!((mean - r.scalar("mean_tpot_ms").unwrap()).abs() < 1e-6);
    }

    /// A negative latency is a damaged file, named, never a failure that histograms stand in for.
    #[test]
    fn a_negative_ttft_or_latency_is_an_error_naming_key_and_element() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        for (key, body) in [
            ("ttfts", r#""ttfts": [0.1, -0.2], "latencies": [0.2, 0.3]"#),
            (
                "latencies",
                r#""ttfts": [0.1, 0.2], "latencies": [0.2, -1e300]"#,
            ),
        ] {
            std::fs::write(&p, format!(r#"{{"completed": 2, "duration": 1.0, "input_lens": [1, 1], "output_lens": [1, 1], {body}}}"#)).unwrap();
            let e = load(&p).unwrap_err().to_string();
            assert!(
                e.contains("r.json") && e.contains(key) && e.contains("element 1"),
                "{e}"
            );
        }
    }

    #[test]
    fn non_streamed_requests_stay_out_of_the_streamed_metrics() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        std::fs::write(&p, r#"{"schema": "retrace.replay/1", "completed": 2, "duration": 1.0, "ttfts": [0.1, 0.5], "input_lens": [1, 1], "output_lens": [3, 3], "latencies": [0.2, 0.5], "itls": [[0.05, 0.05], []], "errors": ["", ""], "non_streamed": [null, true]}"#).unwrap();
        let r = load(&p).unwrap();
        assert_eq!(r.samples_ms(Metric::Ttft).unwrap(), [100.0]);
        assert_eq!(r.samples_ms(Metric::E2el).unwrap(), [200.0]);
        assert_eq!(r.samples_ms(Metric::Tpot).unwrap().len(), 1);
        std::fs::write(&p, r#"{"completed": 1, "duration": 1.0, "ttfts": [0.1], "input_lens": [1], "output_lens": [1], "latencies": [0.2], "non_streamed": 7}"#).unwrap();
        let e = load(&p).unwrap_err().to_string();
        assert!(e.contains("non_streamed"), "{e}");
    }

    #[test]
    fn bad_key_names_file_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        std::fs::write(&p, r#"{"completed": 2, "duration": 1.0, "ttfts": [0.1, 0.2], "input_lens": [1], "output_lens": [1,1], "latencies": [1,1]}"#).unwrap();
        let e = load(&p).unwrap_err().to_string();
        assert!(e.contains("r.json") && e.contains("input_lens"), "{e}");
    }

    #[test]
    fn session_probe_and_server_sections_are_flattened_for_the_report() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        std::fs::write(
            &p,
            r#"{"schema": "retrace.replay/1", "completed": 2, "duration": 1.0,
                "sessions": {"turns": 4, "drift_from_recorded_ms": {"mean": 1.5, "p99": null}},
                "probes": {"sent": 10, "ttft_ms": {"p99": 12.0}},
                "server_metrics": {"achieved": {"hit_rate": 0.5}, "series": {"t": [0, 1]}}}"#,
        )
        .unwrap();
        let r = load(&p).unwrap();
        let keys: Vec<&str> = r.sections.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "sessions.drift_from_recorded_ms.mean",
                "sessions.turns",
                "probes.sent",
                "probes.ttft_ms.p99",
                "server_metrics.achieved.hit_rate"
            ]
        );
        assert_eq!(r.sections[3].1, serde_json::json!(12.0));
        assert!(r.server_series.is_some());
    }

    #[test]
    fn a_recorded_non_streamed_completion_counts_as_completed_and_stays_out_of_ttft() {
        let resp = |stream: bool, status: u16| trace::Response {
            status,
            ttft_us: stream.then_some(10_000),
            events: if stream {
                vec![trace::Event {
                    offset_us: 10_000,
                    tokens: 1,
                }]
            } else {
                Vec::new()
            },
            end_us: Some(30_000),
            usage: (status == 200).then(Default::default),
            ..Default::default()
        };
        let req = |arrival_us, r| trace::Request {
            arrival_us,
            input_tokens: 4,
            output_tokens: 1,
            response: Some(Box::new(r)),
            ..Default::default()
        };
        let t = Trace {
            header: trace::TraceHeader::imported(16, true, "t"),
            requests: vec![
                req(0, resp(true, 200)),
                req(1, resp(false, 200)),
                req(2, resp(false, 404)),
            ],
        };
        let r = from_trace(Path::new("rec.trace.zst"), t);
        assert_eq!(
            (r.scalar("completed"), r.scalar("failed")),
            (Some(2.0), Some(1.0))
        );
        // The whole body is reported apart, as a replay reports it (E2EL only).
        assert_eq!(r.samples_ms(Metric::Ttft).unwrap(), [10.0]);
        assert_eq!(
            r.requests.as_ref().unwrap().non_streamed,
            [false, true, false]
        );
    }

    #[test]
    fn unknown_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.json");
        std::fs::write(&p, "{\"hello\": 1}").unwrap();
        let e = load(&p).unwrap_err().to_string();
        assert!(e.contains("x.json"), "{e}");
    }

    #[test]
    fn compare_refuses_other_schema_and_negative_or_absurd_counts_naming_file_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cand.json");
        let cases = [
            (
                r#""schema": "retrace.replay/2", "completed": 2"#,
                "`schema`",
            ),
            (
                r#""schema": "retrace.replay/1", "completed": -3"#,
                "`completed`",
            ),
            (
                r#""schema": "retrace.replay/1", "completed": 1e300"#,
                "`completed`",
            ),
            (
                r#""schema": "retrace.replay/1", "completed": 2, "failed": -1"#,
                "`failed`",
            ),
            (
                r#""completed": 2, "total_input_tokens": 1e300"#,
                "`total_input_tokens`",
            ),
        ];
        for (body, key) in cases {
            std::fs::write(&p, format!(r#"{{{body}, "duration": 1.0}}"#)).unwrap();
            let e = load(&p).unwrap_err().to_string();
            assert!(e.contains("cand.json") && e.contains(key), "{body}: {e}");
        }
        let v = serde_json::json!({"schema": "retrace.replay/1", "completed": 2, "duration": -1.0});
        let e = from_value(&p, &v).unwrap_err().to_string();
        assert!(e.contains("cand.json") && e.contains("`duration`"), "{e}");
        std::fs::write(
            &p,
            r#"{"schema": "retrace.replay/1", "completed": 2, "duration": 1.0}"#,
        )
        .unwrap();
        assert_eq!(load(&p).unwrap().scalar("completed"), Some(2.0));
    }
}
