//! Reading a result file back: retrace's own (`retrace.replay/1`) and `vllm bench serve
//! --save-result`'s, whose keys ours keep. The one reader that `compare`, `report` and `merge`
//! use: the JSON depth check, the sidecar put back, the schema and every value checked within
//! [`super::bounds`], then the per-request arrays as typed [`Columns`] and the whole histograms
//! decoded on demand ([`ResultFile::histogram`]). Errors name the file and the key.
//!
//! The nested sections a run may carry (`sessions`, `probes`, `server_metrics`, `selection`) stay
//! as written, in [`ResultFile::doc`]: their readers take them from there.

use super::{bounds, sidecar};
use crate::metrics::Histograms;
use hdrhistogram::Histogram;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// A result file that cannot be read, naming the file (and key).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: key `{key}`: {msg}")]
    Key {
        path: String,
        key: String,
        msg: String,
    },
    #[error(
        "{path}: JSON nested {JSON_DEPTH_LIMIT} levels deep at byte {at}: past serde_json's recursion limit, not read"
    )]
    TooDeep { path: String, at: usize },
    #[error("{path}: not JSON: {msg}")]
    NotJson { path: String, msg: String },
    #[error(transparent)]
    Sidecar(#[from] sidecar::SidecarError),
}

/// The depth of nesting at which serde_json stops reading a JSON value (its recursion limit).
pub(crate) const JSON_DEPTH_LIMIT: usize = 128;

/// Who wrote a result file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// `retrace replay --result-json`.
    Retrace,
    /// `vllm bench serve --save-result`.
    Vllm,
}

/// One result file, read and checked.
#[derive(Debug, Clone)]
pub(crate) struct ResultFile<'a> {
    pub(crate) origin: Origin,
    /// Top-level numbers under their keys.
    pub(crate) scalars: BTreeMap<String, f64>,
    /// Top-level strings (under 300 bytes) and booleans, as text.
    pub(crate) info: BTreeMap<String, String>,
    /// The per-request arrays, when the file has them (`ttfts` present).
    pub(crate) columns: Option<Columns>,
    /// The whole object as written, the sidecar's arrays put back.
    pub(crate) doc: &'a Map<String, Value>,
    path: String,
}

/// A result's index-aligned per-request arrays as written: seconds, `None` for null, the lengths
/// equal (checked).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Columns {
    pub(crate) input_lens: Vec<u64>,
    pub(crate) output_lens: Vec<u64>,
    /// 0 or null: no first token.
    pub(crate) ttfts: Vec<Option<f64>>,
    /// E2EL; absent in older vLLM files (all `None` then).
    pub(crate) latencies: Vec<Option<f64>>,
    pub(crate) start_times: Vec<Option<f64>>,
    /// Ours: the intended send times, same origin as `start_times`.
    pub(crate) intended_times: Option<Vec<Option<f64>>>,
    /// `""` on success.
    pub(crate) errors: Vec<String>,
    pub(crate) itls: Vec<Vec<f64>>,
    pub(crate) client_queue_times: Vec<Option<f64>>,
    pub(crate) server_queue_times: Vec<Option<f64>>,
    pub(crate) server_ttfts: Vec<Option<f64>>,
    pub(crate) server_input_lens: Vec<Option<f64>>,
    /// Empty when the file does not say.
    pub(crate) non_streamed: Vec<bool>,
}

/// Where the first JSON value in `data` reaches [`JSON_DEPTH_LIMIT`] levels of nesting, if it
/// does: the offset of the bracket that does (strings skipped; the scan ends with the value).
pub(crate) fn too_deep(data: &[u8]) -> Option<usize> {
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
pub(crate) fn parse_json(path: &Path, data: &[u8]) -> Result<Value, ReadError> {
    let name = || path.display().to_string();
    if let Some(at) = too_deep(data) {
        return Err(ReadError::TooDeep { path: name(), at });
    }
    serde_json::from_slice(data).map_err(|e| ReadError::NotJson {
        path: name(),
        msg: e.to_string(),
    })
}

/// Who wrote `obj`, when it is a result file: ours by its schema, vLLM's by its keys.
pub(crate) fn origin(obj: &Map<String, Value>) -> Option<Origin> {
    let schema = obj.get("schema").and_then(Value::as_str);
    if schema.is_some_and(|s| s.starts_with("retrace.replay/")) {
        return Some(Origin::Retrace);
    }
    let vllm = obj.contains_key("completed")
        && (obj.contains_key("duration") || obj.contains_key("mean_ttft_ms"));
    vllm.then_some(Origin::Vllm)
}

/// A result naming a sidecar file (`requests_file`: a plain file beside the result file `path`,
/// [`sidecar::beside`]): its rows put back as the result's per-request arrays, so the result
/// reads as one with inline arrays. A result with arrays both inline and in a sidecar is refused.
pub(crate) fn with_sidecar(path: &Path, obj: &mut Map<String, Value>) -> Result<(), ReadError> {
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

/// `doc` (the file `path`, its sidecar already put back) checked: a retrace result of the schema
/// this build writes, every scalar and array within [`bounds`], the arrays typed.
pub(crate) fn check<'a>(
    path: &Path,
    doc: &'a Map<String, Value>,
    origin: Origin,
) -> Result<ResultFile<'a>, ReadError> {
    let retrace = origin == Origin::Retrace;
    let schema = doc.get("schema");
    if retrace && schema.and_then(Value::as_str) != Some(super::SCHEMA) {
        let found: String = schema.map_or_else(
            || "missing".into(),
            |s| crate::trace::clip(&s.to_string()).into(),
        );
        let msg = format!("is {found}, this retrace reads {}", super::SCHEMA);
        return Err(key_err(path, "schema", msg));
    }
    bounds::check_scalars(doc, retrace).map_err(|b| key_err(path, &b.key, b.msg))?;
    let n = bounds::check_arrays(doc, retrace).map_err(|b| key_err(path, &b.key, b.msg))?;
    let columns = match n {
        Some(n) => Some(columns(path, doc, n)?),
        None => None,
    };
    let (mut scalars, mut info) = (BTreeMap::new(), BTreeMap::new());
    for (k, v) in doc {
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
    Ok(ResultFile {
        origin,
        scalars,
        info,
        columns,
        doc,
        path: path.display().to_string(),
    })
}

/// A result object already in memory (`replay --report-html`, a merged result) checked as
/// [`check`] checks a file: ours when it has a `schema`, else vLLM's. `None`: not an object.
pub(crate) fn from_value<'a>(
    path: &Path,
    v: &'a Value,
) -> Result<Option<ResultFile<'a>>, ReadError> {
    let Value::Object(obj) = v else {
        return Ok(None);
    };
    let origin = match obj.contains_key("schema") {
        true => Origin::Retrace,
        false => Origin::Vllm,
    };
    check(path, obj, origin).map(Some)
}

impl ResultFile<'_> {
    /// The whole histogram `name` (`ttft_us`, ...) decoded, `None` when the file has none.
    pub(crate) fn histogram(&self, name: &str) -> Result<Option<Histogram<u64>>, ReadError> {
        let Some(h) = self.doc.get("histograms") else {
            return Ok(None);
        };
        let err = |key: String, msg: String| ReadError::Key {
            path: self.path.clone(),
            key,
            msg,
        };
        let Value::Object(h) = h else {
            return Err(err("histograms".into(), "expected an object".into()));
        };
        let Some(b64) = h.get(name) else {
            return Ok(None);
        };
        let key = || format!("histograms.{name}");
        let s = b64
            .as_str()
            .ok_or_else(|| err(key(), "expected a string".into()))?;
        Histograms::decode(s).map(Some).map_err(|e| err(key(), e))
    }
}

/// The `n`-long per-request arrays of `doc` (their lengths and kinds checked by [`bounds`]).
fn columns(path: &Path, doc: &Map<String, Value>, n: usize) -> Result<Columns, ReadError> {
    let need = |key: &str| -> Result<Vec<Option<f64>>, ReadError> {
        f64_array(path, doc, key, n)?
            .ok_or_else(|| key_err(path, key, "missing (ttfts is present)"))
    };
    let opt = |key: &str| -> Result<Vec<Option<f64>>, ReadError> {
        Ok(f64_array(path, doc, key, n)?.unwrap_or_else(|| vec![None; n]))
    };
    let lens = |key: &str| -> Result<Vec<u64>, ReadError> {
        Ok(need(key)?
            .into_iter()
            .map(|v| v.unwrap_or(0.0).max(0.0) as u64)
            .collect())
    };
    Ok(Columns {
        input_lens: lens("input_lens")?,
        output_lens: lens("output_lens")?,
        ttfts: need("ttfts")?,
        latencies: opt("latencies")?,
        start_times: opt("start_times")?,
        intended_times: f64_array(path, doc, "intended_times", n)?,
        errors: errors(path, doc, n)?,
        itls: itls(path, doc, n)?,
        client_queue_times: opt("client_queue_times")?,
        server_queue_times: opt("server_queue_times")?,
        server_ttfts: opt("server_ttfts")?,
        server_input_lens: opt("server_input_lens")?,
        non_streamed: non_streamed(path, doc, n)?,
    })
}

/// The array `key` of `n` numbers or nulls, `None` when absent.
fn f64_array(
    path: &Path,
    doc: &Map<String, Value>,
    key: &str,
    n: usize,
) -> Result<Option<Vec<Option<f64>>>, ReadError> {
    let Some(v) = doc.get(key) else {
        return Ok(None);
    };
    let Value::Array(a) = v else {
        return Err(key_err(path, key, "expected an array"));
    };
    if a.len() != n {
        let msg = format!("has {} elements, ttfts has {n}", a.len());
        return Err(key_err(path, key, msg));
    }
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

fn errors(path: &Path, doc: &Map<String, Value>, n: usize) -> Result<Vec<String>, ReadError> {
    match doc.get("errors") {
        Some(Value::Array(a)) if a.len() == n => Ok(a
            .iter()
            .map(|e| e.as_str().unwrap_or("").to_string())
            .collect()),
        Some(_) => Err(key_err(
            path,
            "errors",
            format!("expected an array of {n} strings"),
        )),
        None => Ok(vec![String::new(); n]),
    }
}

fn itls(path: &Path, doc: &Map<String, Value>, n: usize) -> Result<Vec<Vec<f64>>, ReadError> {
    let Some(v) = doc.get("itls") else {
        return Ok(vec![Vec::new(); n]);
    };
    let Value::Array(a) = v else {
        return Err(key_err(
            path,
            "itls",
            format!("expected an array of {n} lists"),
        ));
    };
    if a.len() != n {
        return Err(key_err(
            path,
            "itls",
            format!("expected an array of {n} lists"),
        ));
    }
    a.iter()
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
        .collect()
}

fn non_streamed(path: &Path, doc: &Map<String, Value>, n: usize) -> Result<Vec<bool>, ReadError> {
    match doc.get("non_streamed") {
        Some(Value::Array(a)) if a.len() == n => {
            Ok(a.iter().map(|v| v.as_bool() == Some(true)).collect())
        }
        Some(_) => {
            let why = format!("expected an array of {n} booleans or nulls");
            Err(key_err(path, "non_streamed", why))
        }
        None => Ok(Vec::new()),
    }
}

fn key_err(path: &Path, key: &str, msg: impl Into<String>) -> ReadError {
    ReadError::Key {
        path: path.display().to_string(),
        key: key.into(),
        msg: msg.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn doc(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    /// A result as `replay --result-json --detailed` writes it reads back with every array typed
    /// at its length, and its histograms decoded.
    #[test]
    fn a_written_result_reads_back_typed() {
        let s = crate::result::tests::samples();
        let sum = crate::metrics::summarize(&s, 0.1, &[50.0, 99.0]);
        let h = Histograms::from_samples(&s);
        let v = crate::result::build(&crate::result::tests::info(), &sum, &h, &s, true);
        let d = doc(v);
        let f = check(Path::new("r.json"), &d, Origin::Retrace).unwrap();
        let c = f.columns.as_ref().unwrap();
        assert_eq!(c.ttfts.len(), 2);
        assert_eq!(
            (c.input_lens.as_slice(), c.itls[0].len()),
            ([100, 200].as_slice(), 2)
        );
        assert_eq!(c.ttfts[0], Some(0.05));
        assert!(c.errors[0].is_empty() && c.errors[1].contains("boom"));
        assert_eq!(c.intended_times.as_ref().map(Vec::len), Some(2));
        assert_eq!(f.scalars.get("completed"), Some(&1.0));
        let ttft = f.histogram("ttft_us").unwrap().unwrap();
        assert_eq!(ttft.len(), 1);
        assert!(f.histogram("absent").unwrap().is_none());
    }

    #[test]
    fn an_other_schema_or_a_short_array_is_refused_naming_file_and_key() {
        let other = doc(serde_json::json!({"schema": "retrace.replay/9", "completed": 1}));
        let e = check(Path::new("a.json"), &other, Origin::Retrace).unwrap_err();
        assert!(e.to_string().starts_with("a.json: key `schema`"), "{e}");
        let short = doc(serde_json::json!({"completed": 2, "duration": 1.0,
            "ttfts": [0.1, 0.2], "input_lens": [1, 1], "output_lens": [1, 1], "itls": [[]]}));
        let e = check(Path::new("b.json"), &short, Origin::Vllm).unwrap_err();
        assert!(
            e.to_string().contains("b.json") && e.to_string().contains("itls"),
            "{e}"
        );
        let bad = doc(
            serde_json::json!({"schema": crate::result::SCHEMA, "completed": 1,
            "histograms": {"ttft_us": 7}}),
        );
        let f = check(Path::new("c.json"), &bad, Origin::Retrace).unwrap();
        let e = f.histogram("ttft_us").unwrap_err().to_string();
        assert!(e.starts_with("c.json: key `histograms.ttft_us`"), "{e}");
    }

    #[test]
    fn the_origin_is_our_schema_or_vllms_keys() {
        let o = |v: Value| origin(&doc(v));
        assert_eq!(
            o(serde_json::json!({"schema": "retrace.replay/1"})),
            Some(Origin::Retrace)
        );
        assert_eq!(
            o(serde_json::json!({"completed": 1, "duration": 2.0})),
            Some(Origin::Vllm)
        );
        assert_eq!(o(serde_json::json!({"completed": 1})), None);
        assert_eq!(o(serde_json::json!({"schema": "retrace.capacity/1"})), None);
    }
}
