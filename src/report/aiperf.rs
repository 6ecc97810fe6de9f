//! AIPerf 0.13 exports as a [`Run`]: the per-request `profile_export.jsonl` (one record a line:
//! `metadata` with wall-clock ns stamps, `metrics` as `{value, unit}`, `error`) and the aggregate
//! `profile_export_aiperf.json` (per metric `{unit, avg, p1..p99, min, max, std, count}`).
//! Recognised by content, never by file name. Which AIPerf metric becomes which of ours (its
//! ITL is our TPOT, its ICL our ITL) and the deliberate differences: docs/compare.md. Also the
//! merge of per-request exports: every record of every input in one file, by send time.

use super::run::{self, Kind, Requests, Run};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Which AIPerf export a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExportKind {
    /// `profile_export.jsonl`.
    Records,
    /// `profile_export_aiperf.json`.
    Aggregate,
}

/// A failure naming the file (and the line of a per-request export).
#[derive(Debug, thiserror::Error)]
pub enum AiperfError {
    #[error("{path}: AIPerf per-request export, line {line}: {msg}")]
    Record {
        path: String,
        line: usize,
        msg: String,
    },
    #[error("{path}: AIPerf aggregate export: {msg}")]
    Aggregate { path: String, msg: String },
    #[error("{path}: {msg}")]
    Merge { path: String, msg: String },
}

/// The AIPerf aggregate schema major version this build reads (`schema_version` 1.x).
const SCHEMA_MAJOR: &str = "1";

/// The naming clash, shown in the report's summary.
const NAMES: &str = "AIPerf's ITL (inter_token_latency) is TPOT here; its ICL \
    (inter_chunk_latency) is ITL here";

/// What the aggregate cannot give, shown in the report's summary.
const AGGREGATE_LIMITS: &str = "per-metric statistics only (AIPerf's own): no per-request \
    CDFs, timeline, time series, length histograms, significance or paired comparison; the \
    run's profile_export.jsonl has them";

/// The most bytes [`detect`] parses: a first line longer than this is no record it recognises
/// unless it begins with `{"metadata"` (as AIPerf writes every record).
const DETECT_BYTES: usize = 1 << 20;

/// The export a file's content is, if it is one. A per-request export's first line is a record
/// (`{"metadata": ...`); an aggregate names `aiperf_version` in its first lines (AIPerf writes it
/// second), so a truncated file is still recognised and its error says what is wrong.
pub(crate) fn detect(data: &[u8]) -> Option<ExportKind> {
    let start = data.iter().position(|b| !b.is_ascii_whitespace())?;
    let data = &data[start..];
    let head = String::from_utf8_lossy(&data[..data.len().min(1024)]);
    if !head.starts_with('{') {
        return None;
    }
    if head[1..].trim_start().starts_with("\"metadata\"") {
        return Some(ExportKind::Records);
    }
    if head.contains("\"aiperf_version\"") {
        return Some(ExportKind::Aggregate);
    }
    let first = data.split(|b| *b == b'\n').next().unwrap_or(data);
    if first.len() > DETECT_BYTES {
        return None;
    }
    match serde_json::from_slice::<Value>(first) {
        Ok(Value::Object(o))
            if o.get("metadata").is_some_and(Value::is_object) && o.contains_key("metrics") =>
        {
            Some(ExportKind::Records)
        }
        _ => None,
    }
}

/// Reads an export [`detect`] recognised.
pub(crate) fn read(path: &Path, data: &[u8], format: ExportKind) -> Result<Run, AiperfError> {
    match format {
        ExportKind::Records => from_records(path, data),
        ExportKind::Aggregate => from_aggregate(path, data),
    }
}

#[derive(Deserialize)]
struct Record {
    metadata: Meta,
    #[serde(default)]
    metrics: Map<String, Value>,
    #[serde(default)]
    error: Option<ErrorDetails>,
}

#[derive(Deserialize)]
struct Meta {
    request_start_ns: u64,
    #[serde(default)]
    benchmark_phase: Option<String>,
    #[serde(default)]
    was_cancelled: bool,
    #[serde(default)]
    x_request_id: Option<String>,
}

#[derive(Deserialize)]
struct ErrorDetails {
    #[serde(default)]
    code: Option<i64>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// One record, as read: its 1-based line, its bytes and its fields.
struct Line<'a> {
    no: usize,
    raw: &'a [u8],
    rec: Record,
}

/// Every record of a per-request export, in file order.
fn records<'a>(path: &Path, data: &'a [u8]) -> Result<Vec<Line<'a>>, AiperfError> {
    let mut out = Vec::new();
    for (i, raw) in data.split(|b| *b == b'\n').enumerate() {
        let raw = raw.trim_ascii();
        if raw.is_empty() {
            continue;
        }
        let rec: Record = serde_json::from_slice(raw).map_err(|e| AiperfError::Record {
            path: path.display().to_string(),
            line: i + 1,
            msg: match e.classify() {
                serde_json::error::Category::Eof => format!("truncated record ({e})"),
                _ => crate::trace::clip_quoted(&e.to_string()),
            },
        })?;
        out.push(Line {
            no: i + 1,
            raw,
            rec,
        });
    }
    Ok(out)
}

/// Seconds per `unit` of an AIPerf time metric.
fn seconds_per(unit: &str) -> Option<f64> {
    match unit {
        "ns" => Some(1e-9),
        "us" => Some(1e-6),
        "ms" => Some(1e-3),
        "sec" | "s" => Some(1.0),
        _ => None,
    }
}

/// A metric's value and unit (`{"value": .., "unit": ".."}`); `None` when absent or null.
fn entry<'a>(m: &'a Map<String, Value>, key: &str) -> Result<Option<(&'a Value, &'a str)>, String> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o)) => match o.get("value") {
            None | Some(Value::Null) => Ok(None),
            Some(v) => Ok(Some((
                v,
                o.get("unit").and_then(Value::as_str).unwrap_or(""),
            ))),
        },
        Some(_) => Err(format!("metric `{key}` is not a {{value, unit}} object")),
    }
}

/// A finite non-negative number of `unit`s in seconds.
fn to_s(key: &str, v: &Value, unit: &str) -> Result<f64, String> {
    let per = seconds_per(unit)
        .ok_or_else(|| format!("metric `{key}`: unit `{unit}`, expected ns, us, ms or sec"))?;
    match v.as_f64() {
        Some(x) if x.is_finite() && x >= 0.0 => Ok(x * per),
        _ => Err(format!(
            "metric `{key}`: {}, expected a non-negative time",
            crate::trace::clip(&v.to_string())
        )),
    }
}

fn time_s(m: &Map<String, Value>, key: &str) -> Result<Option<f64>, String> {
    entry(m, key)?.map(|(v, u)| to_s(key, v, u)).transpose()
}

fn times_s(m: &Map<String, Value>, key: &str) -> Result<Vec<f64>, String> {
    match entry(m, key)? {
        None => Ok(Vec::new()),
        Some((Value::Array(a), u)) => a.iter().map(|v| to_s(key, v, u)).collect(),
        Some(_) => Err(format!("metric `{key}`: expected a list of times")),
    }
}

fn tokens(m: &Map<String, Value>, key: &str) -> Result<Option<u64>, String> {
    match entry(m, key)? {
        None => Ok(None),
        Some((v, _)) => v.as_u64().map(Some).ok_or_else(|| {
            format!(
                "metric `{key}`: {}, expected a token count",
                crate::trace::clip(&v.to_string())
            )
        }),
    }
}

/// Our error string of a record: `""` on success, `http_<code>`, AIPerf's error type, or
/// `cancelled`.
fn error_of(rec: &Record) -> String {
    match &rec.error {
        Some(e) => match (e.code, &e.kind, &e.message) {
            (Some(c), _, _) if (400..600).contains(&c) => format!("http_{c}"),
            (_, Some(t), _) if !t.is_empty() => crate::trace::clip(t).into_owned(),
            (_, _, Some(m)) if !m.is_empty() => crate::trace::clip(m).into_owned(),
            _ => "error".into(),
        },
        None if rec.metadata.was_cancelled => "cancelled".into(),
        None => String::new(),
    }
}

/// Appends one profiling request to `r`, its send time from `t0`.
fn push(r: &mut Requests, rec: &Record, t0: u64) -> Result<(), String> {
    let m = &rec.metrics;
    let error = error_of(rec);
    let latency_s = time_s(m, "request_latency")?;
    // a non-streamed response has no TTFT in AIPerf: its whole body is its first content
    let ttft_s = match time_s(m, "time_to_first_token")? {
        None if error.is_empty() => latency_s,
        t => t,
    };
    // The server's counts (`usage_*`) where AIPerf recorded them, else its own.
    let server_input = tokens(m, "usage_prompt_tokens")?;
    let input = server_input.or(tokens(m, "input_sequence_length")?);
    let output = match tokens(m, "usage_completion_tokens")? {
        None => tokens(m, "output_sequence_length")?,
        n => n,
    };
    r.itls_s.push(times_s(m, "inter_chunk_latency")?);
    r.start_s
        .push((rec.metadata.request_start_ns - t0) as f64 / 1e9);
    r.ttft_s.push(ttft_s);
    r.latency_s.push(latency_s);
    r.input_lens.push(input.unwrap_or(0));
    r.output_lens.push(output.unwrap_or(0));
    r.server_input_lens.push(server_input);
    r.errors.push(error);
    for v in [
        &mut r.client_queue_s,
        &mut r.server_queue_s,
        &mut r.server_ttft_s,
    ] {
        v.push(None);
    }
    Ok(())
}

/// Each request once: a record whose `x_request_id` an earlier record has (of this export or of
/// an earlier input of a merge: `seen`) is refused, naming both. Records without an id pass.
fn check_once<'p>(
    seen: &mut HashMap<String, (&'p Path, usize)>,
    path: &'p Path,
    l: &Line<'_>,
) -> Result<(), AiperfError> {
    let Some(id) = l.rec.metadata.x_request_id.as_deref() else {
        return Ok(());
    };
    match seen.insert(id.to_string(), (path, l.no)) {
        None => Ok(()),
        Some((earlier, no)) => Err(AiperfError::Record {
            path: path.display().to_string(),
            line: l.no,
            msg: format!(
                "request {} is also at line {no} of {}: each request counts once",
                crate::trace::clip(id),
                earlier.display()
            ),
        }),
    }
}

fn from_records(path: &Path, data: &[u8]) -> Result<Run, AiperfError> {
    let mut lines = records(path, data)?;
    let mut seen = HashMap::new();
    for l in &lines {
        check_once(&mut seen, path, l)?;
    }
    let all = lines.len();
    lines.retain(|l| l.rec.metadata.benchmark_phase.as_deref() != Some("warmup"));
    let warmup = all - lines.len();
    let err = |line, msg| AiperfError::Record {
        path: path.display().to_string(),
        line,
        msg,
    };
    let Some(t0) = lines.iter().map(|l| l.rec.metadata.request_start_ns).min() else {
        return Err(err(
            1,
            format!("no profiling-phase records ({warmup} warm-up records)"),
        ));
    };
    lines.sort_by_key(|l| l.rec.metadata.request_start_ns); // written as they complete
    let mut r = Requests::default();
    for l in &lines {
        push(&mut r, &l.rec, t0).map_err(|msg| err(l.no, msg))?;
    }
    let mut scalars = BTreeMap::new();
    run::add_totals(&r, &mut scalars);
    let mut sections = vec![("aiperf.names".to_string(), NAMES.into())];
    if warmup > 0 {
        sections.push(("aiperf.warmup_records_left_out".into(), warmup.into()));
    }
    Ok(Run {
        path: path.to_path_buf(),
        kind: Kind::Aiperf,
        scalars,
        info: BTreeMap::new(),
        requests: Some(r),
        hists: BTreeMap::new(),
        trace: None,
        server_series: None,
        sections,
        selection: None,
    })
}

/// AIPerf's latency metrics and ours of the same definition.
const LATENCY: [(&str, &str); 4] = [
    ("time_to_first_token", "ttft"),
    ("inter_token_latency", "tpot"),
    ("inter_chunk_latency", "itl"),
    ("request_latency", "e2el"),
];

/// AIPerf's statistics and our key prefixes (`{prefix}_{metric}_ms`).
const STATS: [(&str, &str); 13] = [
    ("avg", "mean"),
    ("p50", "median"),
    ("std", "std"),
    ("min", "min"),
    ("max", "max"),
    ("p1", "p1"),
    ("p5", "p5"),
    ("p10", "p10"),
    ("p25", "p25"),
    ("p50", "p50"),
    ("p75", "p75"),
    ("p90", "p90"),
    ("p99", "p99"),
];

fn from_aggregate(path: &Path, data: &[u8]) -> Result<Run, AiperfError> {
    let err = |msg: String| AiperfError::Aggregate {
        path: path.display().to_string(),
        msg,
    };
    let obj = match serde_json::from_slice::<Value>(data) {
        Ok(Value::Object(o)) => o,
        Ok(_) => return Err(err("not a JSON object".into())),
        Err(e) if e.classify() == serde_json::error::Category::Eof => {
            return Err(err(format!("truncated: {e}")))
        }
        Err(e) => return Err(err(format!("not valid JSON: {e}"))),
    };
    let schema = obj.get("schema_version").and_then(Value::as_str);
    if let Some(s) = schema.filter(|s| s.split('.').next() != Some(SCHEMA_MAJOR)) {
        return Err(err(format!(
            "key `schema_version`: is {s}, this retrace reads {SCHEMA_MAJOR}.x"
        )));
    }
    let mut scalars = BTreeMap::new();
    aggregate_latency(&obj, &mut scalars).map_err(err)?;
    aggregate_counts(&obj, &mut scalars).map_err(err)?;
    if !scalars.contains_key("completed") && !scalars.keys().any(|k| k.starts_with("mean_")) {
        return Err(err(
            "neither `request_count` nor a latency metric (`time_to_first_token`, \
             `request_latency`, ...): nothing to compare"
                .into(),
        ));
    }
    let mut sections: Vec<(String, Value)> = vec![
        ("aiperf.names".into(), NAMES.into()),
        ("aiperf.unavailable".into(), AGGREGATE_LIMITS.into()),
    ];
    if let Some(v) = obj.get("aiperf_version").and_then(Value::as_str) {
        sections.insert(0, ("aiperf.version".into(), v.into()));
    }
    Ok(Run {
        path: path.to_path_buf(),
        kind: Kind::AiperfAggregate,
        scalars,
        info: aggregate_info(&obj),
        requests: None,
        hists: BTreeMap::new(),
        trace: None,
        server_series: None,
        sections,
        selection: None,
    })
}

/// `{mean,median,std,min,max,pP}_X_ms` and `count_X` of the four latency families, in ms.
fn aggregate_latency(
    obj: &Map<String, Value>,
    scalars: &mut BTreeMap<String, f64>,
) -> Result<(), String> {
    for (tag, ours) in LATENCY {
        let Some(v) = obj.get(tag) else { continue };
        let m = v
            .as_object()
            .ok_or_else(|| format!("key `{tag}`: expected an object"))?;
        let unit = m.get("unit").and_then(Value::as_str).unwrap_or("");
        let per_ms = seconds_per(unit)
            .ok_or_else(|| format!("key `{tag}.unit`: is `{unit}`, expected ns, us, ms or sec"))?
            * 1e3;
        for (theirs, prefix) in STATS {
            match m.get(theirs) {
                None | Some(Value::Null) => {}
                Some(x) => {
                    let x = x
                        .as_f64()
                        .filter(|x| x.is_finite())
                        .ok_or_else(|| format!("key `{tag}.{theirs}`: expected a number"))?;
                    scalars.insert(format!("{prefix}_{ours}_ms"), x * per_ms);
                }
            }
        }
        if let Some(c) = m.get("count").and_then(Value::as_u64) {
            scalars.insert(format!("count_{ours}"), c as f64);
        }
    }
    Ok(())
}

/// `{tag: {avg: N}}` as a count: a non-negative integer.
fn count(obj: &Map<String, Value>, tag: &str) -> Result<Option<f64>, String> {
    let Some(v) = obj.get(tag) else {
        return Ok(None);
    };
    match v.get("avg").and_then(Value::as_f64) {
        Some(x) if x >= 0.0 && x.fract() == 0.0 && x < 2f64.powi(53) => Ok(Some(x)),
        _ => Err(format!(
            "key `{tag}.avg`: is {}, expected a non-negative integer",
            crate::trace::clip(&v.get("avg").unwrap_or(&Value::Null).to_string())
        )),
    }
}

/// Counts, duration and vLLM's throughputs (counts over first send → last response).
fn aggregate_counts(
    obj: &Map<String, Value>,
    scalars: &mut BTreeMap<String, f64>,
) -> Result<(), String> {
    let completed = count(obj, "request_count")?;
    // The server's own counts (`usage_*`) where the export holds them, else AIPerf's.
    let isl = count(obj, "total_usage_prompt_tokens")?.or(count(obj, "total_isl")?);
    let osl = count(obj, "total_usage_completion_tokens")?.or(count(obj, "total_osl")?);
    let good = count(obj, "good_request_count")?;
    if let Some(c) = completed {
        scalars.insert("completed".into(), c);
        let failed = count(obj, "error_request_count")?.unwrap_or(0.0);
        scalars.insert("failed".into(), failed);
        scalars.insert("num_prompts".into(), c + failed);
    }
    for (k, v) in [("total_input_tokens", isl), ("total_output_tokens", osl)] {
        if let Some(v) = v {
            scalars.insert(k.into(), v);
        }
    }
    let Some(d) = obj.get("benchmark_duration") else {
        return Ok(());
    };
    let unit = d.get("unit").and_then(Value::as_str).unwrap_or("");
    let duration = d
        .get("avg")
        .and_then(Value::as_f64)
        .zip(seconds_per(unit))
        .map(|(x, per)| x * per)
        .filter(|x| x.is_finite() && *x >= 0.0)
        .ok_or_else(|| {
            "key `benchmark_duration`: expected {avg, unit} with a non-negative time".to_string()
        })?;
    scalars.insert("duration".into(), duration);
    if duration > 0.0 {
        let per_s = |x: Option<f64>| x.map(|x| x / duration);
        let rates = [
            ("request_throughput", per_s(completed)),
            ("output_throughput", per_s(osl)),
            (
                "total_token_throughput",
                per_s(isl.zip(osl).map(|(a, b)| a + b)),
            ),
            ("request_goodput", per_s(good)),
        ];
        for (k, v) in rates {
            if let Some(v) = v {
                scalars.insert(k.into(), v);
            }
        }
    }
    // AIPerf's throughputs as it wrote them (over its own profiling span, not recomputed).
    for (tag, ours) in WRITTEN_RATES {
        if let Some(v) = rate(obj, tag)? {
            scalars.insert(ours.into(), v);
        }
    }
    Ok(())
}

/// AIPerf's throughput metrics and the vLLM keys they are.
const WRITTEN_RATES: [(&str, &str); 4] = [
    ("request_throughput", "request_throughput"),
    ("output_token_throughput", "output_throughput"),
    ("total_token_throughput", "total_token_throughput"),
    ("goodput", "request_goodput"),
];

/// `{tag: {avg: X}}` as a rate: a finite, non-negative number.
fn rate(obj: &Map<String, Value>, tag: &str) -> Result<Option<f64>, String> {
    let Some(v) = obj.get(tag) else {
        return Ok(None);
    };
    match v.get("avg").and_then(Value::as_f64) {
        Some(x) if x.is_finite() && x >= 0.0 => Ok(Some(x)),
        _ => Err(format!(
            "key `{tag}.avg`: is {}, expected a non-negative number",
            crate::trace::clip(&v.get("avg").unwrap_or(&Value::Null).to_string())
        )),
    }
}

/// Model, endpoint, target (credentials and query cut), date and validity.
fn aggregate_info(obj: &Map<String, Value>) -> BTreeMap<String, String> {
    let mut info = BTreeMap::new();
    let cfg = &obj.get("input_config").cloned().unwrap_or(Value::Null);
    let s = |v: &Value| v.as_str().map(str::to_string);
    let model =
        s(&cfg["models"]["items"][0]["name"]).or_else(|| s(&cfg["endpoint"]["model_names"][0]));
    let target = s(&cfg["endpoint"]["urls"][0]).map(|u| {
        let u = u.split(['?', '#']).next().unwrap_or("");
        crate::sys::userinfo::redact(u)
    });
    let date = obj.get("start_time").and_then(s);
    let endpoint = s(&cfg["endpoint"]["type"]);
    for (k, v) in [
        ("model_id", model),
        ("target", target),
        ("date", date),
        ("endpoint_type", endpoint),
    ] {
        if let Some(v) = v {
            info.insert(k.to_string(), crate::trace::clip(&v).into_owned());
        }
    }
    let reason = if obj.get("was_cancelled") == Some(&Value::Bool(true)) {
        Some("AIPerf: the run was cancelled".to_string())
    } else if obj.get("is_complete") == Some(&Value::Bool(false)) {
        Some(format!(
            "AIPerf: the run did not complete ({})",
            obj.get("incomplete_reason")
                .and_then(Value::as_str)
                .unwrap_or("no reason given")
        ))
    } else {
        None
    };
    if let Some(r) = reason {
        info.insert("valid".into(), "false".into());
        info.insert("invalid_reason".into(), crate::trace::clip(&r).into_owned());
    }
    info
}

/// `retrace merge` of AIPerf per-request exports: every record of every input, verbatim, in one
/// JSONL ordered by send time (AIPerf's wall-clock `request_start_ns`). Returns the file and its
/// record count. An aggregate is refused (percentiles of several runs cannot be combined), as is
/// a request (`x_request_id`) found twice.
pub(crate) fn merge_records(
    inputs: &[(PathBuf, Vec<u8>)],
) -> Result<(Vec<u8>, usize), AiperfError> {
    let refuse = |path: &Path, msg: String| AiperfError::Merge {
        path: path.display().to_string(),
        msg,
    };
    let mut lines: Vec<(u64, &[u8])> = Vec::new();
    let mut seen = HashMap::new();
    for (path, data) in inputs {
        match detect(data) {
            Some(ExportKind::Records) => {}
            Some(ExportKind::Aggregate) => {
                return Err(refuse(
                    path,
                    "an AIPerf aggregate (profile_export_aiperf.json) holds each run's \
                     percentiles, which cannot be combined into the merged run's: merge the \
                     runs' per-request profile_export.jsonl files instead"
                        .into(),
                ))
            }
            None => {
                return Err(refuse(
                    path,
                    "not an AIPerf per-request export: merge does not mix AIPerf exports with \
                     other inputs"
                        .into(),
                ))
            }
        }
        for l in records(path, data)? {
            check_once(&mut seen, path, &l)?;
            lines.push((l.rec.metadata.request_start_ns, l.raw));
        }
    }
    lines.sort_by_key(|l| l.0);
    let mut out = Vec::with_capacity(lines.iter().map(|l| l.1.len() + 1).sum());
    for (_, raw) in &lines {
        out.extend_from_slice(raw);
        out.push(b'\n');
    }
    Ok((out, lines.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::load::{load, Metric};

    fn fixture(p: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/aiperf")
            .join(p)
    }

    /// `data` written to a file whose name says nothing about its format.
    fn anon(dir: &tempfile::TempDir, data: &[u8]) -> PathBuf {
        let p = dir.path().join("export.dat");
        std::fs::write(&p, data).unwrap();
        p
    }

    fn stat(v: &[f64], s: &str) -> f64 {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        match s {
            "mean" => crate::metrics::np_mean(&v),
            "median" => crate::metrics::np_percentile_sorted(&v, 50.0),
            p => crate::metrics::np_percentile_sorted(&v, p[1..].parse().unwrap()),
        }
    }

    #[test]
    fn the_real_per_request_export_gives_aiperfs_own_aggregate_statistics() {
        let dir = tempfile::tempdir().unwrap();
        let recs = load(&anon(
            &dir,
            &std::fs::read(fixture("profile_export.jsonl")).unwrap(),
        ))
        .unwrap();
        let agg = load(&fixture("profile_export_aiperf.json")).unwrap();
        assert_eq!((recs.kind, agg.kind), (Kind::Aiperf, Kind::AiperfAggregate));
        let q = recs.requests.as_ref().unwrap();
        assert_eq!(q.len(), 13);
        assert!((0..13).all(|i| q.ok(i)));
        // sorted by send time, the first at 0
        assert_eq!(q.start_s[0], 0.0);
        assert!(q.start_s.windows(2).all(|w| w[0] <= w[1]));
        // AIPerf TTFT, ITL (our TPOT), ICL (our ITL) and request latency (our E2EL): our
        // statistics from its per-request values equal its aggregate's, key by key
        for m in [Metric::Ttft, Metric::Tpot, Metric::Itl, Metric::E2el] {
            let samples = recs.samples_ms(m).unwrap();
            for s in ["mean", "median", "p90", "p99"] {
                let key = format!("{s}_{}_ms", m.key());
                let want = agg.scalar(&key).unwrap();
                assert!(
                    (stat(&samples, s) - want).abs() < 1e-6,
                    "{key}: {} vs {want}",
                    stat(&samples, s)
                );
            }
        }
        assert_eq!(agg.scalar("count_itl"), Some(322.0));
        for k in ["completed", "failed"] {
            assert_eq!(recs.scalar(k), agg.scalar(k), "{k}");
        }
        // vLLM's duration (first send → last response), and throughputs over it from the
        // records; the aggregate's throughputs as AIPerf wrote them (over its profiling span)
        let (a, b) = (
            recs.scalar("duration").unwrap(),
            agg.scalar("duration").unwrap(),
        );
        assert!((a - b).abs() / b < 1e-6, "duration: {a} vs {b}");
        let rps = recs.scalar("request_throughput").unwrap();
        assert!((rps - 13.0 / a).abs() < 1e-9, "{rps}");
        for (k, written) in [
            ("request_throughput", 18.142682436600712),
            ("output_throughput", 467.52297048163376),
            ("total_token_throughput", 18410.63590027974),
        ] {
            assert_eq!(agg.scalar(k), Some(written), "{k}");
        }
        let osl: u64 = q.output_lens.iter().sum();
        assert_eq!(Some(osl as f64), agg.scalar("total_output_tokens"));
        let isl: u64 = q.input_lens.iter().sum();
        assert_eq!(Some(isl as f64), agg.scalar("total_input_tokens"));
        // the server's prompt count, as `usage` said
        assert!(q.server_input_lens.iter().all(Option::is_some));
        assert_eq!(
            agg.info.get("model_id").map(String::as_str),
            Some("mock-llama")
        );
        assert!(agg.requests.is_none() && agg.hists.is_empty());
        assert!(agg.sections.iter().any(|(k, _)| k == "aiperf.unavailable"));
    }

    #[test]
    fn errors_cancellations_warmup_and_non_streamed_requests_map_to_ours() {
        let line = |start: u64, phase: &str, metrics: &str, extra: &str| {
            format!(
                r#"{{"metadata":{{"x_request_id":"r{start}","request_start_ns":{start},"request_end_ns":{},"benchmark_phase":"{phase}"{extra}}},"metrics":{{{metrics}}}{}}}"#,
                start + 10_000_000,
                if extra.contains("err") {
                    r#","error":{"code":404,"type":"Not Found","message":"no model"}"#
                } else {
                    ""
                }
            )
        };
        let ok = r#""time_to_first_token":{"value":20.0,"unit":"ms"},"request_latency":{"value":30.0,"unit":"ms"},"output_sequence_length":{"value":3,"unit":"tokens"},"input_sequence_length":{"value":7,"unit":"tokens"},"inter_chunk_latency":{"value":[5.0,5.0],"unit":"ms"}"#;
        let whole = r#""request_latency":{"value":40000,"unit":"us"},"output_sequence_length":{"value":3,"unit":"tokens"}"#;
        let text = [
            line(3_000_000_000, "profiling", ok, ""),
            line(1_000_000_000, "profiling", "", r#","err":1"#),
            line(500_000_000, "warmup", ok, ""),
            line(2_000_000_000, "profiling", whole, ""),
            line(4_000_000_000, "profiling", "", r#","was_cancelled":true"#),
        ]
        .join("\n");
        let dir = tempfile::tempdir().unwrap();
        let r = load(&anon(&dir, text.as_bytes())).unwrap();
        let q = r.requests.as_ref().unwrap();
        assert_eq!(q.errors, ["http_404", "", "", "cancelled"]);
        assert_eq!(q.start_s, [0.0, 1.0, 2.0, 3.0]);
        // a non-streamed response: its whole body is its first content, as replay times one
        assert_eq!(q.ttft_s[1], Some(0.04));
        assert_eq!(q.itls_s[2], [0.005, 0.005]);
        assert_eq!((q.input_lens[2], q.output_lens[2]), (7, 3));
        assert_eq!(
            (r.scalar("completed"), r.scalar("failed")),
            (Some(2.0), Some(2.0))
        );
        assert_eq!(
            r.sections[1],
            ("aiperf.warmup_records_left_out".to_string(), 1.into())
        );
    }

    #[test]
    fn truncated_or_malformed_exports_are_errors_naming_file_and_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let jsonl = std::fs::read(fixture("profile_export.jsonl")).unwrap();
        let e = load(&anon(&dir, &jsonl[..jsonl.len() - 500]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("export.dat") && e.contains("line 13") && e.contains("truncated"),
            "{e}"
        );
        let agg = std::fs::read(fixture("profile_export_aiperf.json")).unwrap();
        let e = load(&anon(&dir, &agg[..agg.len() / 2]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("export.dat") && e.contains("AIPerf aggregate") && e.contains("truncated"),
            "{e}"
        );
        let cases = [
            (
                r#"{"metadata":{"benchmark_phase":"profiling"},"metrics":{}}"#,
                "request_start_ns",
            ),
            (
                r#"{"metadata":{"request_start_ns":1},"metrics":{"time_to_first_token":{"value":1,"unit":"hours"}}}"#,
                "unit `hours`",
            ),
            (
                r#"{"metadata":{"request_start_ns":1},"metrics":{"request_latency":{"value":-1,"unit":"ms"}}}"#,
                "request_latency",
            ),
            (
                r#"{"schema_version":"2.0","aiperf_version":"9.0"}"#,
                "schema_version",
            ),
            (
                r#"{"schema_version":"1.4","aiperf_version":"0.13.0"}"#,
                "request_count",
            ),
            (
                r#"{"aiperf_version":"0.13.0","request_count":{"unit":"requests","avg":-2}}"#,
                "request_count.avg",
            ),
        ];
        for (text, want) in cases {
            let e = load(&anon(&dir, text.as_bytes())).unwrap_err().to_string();
            assert!(e.contains("export.dat") && e.contains(want), "{text}: {e}");
        }
        // a foreign JSON object is none of the inputs, and says so
        let e = load(&anon(&dir, br#"{"hello": 1}"#))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("export.dat") && e.contains("AIPerf export"),
            "{e}"
        );
    }

    #[test]
    fn merge_of_per_request_exports_keeps_every_record_once_by_send_time() {
        let all = std::fs::read(fixture("profile_export.jsonl")).unwrap();
        let lines: Vec<&[u8]> = all
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        let half = |odd: usize| -> Vec<u8> {
            lines
                .iter()
                .skip(odd)
                .step_by(2)
                .flat_map(|l| [*l, b"\n"].concat())
                .collect()
        };
        let (a, b) = (PathBuf::from("a.jsonl"), PathBuf::from("b.jsonl"));
        let (out, n) = merge_records(&[(a.clone(), half(0)), (b.clone(), half(1))]).unwrap();
        assert_eq!(n, 13);
        let dir = tempfile::tempdir().unwrap();
        let merged = load(&anon(&dir, &out)).unwrap();
        let whole = load(&fixture("profile_export.jsonl")).unwrap();
        assert_eq!(merged.requests, whole.requests);
        let e = merge_records(&[(a.clone(), half(0)), (b.clone(), half(0))])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("b.jsonl") && e.contains("each request counts once"),
            "{e}"
        );
        let agg = std::fs::read(fixture("profile_export_aiperf.json")).unwrap();
        let e = merge_records(&[(a.clone(), half(0)), (b.clone(), agg)])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("b.jsonl") && e.contains("per-request profile_export.jsonl"),
            "{e}"
        );
        let e = merge_records(&[
            (a, half(0)),
            (b, b"{\"schema\": \"retrace.replay/1\"}".to_vec()),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("b.jsonl") && e.contains("not an AIPerf per-request export"),
            "{e}"
        );
    }

    proptest::proptest! {
        /// Any cut or corruption of the real exports is an export or an error, never a panic.
        #[test]
        fn damaged_exports_never_panic(cut in 0usize..40_000, at in 0usize..40_000, b in proptest::num::u8::ANY) {
            for name in ["profile_export.jsonl", "profile_export_aiperf.json"] {
                let mut data = std::fs::read(fixture(name)).unwrap();
                data.truncate(cut.max(1));
                if let Some(x) = data.get_mut(at) {
                    *x = b;
                }
                if let Some(f) = detect(&data) {
                    let _ = read(Path::new(name), &data, f);
                }
                let _ = merge_records(&[(PathBuf::from(name), data)]);
            }
        }
    }
}
