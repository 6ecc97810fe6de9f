//! Reading the inputs `compare` and `report` accept into one comparable model ([`Run`]): a
//! retrace replay result (`retrace.replay/1`), a `vllm bench serve --save-result` JSON file, an
//! AIPerf export (read by [`super::aiperf`]), or a recorded trace (any format
//! [`crate::trace::import`] reads; its recorded responses give the latencies).
//!
//! Per-request arrays (retrace `--detailed`, vLLM's always-present `ttfts`/`itls`/...) become
//! [`Requests`]; retrace's whole HdrHistograms become [`Weighted`] distributions; top-level numbers
//! keep their vLLM key names in [`Run::scalars`]. Errors name the file and the key. This module
//! does not compute comparisons or statistics beyond turning inputs into samples.

use super::run::add_totals;
pub use super::run::{Kind, Metric, Requests, Run};
use super::weighted::Weighted;
use crate::metrics::Histograms;
use crate::result::bounds;
use crate::result::sidecar;
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
    #[error("{path}: key `{key}`: {msg}")]
    Key {
        path: String,
        key: String,
        msg: String,
    },
    #[error(
        "{path}: not a retrace result, a vllm bench serve result, an AIPerf export, or a trace: {msg}"
    )]
    Unknown { path: String, msg: String },
    #[error(
        "{path}: JSON nested {JSON_DEPTH_LIMIT} levels deep at byte {at}: past serde_json's recursion limit, not read"
    )]
    TooDeep { path: String, at: usize },
    #[error("{path}: not JSON: {msg}")]
    NotJson { path: String, msg: String },
    #[error(transparent)]
    Aiperf(#[from] super::aiperf::AiperfError),
    #[error(transparent)]
    Sidecar(#[from] sidecar::SidecarError),
}

/// The depth of nesting at which serde_json stops reading a JSON value (its recursion limit).
pub(crate) const JSON_DEPTH_LIMIT: usize = 128;

/// Where the first JSON value in `data` reaches [`JSON_DEPTH_LIMIT`] levels of nesting, if it
/// does: the offset of the bracket that does (strings skipped; the scan ends with the value).
fn too_deep(data: &[u8]) -> Option<usize> {
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    for (i, &b) in data.iter().enumerate() {
        if in_str {
            match b {
                _ if esc => esc = false,
                b'\\' => esc = true,
                b'"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'{' | b'[' => {
                depth += 1;
                if depth >= JSON_DEPTH_LIMIT {
                    return Some(i);
                }
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return None;
                }
            }
            _ => {}
        }
    }
    None
}

/// `data` (the file `path`) as one JSON value: nested past serde_json's recursion limit or not
/// JSON, an error naming the file and saying which.
pub(crate) fn parse_json(path: &Path, data: &[u8]) -> Result<Value, LoadError> {
    let name = || path.display().to_string();
    if let Some(at) = too_deep(data) {
        return Err(LoadError::TooDeep { path: name(), at });
    }
    serde_json::from_slice(data).map_err(|e| LoadError::NotJson {
        path: name(),
        msg: e.to_string(),
    })
}

/// Reads any supported input.
pub fn load(path: &Path) -> Result<Run, LoadError> {
    let name = path.display().to_string();
    let data = trace::rows::read_whole(path).map_err(|e| LoadError::Io {
        path: name.clone(),
        source: e,
    })?;
    let first = data.iter().find(|b| !b.is_ascii_whitespace()).copied();
    if matches!(first, Some(b'{' | b'[')) {
        if let Some(at) = too_deep(&data) {
            return Err(LoadError::TooDeep { path: name, at });
        }
    }
    if first == Some(b'{') {
        if let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(&data) {
            let is_retrace = obj
                .get("schema")
                .and_then(Value::as_str)
                .is_some_and(|s| s.starts_with("retrace.replay/"));
            let is_vllm = obj.contains_key("completed")
                && (obj.contains_key("duration") || obj.contains_key("mean_ttft_ms"));
            let schema = obj.get("schema").and_then(Value::as_str).unwrap_or("");
            if schema.starts_with(super::capacity::SCHEMA_PREFIX) {
                return Err(LoadError::Unknown {
                    path: name,
                    msg: "a capacity result: give one of its steps' results (`steps[i].result`, a replay result)".into(),
                });
            }
            if is_retrace || is_vllm {
                with_sidecar(path, &mut obj)?;
                return from_result(path, &obj, is_retrace);
            }
        }
    }
    if let Some(format) = super::aiperf::detect(&data) {
        return Ok(super::aiperf::read(path, &data, format)?);
    }
    match trace::import::read_bytes(&name, &data, &Default::default()) {
        Ok((t, _)) => Ok(from_trace(path, t)),
        Err(e) => Err(LoadError::Unknown {
            path: name,
            msg: e.to_string(),
        }),
    }
}

/// A result object already in memory (`replay --report-html`); `path` names it in errors and
/// labels.
pub fn from_value(path: &Path, v: &Value) -> Result<Run, LoadError> {
    let Value::Object(obj) = v else {
        return Err(LoadError::Unknown {
            path: path.display().to_string(),
            msg: "the result is not a JSON object".into(),
        });
    };
    let is_retrace = obj.contains_key("schema");
    from_result(path, obj, is_retrace)
}

/// A result naming a sidecar file (`requests_file`: a plain file beside the result file `path`,
/// [`sidecar::beside`]): its rows put back as the result's per-request arrays, so the result
/// reads as one with inline arrays. A result with arrays both inline and in a sidecar is refused.
pub(crate) fn with_sidecar(
    path: &Path,
    obj: &mut serde_json::Map<String, Value>,
) -> Result<(), LoadError> {
    let Some(name) = obj.get(sidecar::KEY) else {
        return Ok(());
    };
    let name = name
        .as_str()
        .ok_or_else(|| key_err(path, sidecar::KEY, "expected a file name"))?;
    if let Some(k) = sidecar::ARRAYS.iter().find(|k| obj.contains_key(**k)) {
        let msg = format!("names a sidecar, and the result holds `{k}` inline: its per-request arrays are in one place or the other");
        return Err(key_err(path, sidecar::KEY, msg));
    }
    let n = obj
        .get("num_prompts")
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| {
            key_err(
                path,
                "num_prompts",
                "expected the count of the sidecar's rows",
            )
        })?;
    let file = sidecar::beside(path, name)?;
    let arrays = sidecar::read(&file, n)?;
    obj.extend(arrays);
    Ok(())
}

fn key_err(path: &Path, key: &str, msg: impl Into<String>) -> LoadError {
    LoadError::Key {
        path: path.display().to_string(),
        key: key.into(),
        msg: msg.into(),
    }
}

fn f64_array(
    path: &Path,
    obj: &serde_json::Map<String, Value>,
    key: &str,
) -> Result<Option<Vec<Option<f64>>>, LoadError> {
    let Some(v) = obj.get(key) else {
        return Ok(None);
    };
    let Value::Array(a) = v else {
        return Err(key_err(path, key, "expected an array"));
    };
    a.iter()
        .enumerate()
        .map(|(i, x)| match x {
            Value::Null => Ok(None),
            Value::Number(n) => Ok(n.as_f64()),
            _ => Err(key_err(
                path,
                key,
                format!("element {i} is not a number or null"),
            )),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The schema this build writes, and scalars within [`bounds`].
fn check_schema_and_scalars(
    path: &Path,
    obj: &serde_json::Map<String, Value>,
    is_retrace: bool,
) -> Result<(), LoadError> {
    let schema = obj.get("schema");
    if is_retrace && schema.and_then(Value::as_str) != Some(crate::result::SCHEMA) {
        let found: String =
            schema.map_or_else(|| "missing".into(), |s| trace::clip(&s.to_string()).into());
        let want = crate::result::SCHEMA;
        return Err(key_err(
            path,
            "schema",
            format!("is {found}, this retrace reads {want}"),
        ));
    }
    bounds::check_scalars(obj, is_retrace).map_err(|b| key_err(path, &b.key, b.msg))
}

fn from_result(
    path: &Path,
    obj: &serde_json::Map<String, Value>,
    is_retrace: bool,
) -> Result<Run, LoadError> {
    let mut scalars = BTreeMap::new();
    let mut info = BTreeMap::new();
    for (k, v) in obj {
        match v {
            Value::Number(n) => {
                if let Some(f) = n.as_f64() {
                    scalars.insert(k.clone(), f);
                }
            }
            Value::String(s) if s.len() < 300 => {
                info.insert(k.clone(), s.clone());
            }
            Value::Bool(b) => {
                info.insert(k.clone(), b.to_string());
            }
            _ => {}
        }
    }
    check_schema_and_scalars(path, obj, is_retrace)?;
    let mut hists = BTreeMap::new();
    if let Some(h) = obj.get("histograms") {
        let Value::Object(h) = h else {
            return Err(key_err(path, "histograms", "expected an object"));
        };
        for m in Metric::ALL {
            let Some((name, unit)) = m.histogram() else {
                continue;
            };
            let Some(b64) = h.get(name) else { continue };
            let s = b64
                .as_str()
                .ok_or_else(|| key_err(path, &format!("histograms.{name}"), "expected a string"))?;
            let hist = Histograms::decode(s)
                .map_err(|e| key_err(path, &format!("histograms.{name}"), e))?;
            hists.insert(m, Weighted::from_histogram(&hist, unit));
        }
    }
    let requests = requests_from(path, obj, is_retrace)?;
    Ok(Run {
        path: path.to_path_buf(),
        kind: if is_retrace {
            Kind::Retrace
        } else {
            Kind::Vllm
        },
        scalars,
        info,
        requests,
        hists,
        trace: None,
        server_series: obj
            .get("server_metrics")
            .and_then(|m| m.get("series"))
            .filter(|v| v.is_object())
            .cloned(),
        sections: ["sessions", "probes", "server_metrics"]
            .iter()
            .filter_map(|k| obj.get(*k).map(|v| (*k, v)))
            .flat_map(|(k, v)| flatten(k, v))
            .collect(),
        selection: obj
            .get("selection")
            .and_then(|v| serde_json::from_value(v.clone()).ok()),
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

/// The per-request arrays, each checked within [`bounds`] first.
fn requests_from(
    path: &Path,
    obj: &serde_json::Map<String, Value>,
    is_retrace: bool,
) -> Result<Option<Requests>, LoadError> {
    let checked =
        bounds::check_arrays(obj, is_retrace).map_err(|b| key_err(path, &b.key, b.msg))?;
    let (Some(n), Some(ttfts)) = (checked, f64_array(path, obj, "ttfts")?) else {
        return Ok(None);
    };
    let need = |key: &str| -> Result<Vec<Option<f64>>, LoadError> {
        let v = f64_array(path, obj, key)?
            .ok_or_else(|| key_err(path, key, "missing (ttfts is present)"))?;
        if v.len() != n {
            return Err(key_err(
                path,
                key,
                format!("has {} elements, ttfts has {n}", v.len()),
            ));
        }
        Ok(v)
    };
    let opt = |key: &str| -> Result<Vec<Option<f64>>, LoadError> {
        match f64_array(path, obj, key)? {
            Some(v) if v.len() == n => Ok(v),
            Some(v) => Err(key_err(
                path,
                key,
                format!("has {} elements, ttfts has {n}", v.len()),
            )),
            None => Ok(vec![None; n]),
        }
    };
    let lens = |key: &str| -> Result<Vec<u64>, LoadError> {
        Ok(need(key)?
            .into_iter()
            .map(|v| v.unwrap_or(0.0).max(0.0) as u64)
            .collect())
    };
    let input_lens = lens("input_lens")?;
    let output_lens = lens("output_lens")?;
    // older vLLM versions write no `latencies`: E2EL (and TPOT) are then unknown per request
    let latencies = opt("latencies")?;
    let starts_raw = opt("start_times")?;
    let errors: Vec<String> = match obj.get("errors") {
        Some(Value::Array(a)) if a.len() == n => a
            .iter()
            .map(|e| e.as_str().unwrap_or("").to_string())
            .collect(),
        Some(_) => {
            return Err(key_err(
                path,
                "errors",
                format!("expected an array of {n} strings"),
            ))
        }
        None => vec![String::new(); n],
    };
    let itls_s: Vec<Vec<f64>> = match obj.get("itls") {
        Some(Value::Array(a)) if a.len() == n => a
            .iter()
            .enumerate()
            .map(|(i, e)| match e {
                Value::Array(x) => x
                    .iter()
                    .map(|v| {
                        v.as_f64().ok_or_else(|| {
                            key_err(path, "itls", format!("element {i} holds a non-number"))
                        })
                    })
                    .collect(),
                _ => Err(key_err(path, "itls", format!("element {i} is not a list"))),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(key_err(
                path,
                "itls",
                format!("expected an array of {n} lists"),
            ))
        }
        None => vec![Vec::new(); n],
    };
    let t0 = starts_raw
        .iter()
        .flatten()
        .copied()
        .fold(f64::INFINITY, f64::min);
    let t0 = if t0.is_finite() { t0 } else { 0.0 };
    let intended = f64_array(path, obj, "intended_times")?;
    // retrace's start times and intended times share t0; shift both by the same origin.
    let origin = match &intended {
        Some(v) => v.iter().flatten().copied().fold(t0, f64::min),
        None => t0,
    };
    let start_s = starts_raw
        .iter()
        .map(|v| v.map_or(0.0, |x| x - origin))
        .collect();
    let intended_s = intended.map(|v| v.iter().map(|x| x.unwrap_or(0.0) - origin).collect());
    // vLLM writes 0 for "no first token"; so does retrace.
    let pos = |v: Option<f64>| v.filter(|x| *x > 0.0);
    Ok(Some(Requests {
        input_lens,
        output_lens,
        start_s,
        intended_s,
        ttft_s: ttfts.into_iter().map(pos).collect(),
        latency_s: latencies.into_iter().map(pos).collect(),
        itls_s,
        errors,
        client_queue_s: opt("client_queue_times")?,
        server_queue_s: opt("server_queue_times")?,
        server_ttft_s: opt("server_ttfts")?,
        server_input_lens: opt("server_input_lens")?
            .into_iter()
            .map(|v| v.filter(|x| *x >= 1.0).map(|x| x as u64))
            .collect(),
        non_streamed: match obj.get("non_streamed") {
            Some(Value::Array(a)) if a.len() == n => {
                a.iter().map(|v| v.as_bool() == Some(true)).collect()
            }
            Some(_) => {
                let why = format!("expected an array of {n} booleans or nulls");
                return Err(key_err(path, "non_streamed", why));
            }
            None => Vec::new(),
        },
    }))
}

/// A recording's exchanges as per-request arrays, by the one rule of recorded latency
/// ([`trace::Response::completed`], shared with `inspect`): an exchange that did not complete
/// (cancelled, an error, a status of 400 or more) is a failure with its kind and no latency; a
/// completed one is timed from its arrival, a whole body apart (E2E only), as a replay times it.
pub(crate) fn recorded_requests(work: &[&trace::Request]) -> Requests {
    let mut r = Requests::default();
    let t0 = work.iter().map(|q| q.arrival_us).min().unwrap_or(0);
    for q in work {
        r.input_lens.push(q.input_tokens);
        r.output_lens.push(q.output_tokens);
        r.start_s.push(q.arrival_us.saturating_sub(t0) as f64 / 1e6);
        let resp = q.response.as_deref();
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

    /// The depth limit is serde_json's own (127 levels read, 128 not); brackets inside strings
    /// do not count.
    #[test]
    fn json_nested_to_serde_jsons_recursion_limit_is_found_outside_strings() {
        let nested = |d: usize| format!("{}{}", "[".repeat(d), "]".repeat(d));
        let (ok, deep) = (nested(JSON_DEPTH_LIMIT - 1), nested(JSON_DEPTH_LIMIT));
        assert!(serde_json::from_str::<Value>(&ok).is_ok());
        assert!(serde_json::from_str::<Value>(&deep).is_err());
        assert_eq!(too_deep(ok.as_bytes()), None);
        assert_eq!(too_deep(deep.as_bytes()), Some(JSON_DEPTH_LIMIT - 1));
        let quoted = format!("{{\"a\": \"\\\"{}\"}}", "[".repeat(500));
        assert!(serde_json::from_str::<Value>(&quoted).is_ok(), "{quoted}");
        assert_eq!(too_deep(quoted.as_bytes()), None);
        // only the first value of a JSONL file
        let lines = format!("{{}}\n{deep}");
        assert_eq!(too_deep(lines.as_bytes()), None);
        let e = parse_json(Path::new("d.json"), deep.as_bytes()).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("d.json: JSON nested 128 levels deep"),
            "{e}"
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
