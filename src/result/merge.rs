//! `retrace merge`: several replay result files (`retrace.replay/1`, e.g. the shards of one
//! `--shard I/N` run) → one result file of the same schema, as one process would have written it.
//!
//! Rules (documented in `docs/scale-out.md`): HdrHistograms are added (lossless); counts, tokens and
//! `errors_by_kind` are summed; `duration` is the longest input's (shards run concurrently on one
//! timeline), throughputs are recomputed over it; per-request arrays (`--detailed`) are
//! concatenated and put in schedule order, by intended send time (index-aligned arrays stay
//! aligned, and the merged result pairs with one process's). Statistics: when every input is
//! detailed they are recomputed from the concatenated per-request samples with [`crate::metrics`]
//! (then they equal a single process's); otherwise the vLLM families (`ttft`, `tpot`, `itl`,
//! `e2el`) come from the merged histograms (3 significant digits) and the others are pooled
//! exactly where possible (count, mean, std, min, max) with medians/percentiles null; the output
//! then says `merged_from_histograms: true`. Inputs must agree on `trace`, `seed`, `speed`,
//! `endpoint_type`, `model_id` and `prompt_mode`. Each input is validated by
//! [`super::read`] (the one reader of result files, within [`super::bounds`]); counts
//! are summed exactly (a sum past 2^64 − 1 is refused), and the merged result passes the same
//! reader before it is returned. This module does not read or write files; it does not merge
//! vLLM's own result files.

use super::put_stats;
use super::read::{self, ReadError};
use super::Requests;
use crate::metrics::{percentile_label, Histograms, Stats};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Keys every input must share (a merge of different experiments is meaningless).
pub(crate) const SAME_KEYS: [&str; 6] = [
    "trace",
    "seed",
    "speed",
    "endpoint_type",
    "model_id",
    "prompt_mode",
];

/// Per-request arrays written by `--detailed` (the sidecar's list: every one is merged).
pub(crate) use crate::result::sidecar::ARRAYS as ARRAY_KEYS;

/// Integer counts that are summed.
const SUM_KEYS: [&str; 7] = [
    "num_prompts",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "inexact_prompts",
    "server_reported",
];

/// Statistics families written with min/max/count (ours); the vLLM four have no count key.
const OUR_FAMILIES: [&str; 7] = [
    "ttft_from_intended",
    "e2el_from_intended",
    "drift",
    "client_queue",
    "server_queue",
    "server_ttft",
    "unattributed",
];
/// The E2EL of requests answered whole (written only when a run had some).
const NON_STREAMED: &str = "non_streamed_e2el";
const VLLM_FAMILIES: [(&str, &str); 4] = [
    ("ttft", "ttft_us"),
    ("tpot", "tpot_us"),
    ("itl", "itl_us"),
    ("e2el", "e2el_us"),
];

/// A merge failure naming the file and the key.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MergeError {
    #[error("{path}: key `{key}`: {msg}")]
    Key {
        path: String,
        key: String,
        msg: String,
    },
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("merge needs at least one input")]
    Empty,
    #[error("{path}: given twice (the same as {earlier}): each input counts once")]
    Twice { path: String, earlier: String },
}

fn key_err(path: &std::path::Path, key: &str, msg: impl Into<String>) -> MergeError {
    MergeError::Key {
        path: path.display().to_string(),
        key: key.into(),
        msg: msg.into(),
    }
}

/// Merges result objects (`path` names each in errors).
pub(crate) fn merge(inputs: &[(PathBuf, Value)]) -> Result<Value, MergeError> {
    let reqs = check_inputs(inputs)?;
    let first = &inputs[0].1;
    let mut m: Map<String, Value> = first.as_object().cloned().unwrap_or_default();
    for k in ARRAY_KEYS
        .iter()
        .chain(&["shard", crate::result::sidecar::KEY])
    {
        m.remove(*k);
    }
    // The first input's non-streamed family, if any, is recomputed over all inputs below.
    m.retain(|k, _| !k.ends_with(NON_STREAMED) && !k.ends_with(&format!("{NON_STREAMED}_ms")));
    merge_totals(&mut m, inputs)?;
    merge_validity(&mut m, inputs);
    let hists = add_histograms(inputs)?;
    let percentiles = percentiles_of(first);
    match reqs.into_iter().collect::<Option<Vec<Requests>>>() {
        Some(reqs) => merge_detailed(&mut m, inputs, &reqs, &percentiles)?,
        None => {
            for (fam, hname) in VLLM_FAMILIES {
                if let Some(h) = hists.get(hname) {
                    put_hist_stats(&mut m, fam, h, &percentiles);
                }
            }
            for fam in OUR_FAMILIES {
                pool_stats(&mut m, fam, inputs, &percentiles);
            }
            let count = format!("count_{NON_STREAMED}");
            if inputs.iter().any(|(_, v)| v.get(&count).is_some()) {
                pool_stats(&mut m, NON_STREAMED, inputs, &percentiles);
            }
            m.insert("merged_from_histograms".into(), json!(true));
        }
    }
    let encoded = Histograms { by_name: hists }.encode();
    m.insert("histograms".into(), json!(encoded));
    m.insert(
        "merged_from".into(),
        json!(inputs
            .iter()
            .map(|(p, _)| p.display().to_string())
            .collect::<Vec<_>>()),
    );
    match merge_sessions(inputs)? {
        Some(v) => m.insert("sessions".into(), v),
        None => m.remove("sessions"),
    };
    m.retain(|k, _| !k.starts_with("probe_"));
    match merge_probes(inputs)? {
        Some(v) => {
            m.extend(crate::result::vllm_probe_keys(&v));
            m.insert("probes".into(), v)
        }
        None => m.remove("probes"),
    };
    // Every shard scraped the same server, whose counters saw all shards' traffic: not additive,
    // and one shard's view is not the merged run's. Read them in the shard files.
    m.remove("server_metrics");
    let merged = Value::Object(m);
    // What the readers would refuse is never written.
    read::from_value(std::path::Path::new("the merged result"), &merged)?;
    Ok(merged)
}

/// How far apart on the wall clock runs may seem and still be taken as run together: `date`
/// has whole seconds and is written once the run has ended (its last scrape and probes too).
const APART_SLACK_S: f64 = 5.0;

/// An input's run on the wall clock, s since the epoch: from `date` (UTC, written as the run
/// ended) less its `duration`, to `date`.
fn wall_span(v: &Value) -> Option<(f64, f64)> {
    let date = v.get("date")?.as_str()?;
    let end = chrono::NaiveDateTime::parse_from_str(date, "%Y%m%d-%H%M%S").ok()?;
    let end = end.and_utc().timestamp() as f64;
    Some((end - v.get("duration")?.as_f64()?, end))
}

/// A warning when the inputs did not all run at the same time: one ended before another
/// started (shards run one after another never loaded the server together).
pub(crate) fn apart(inputs: &[(PathBuf, Value)]) -> Option<String> {
    let spans: Vec<(&PathBuf, (f64, f64))> = inputs
        .iter()
        .filter_map(|(p, v)| Some((p, wall_span(v)?)))
        .collect();
    let (ended, (_, first_end)) = spans.iter().min_by(|a, b| a.1 .1.total_cmp(&b.1 .1))?;
    let (started, (last_start, _)) = spans.iter().max_by(|a, b| a.1 .0.total_cmp(&b.1 .0))?;
    let gap = last_start - first_end;
    (gap > APART_SLACK_S).then(|| {
        format!(
            "the inputs did not run at the same time: {} ended about {gap:.0} s before {} started, so the server never had their load together and the merged latencies, throughputs and peaks are not one run's (start shards together with replay --start-at)",
            ended.display(),
            started.display()
        )
    })
}

/// Checks that the inputs are replay results of one run (schema, the keys that must agree,
/// histograms, each shard once); each one's per-request arrays, when it has them.
fn check_inputs(inputs: &[(PathBuf, Value)]) -> Result<Vec<Option<Requests>>, MergeError> {
    let Some((first_path, first)) = inputs.first() else {
        return Err(MergeError::Empty);
    };
    let mut reqs = Vec::new();
    for (path, v) in inputs {
        let schema = v.get("schema").and_then(Value::as_str);
        if schema != Some(crate::result::SCHEMA) {
            return Err(key_err(
                path,
                "schema",
                format!(
                    "is {}, merge reads only {} (retrace replay --result-json)",
                    schema.map_or_else(|| "missing".to_string(), |s| format!("`{s}`")),
                    crate::result::SCHEMA
                ),
            ));
        }
        for k in SAME_KEYS {
            if v.get(k) != first.get(k) {
                return Err(key_err(
                    path,
                    k,
                    format!(
                        "is {} but {} has {}: not shards of the same replay",
                        v.get(k).unwrap_or(&Value::Null),
                        first_path.display(),
                        first.get(k).unwrap_or(&Value::Null)
                    ),
                ));
            }
        }
        if !v.get("histograms").is_some_and(Value::is_object) {
            return Err(key_err(path, "histograms", "missing or not an object"));
        }
        let file = read::from_value(path, v)?;
        reqs.push(file.and_then(|f| f.columns.as_ref().map(Requests::from_columns)));
    }
    check_distinct_shards(inputs)?;
    Ok(reqs)
}

/// The counts and token totals summed, the duration (the longest shard's), the throughputs
/// over it, goodput, and the peaks (summed: an upper bound).
fn merge_totals(m: &mut Map<String, Value>, inputs: &[(PathBuf, Value)]) -> Result<(), MergeError> {
    let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64);
    for k in SUM_KEYS {
        let total = sum_counts(inputs, k, |v| v.get(k))?;
        m.insert(k.into(), json!(total));
    }
    let mut duration = 0.0f64;
    for (path, v) in inputs {
        let d = num(v, "duration").ok_or_else(|| key_err(path, "duration", "expected a number"))?;
        duration = duration.max(d);
    }
    m.insert("duration".into(), json!(duration));
    let per_s = |x: f64| if duration > 0.0 { x / duration } else { 0.0 };
    let get_u = |k: &str| m.get(k).and_then(Value::as_u64).unwrap_or(0) as f64;
    let (completed, tin, tout) = (
        get_u("completed"),
        get_u("total_input_tokens"),
        get_u("total_output_tokens"),
    );
    m.insert("request_throughput".into(), json!(per_s(completed)));
    m.insert("output_throughput".into(), json!(per_s(tout)));
    m.insert("total_token_throughput".into(), json!(per_s(tin + tout)));
    // goodput: good requests = goodput × own duration (an integer written as a rate)
    let goodput = inputs
        .iter()
        .map(|(_, v)| Some((num(v, "request_goodput")? * num(v, "duration")?).round()))
        .sum::<Option<f64>>();
    m.insert("request_goodput".into(), json!(goodput.map(per_s)));
    // peaks of shards need not coincide: the sum is an upper bound (kept only when every input
    // has the key)
    for k in [
        "max_concurrent_requests",
        "peak_in_flight",
        "max_output_tokens_per_s",
    ] {
        let float = k == "max_output_tokens_per_s";
        let peak = inputs.iter().map(|(_, v)| num(v, k)).sum::<Option<f64>>();
        match peak {
            Some(p) if float => m.insert(k.into(), json!(p)),
            Some(p) => m.insert(k.into(), json!(p as u64)),
            None => m.remove(k),
        };
    }
    let errors = sum_by_kind(inputs, "errors_by_kind", |v| v.get("errors_by_kind"))?;
    m.insert("errors_by_kind".into(), json!(errors));
    Ok(())
}

/// The `{kind: count}` objects `get` gives of each input (`key` names them) summed kind by kind,
/// as [`sum_counts`].
fn sum_by_kind(
    inputs: &[(PathBuf, Value)],
    key: &str,
    get: impl Fn(&Value) -> Option<&Value>,
) -> Result<BTreeMap<String, u64>, MergeError> {
    let kinds: std::collections::BTreeSet<&String> = inputs
        .iter()
        .filter_map(|(_, v)| get(v)?.as_object())
        .flat_map(|e| e.keys())
        .collect();
    let mut out = BTreeMap::new();
    for kind in kinds {
        let total = sum_counts(inputs, &format!("{key}.{kind}"), |v| get(v)?.get(kind))?;
        out.insert(kind.clone(), total);
    }
    Ok(out)
}

/// The sum of the count `get` gives of each input (`key` names it): each a non-negative integer,
/// the sum refused where it would pass 2^64 − 1 (never wrapped or saturated).
fn sum_counts(
    inputs: &[(PathBuf, Value)],
    key: &str,
    get: impl Fn(&Value) -> Option<&Value>,
) -> Result<u64, MergeError> {
    let mut total = 0u64;
    for (path, v) in inputs {
        let Some(x) = get(v) else { continue };
        let c = x
            .as_u64()
            .ok_or_else(|| key_err(path, key, "expected a non-negative integer"))?;
        total = total.checked_add(c).ok_or_else(|| {
            key_err(
                path,
                key,
                format!("is {c}: the inputs' sum would pass 2^64 - 1"),
            )
        })?;
    }
    Ok(total)
}

/// Valid when every shard is; the invalid ones' reasons, each naming its file.
fn merge_validity(m: &mut Map<String, Value>, inputs: &[(PathBuf, Value)]) {
    let missing = missing_shards(inputs);
    let valid = missing.is_none()
        && inputs
            .iter()
            .all(|(_, v)| v.get("valid").and_then(Value::as_bool) != Some(false));
    m.insert("valid".into(), json!(valid));
    let mut reasons: Vec<String> = inputs
        .iter()
        .filter_map(|(p, v)| {
            let r = v.get("invalid_reason")?.as_str()?;
            Some(format!("{}: {r}", p.display()))
        })
        .collect();
    reasons.extend(missing);
    m.insert(
        "invalid_reason".into(),
        if reasons.is_empty() {
            Value::Null
        } else {
            json!(reasons.join("; "))
        },
    );
}

/// Why the inputs do not make a whole split, if they do not: shards (`shard: "I/N"`) given
/// that do not cover 0..N−1 (each is given once: [`check_distinct_shards`]).
fn missing_shards(inputs: &[(PathBuf, Value)]) -> Option<String> {
    let shards: Vec<(u32, u32)> = inputs
        .iter()
        .filter_map(|(_, v)| crate::trace::shape::parse_shard(v.get("shard")?.as_str()?).ok())
        .collect();
    let &(_, n) = shards.first()?;
    let given = shards.iter().filter(|s| s.1 == n).count() as u64;
    (given < u64::from(n)).then(|| {
        format!("the merge holds {given} of {n} shards: not the whole run (give every shard I/{n})")
    })
}

/// The inputs' histograms added, name by name (lossless).
fn add_histograms(
    inputs: &[(PathBuf, Value)],
) -> Result<BTreeMap<String, hdrhistogram::Histogram<u64>>, MergeError> {
    let mut hists: BTreeMap<String, hdrhistogram::Histogram<u64>> = BTreeMap::new();
    for (path, v) in inputs {
        let Some(Value::Object(h)) = v.get("histograms") else {
            continue;
        };
        for (name, b64) in h {
            let key = format!("histograms.{name}");
            let s = b64
                .as_str()
                .ok_or_else(|| key_err(path, &key, "expected a string"))?;
            let h = Histograms::decode(s).map_err(|e| key_err(path, &key, e))?;
            match hists.get_mut(name) {
                Some(acc) => acc
                    .add(&h)
                    .map_err(|e| key_err(path, &key, format!("cannot add: {e:?}")))?,
                None => {
                    hists.insert(name.clone(), h);
                }
            }
        }
    }
    Ok(hists)
}

/// Every input detailed: the statistics computed from all requests, exactly, and the
/// per-request arrays concatenated in schedule order.
fn merge_detailed(
    m: &mut Map<String, Value>,
    inputs: &[(PathBuf, Value)],
    reqs: &[Requests],
    percentiles: &[f64],
) -> Result<(), MergeError> {
    let mut all = Requests::default();
    let mut drifts = Vec::new();
    for ((_, v), r) in inputs.iter().zip(reqs) {
        concat(&mut all, r);
        // `drifts` (all requests) is not part of load::Requests
        let d = v.get("drifts").and_then(Value::as_array);
        drifts.extend((0..r.len()).map(|i| d.and_then(|d| d.get(i)).and_then(Value::as_f64)));
    }
    for (fam, s) in stats_from_requests(&all, &drifts, percentiles) {
        put_stats(m, fam, &s, !VLLM_FAMILIES.iter().any(|(f, _)| *f == fam));
    }
    let order = schedule_order(inputs, all.len());
    for k in ARRAY_KEYS {
        if inputs.iter().all(|(_, v)| v.get(k).is_none()) {
            continue;
        }
        let mut out = Vec::new();
        for (path, v) in inputs {
            match v.get(k) {
                Some(Value::Array(a)) => out.extend(a.iter().cloned()),
                Some(_) => return Err(key_err(path, k, "expected an array")),
                None => {
                    let n = v["ttfts"].as_array().map_or(0, Vec::len);
                    out.extend(std::iter::repeat_n(Value::Null, n));
                }
            }
        }
        if out.len() != order.len() {
            let msg = format!(
                "the inputs hold {} elements of {} requests: the arrays cannot be merged whole",
                out.len(),
                order.len()
            );
            return Err(key_err(&inputs[0].0, k, msg));
        }
        out = order.iter().map(|&i| out[i].take()).collect();
        m.insert(k.into(), Value::Array(out));
    }
    m.insert("merged_from_histograms".into(), json!(false));
    Ok(())
}

/// Each input once: no result given twice, shards (`shard: "I/N"`) of one count with distinct
/// indexes.
fn check_distinct_shards(inputs: &[(PathBuf, Value)]) -> Result<(), MergeError> {
    let shard = |v: &Value| {
        let s = v.get("shard")?.as_str()?;
        let (i, n) = s.split_once('/')?;
        Some((s.to_string(), i.to_string(), n.to_string()))
    };
    for (k, (path, v)) in inputs.iter().enumerate() {
        for (earlier, u) in &inputs[..k] {
            let earlier = earlier.display();
            if v == u {
                let (path, earlier) = (path.display().to_string(), earlier.to_string());
                return Err(MergeError::Twice { path, earlier });
            }
            let msg = match (shard(v), shard(u)) {
                (Some((s, _, n)), Some((t, _, m))) if n != m => {
                    format!("is shard {s} but {earlier} is shard {t}: not shards of one split")
                }
                (Some((s, i, _)), Some((_, j, _))) if i == j => {
                    format!("is shard {s}, already given as {earlier}")
                }
                _ => continue,
            };
            return Err(key_err(path, "shard", msg));
        }
    }
    Ok(())
}

/// `--sessions` reports of shards (sessions are kept whole by `--shard`): counts summed, the drift
/// distribution pooled exactly where it can be (count, mean, std, min, max); median and
/// percentiles null (`pooled: true`). `None` when no input has one.
fn merge_sessions(inputs: &[(PathBuf, Value)]) -> Result<Option<Value>, MergeError> {
    let all: Vec<&Value> = inputs
        .iter()
        .filter_map(|(_, v)| v.get("sessions"))
        .collect();
    if all.is_empty() {
        return Ok(None);
    }
    let mut m = Map::new();
    for k in [
        "sessions",
        "turns",
        "dependent_turns",
        "released_after_failure",
    ] {
        let total = sum_counts(inputs, &format!("sessions.{k}"), |v| {
            v.get("sessions")?.get(k)
        })?;
        m.insert(k.into(), json!(total));
    }
    let drifts: Vec<&Value> = all.iter().map(|v| &v["drift"]).collect();
    m.insert("drift".into(), pool_dist(&drifts));
    Ok(Some(Value::Object(m)))
}

/// `--probe-request-rate` reports of shards: each shard sent its own probes, so rates and counts
/// add; `ttft`, `e2el`, `drift` pooled like [`pool_dist`]. `None` when no input has one.
fn merge_probes(inputs: &[(PathBuf, Value)]) -> Result<Option<Value>, MergeError> {
    let all: Vec<&Value> = inputs.iter().filter_map(|(_, v)| v.get("probes")).collect();
    let Some(first) = all.first() else {
        return Ok(None);
    };
    let mut m = Map::new();
    m.insert("prompt_tokens".into(), first["prompt_tokens"].clone());
    let rate: f64 = all.iter().filter_map(|v| v["rate"].as_f64()).sum();
    m.insert("rate".into(), json!(rate));
    for k in ["sent", "completed", "failed"] {
        let total = sum_counts(inputs, &format!("probes.{k}"), |v| v.get("probes")?.get(k))?;
        m.insert(k.into(), json!(total));
    }
    let errors = sum_by_kind(inputs, "probes.errors_by_kind", |v| {
        v.get("probes")?.get("errors_by_kind")
    })?;
    m.insert("errors_by_kind".into(), json!(errors));
    for k in ["ttft", "e2el", "drift"] {
        let d: Vec<&Value> = all.iter().map(|v| &v[k]).collect();
        m.insert(k.into(), pool_dist(&d));
    }
    Ok(Some(Value::Object(m)))
}

/// Pools `{count, mean_ms, std_ms, min_ms, max_ms, median_ms, pP_ms}` distributions exactly
/// where possible (count, mean, population std, min, max); median and percentiles become null,
/// and `pooled: true` says so.
fn pool_dist(ds: &[&Value]) -> Value {
    let (mut n, mut sum, mut sq) = (0.0f64, 0.0f64, 0.0f64);
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    let mut keys: Vec<String> = Vec::new();
    for d in ds {
        let g = |k: &str| d.get(k).and_then(Value::as_f64);
        for k in d.as_object().into_iter().flat_map(|o| o.keys()) {
            if !keys.contains(k) {
                keys.push(k.clone());
            }
        }
        let c = g("count").unwrap_or(0.0);
        if c == 0.0 {
            continue;
        }
        let (mean, std) = (g("mean_ms").unwrap_or(0.0), g("std_ms").unwrap_or(0.0));
        n += c;
        sum += c * mean;
        sq += c * (std * std + mean * mean);
        lo = lo.min(g("min_ms").unwrap_or(lo));
        hi = hi.max(g("max_ms").unwrap_or(hi));
    }
    let mut d = Map::new();
    for k in keys {
        d.insert(k, Value::Null); // medians and percentiles cannot be pooled
    }
    let mean = if n > 0.0 { sum / n } else { 0.0 };
    d.insert("count".into(), json!(n as u64));
    d.insert("mean_ms".into(), json!(mean));
    d.insert(
        "std_ms".into(),
        json!(if n > 0.0 {
            (sq / n - mean * mean).max(0.0).sqrt()
        } else {
            0.0
        }),
    );
    d.insert("min_ms".into(), json!(if n > 0.0 { lo } else { 0.0 }));
    d.insert("max_ms".into(), json!(if n > 0.0 { hi } else { 0.0 }));
    d.insert("pooled".into(), json!(true));
    Value::Object(d)
}

/// The `--percentiles` of a result, read back from its `pP_ttft_ms` keys.
fn percentiles_of(v: &Value) -> Vec<f64> {
    let mut p: Vec<f64> = v
        .as_object()
        .into_iter()
        .flat_map(|o| o.keys())
        .filter_map(|k| k.strip_prefix('p')?.strip_suffix("_ttft_ms")?.parse().ok())
        .collect();
    p.sort_by(f64::total_cmp);
    p
}

/// The merged requests in schedule order: by intended send time as each input wrote it (shards
/// of one run share t0), input order among equal times; one process's arrays are in schedule
/// order, so a merged result pairs with it. Input order when some input lacks the times.
fn schedule_order(inputs: &[(PathBuf, Value)], n: usize) -> Vec<usize> {
    let intended: Vec<Option<f64>> = inputs
        .iter()
        .flat_map(
            |(_, v)| match v.get("intended_times").and_then(Value::as_array) {
                Some(a) => a.iter().map(Value::as_f64).collect(),
                None => vec![None; v["ttfts"].as_array().map_or(0, Vec::len)],
            },
        )
        .collect();
    let mut order: Vec<usize> = (0..n).collect();
    if let Some(t) = intended.into_iter().collect::<Option<Vec<f64>>>() {
        if t.len() == n {
            order.sort_by(|&a, &b| t[a].total_cmp(&t[b]));
        }
    }
    order
}

fn concat(all: &mut Requests, r: &Requests) {
    all.input_lens.extend(&r.input_lens);
    all.output_lens.extend(&r.output_lens);
    all.start_s.extend(&r.start_s);
    let intended = r.intended_s.clone().unwrap_or_else(|| vec![0.0; r.len()]);
    all.intended_s.get_or_insert_with(Vec::new).extend(intended);
    all.ttft_s.extend(&r.ttft_s);
    all.latency_s.extend(&r.latency_s);
    all.itls_s.extend(r.itls_s.iter().cloned());
    all.errors.extend(r.errors.iter().cloned());
    all.client_queue_s.extend(&r.client_queue_s);
    all.server_queue_s.extend(&r.server_queue_s);
    all.server_ttft_s.extend(&r.server_ttft_s);
    all.server_input_lens.extend(&r.server_input_lens);
}

/// Every statistics family from per-request data, with [`crate::metrics::summarize`]'s rules
/// (seconds in, vLLM's arithmetic).
fn stats_from_requests(
    r: &Requests,
    drifts: &[Option<f64>],
    p: &[f64],
) -> Vec<(&'static str, Stats)> {
    let mut f: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    let intended = r.intended_s.as_deref().unwrap_or(&[]);
    for i in 0..r.len() {
        if let Some(q) = r.client_queue_s[i] {
            f.entry("client_queue").or_default().push(q);
        }
        if let Some(d) = drifts.get(i).copied().flatten() {
            f.entry("drift").or_default().push(d);
        }
        if !r.ok(i) {
            continue;
        }
        if r.non_streamed.get(i).copied().unwrap_or(false) {
            // As the run's own statistics: E2EL apart, the server's times kept.
            f.entry(NON_STREAMED).or_default().extend(r.latency_s[i]);
            f.entry("server_queue")
                .or_default()
                .extend(r.server_queue_s[i]);
            f.entry("server_ttft")
                .or_default()
                .extend(r.server_ttft_s[i]);
            continue;
        }
        let t = r.ttft_s[i].unwrap_or(0.0);
        f.entry("ttft").or_default().push(t);
        let from_int =
            |x: f64| (r.start_s[i] + x - intended.get(i).copied().unwrap_or(0.0)).max(0.0);
        f.entry("ttft_from_intended").or_default().push(from_int(t));
        if let Some(l) = r.latency_s[i] {
            f.entry("e2el").or_default().push(l);
            f.entry("e2el_from_intended").or_default().push(from_int(l));
            if r.output_lens[i] > 1 {
                f.entry("tpot")
                    .or_default()
                    .push((l - t) / (r.output_lens[i] - 1) as f64);
            }
        }
        f.entry("itl").or_default().extend(&r.itls_s[i]);
        let (q, s) = (r.server_queue_s[i], r.server_ttft_s[i]);
        if let Some(q) = q {
            f.entry("server_queue").or_default().push(q);
        }
        if let Some(s) = s {
            f.entry("server_ttft").or_default().push(s);
        }
        if let Some(s) = s {
            let u = crate::metrics::unattributed(t, q, s);
            f.entry("unattributed").or_default().push(u);
        }
    }
    let whole = f.contains_key(NON_STREAMED).then_some(NON_STREAMED);
    VLLM_FAMILIES
        .iter()
        .map(|(n, _)| *n)
        .chain(OUR_FAMILIES)
        .chain(whole)
        .map(|n| {
            (
                n,
                Stats::from_seconds(f.get(n).map_or(&[][..], Vec::as_slice), p),
            )
        })
        .collect()
}

/// vLLM family statistics from a merged µs histogram (3 significant digits).
fn put_hist_stats(
    m: &mut Map<String, Value>,
    name: &str,
    h: &hdrhistogram::Histogram<u64>,
    p: &[f64],
) {
    put_stats(m, name, &Stats::from_histogram(h, 1000.0, p), false);
}

/// Our families without per-request data: count, mean, population std, min and max pool exactly
/// from each input's; median and percentiles cannot (null).
fn pool_stats(m: &mut Map<String, Value>, name: &str, inputs: &[(PathBuf, Value)], p: &[f64]) {
    let (mut n, mut sum, mut sq) = (0.0f64, 0.0f64, 0.0f64);
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for (_, v) in inputs {
        let g = |k: String| v.get(&k).and_then(Value::as_f64);
        let Some(c) = g(format!("count_{name}")) else {
            continue;
        };
        if c == 0.0 {
            continue;
        }
        let mean = g(format!("mean_{name}_ms")).unwrap_or(0.0);
        let std = g(format!("std_{name}_ms")).unwrap_or(0.0);
        n += c;
        sum += c * mean;
        sq += c * (std * std + mean * mean);
        lo = lo.min(g(format!("min_{name}_ms")).unwrap_or(lo));
        hi = hi.max(g(format!("max_{name}_ms")).unwrap_or(hi));
    }
    let (mean, std) = if n > 0.0 {
        let mean = sum / n;
        (mean, (sq / n - mean * mean).max(0.0).sqrt())
    } else {
        (0.0, 0.0)
    };
    m.insert(format!("mean_{name}_ms"), json!(mean));
    m.insert(format!("std_{name}_ms"), json!(std));
    m.insert(format!("median_{name}_ms"), Value::Null);
    for pp in p {
        m.insert(format!("p{}_{name}_ms", percentile_label(*pp)), Value::Null);
    }
    m.insert(
        format!("min_{name}_ms"),
        json!(if n > 0.0 { lo } else { 0.0 }),
    );
    m.insert(
        format!("max_{name}_ms"),
        json!(if n > 0.0 { hi } else { 0.0 }),
    );
    m.insert(format!("count_{name}"), json!(n as u64));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{summarize, Sample, Scalars};
    use crate::result::build;

    const MS: u64 = 1_000_000;

    fn sample(i: u64, ok: bool) -> Sample {
        Sample {
            scalars: Scalars {
                input_tokens: 100 + i,
                output_tokens: if ok { 3 + i % 4 } else { 0 },
                intended_ns: i * 7 * MS,
                dispatched_ns: i * 7 * MS + 30_000 * (i % 3),
                sent_ns: i * 7 * MS + 50_000 * (i % 3),
                ttft_ns: ok.then_some((20 + i * 3 % 17) * MS + i * 1013),
                e2el_ns: ok.then_some((60 + i * 5 % 23) * MS + i * 7001),
                end_ns: i * 7 * MS + 90 * MS,
                error: (!ok).then_some(crate::metrics::Failure::Http(500)),
                server: crate::metrics::ServerTimes {
                    queue_ms: ok.then_some(1.0 + i as f64 / 8.0),
                    ttft_ms: ok.then_some(10.0 + i as f64 / 4.0),
                    prompt_tokens: None,
                    cached_tokens: None,
                },
                ..Default::default()
            },
            itls_ns: if ok {
                (0..(2 + i % 4))
                    .map(|k| (5 + k + i % 5) * MS + k * 333)
                    .collect()
            } else {
                Vec::new()
            },
            ..Default::default()
        }
    }

    fn result(samples: &[Sample], detailed: bool, duration: f64) -> Value {
        let info = crate::result::tests::info();
        let sum = summarize(samples, duration, &[50.0, 99.0]);
        build(
            &info,
            &sum,
            &Histograms::from_samples(samples),
            samples,
            detailed,
        )
    }

    fn all() -> Vec<Sample> {
        (0..30).map(|i| sample(i, i % 7 != 3)).collect()
    }

    fn shards(detailed: bool) -> Vec<(PathBuf, Value)> {
        let s = all();
        (0..3)
            .map(|k| {
                let part: Vec<Sample> = s.iter().skip(k).step_by(3).cloned().collect();
                (
                    PathBuf::from(format!("shard-{k}.json")),
                    result(&part, detailed, 1.0 + k as f64),
                )
            })
            .collect()
    }

    /// Shards whose runs overlap on the wall clock (within the slack of `date`'s whole seconds)
    /// merge quietly; one that ended before another started is named in a warning.
    #[test]
    fn inputs_that_did_not_run_together_are_named() {
        let mut inputs = shards(false);
        // Durations 1, 2 and 3 s; all ended within seconds of one another.
        for (k, d) in ["20260101-000000", "20260101-000002", "20260101-000004"]
            .iter()
            .enumerate()
        {
            inputs[k].1["date"] = json!(d);
        }
        assert_eq!(apart(&inputs), None);
        // The third ran a minute later (from 00:00:57 to 00:01:00).
        inputs[2].1["date"] = json!("20260101-000100");
        let w = apart(&inputs).unwrap();
        assert!(
            w.contains("shard-0.json ended about 57 s before shard-2.json started"),
            "{w}"
        );
        assert!(w.contains("--start-at"), "{w}");
        // Without a readable date nothing is claimed.
        inputs[2].1["date"] = json!("soon");
        assert_eq!(apart(&inputs), None);
    }

    /// Shards that do not cover 0..N−1 merge into an invalid result saying so.
    #[test]
    fn a_merge_of_some_shards_only_is_not_a_valid_whole_run() {
        let mut inputs = shards(false);
        for (k, (_, v)) in inputs.iter_mut().enumerate() {
            v["shard"] = json!(format!("{k}/3"));
        }
        let whole = merge(&inputs).unwrap();
        assert_eq!(
            (whole["valid"].clone(), whole["invalid_reason"].clone()),
            (json!(true), Value::Null)
        );
        inputs.remove(1);
        let part = merge(&inputs).unwrap();
        assert_eq!(part["valid"], json!(false));
        let why = part["invalid_reason"].as_str().unwrap();
        assert!(why.contains("2 of 3 shards"), "{why}");
    }

    /// The histograms every result file has.
    const HISTOGRAMS: [&str; 6] = [
        "ttft_us",
        "tpot_us",
        "itl_us",
        "e2el_us",
        "drift_abs_ns",
        "client_queue_ns",
    ];

    fn hist_len(v: &Value, name: &str) -> u64 {
        Histograms::decode(v["histograms"][name].as_str().unwrap())
            .unwrap()
            .len()
    }

    /// Detailed shards merged give exactly the statistics of one process over all samples (the
    /// order of samples does not change sorted percentiles; means may differ in the last bits).
    #[test]
    fn recorded_errors_stay_aligned_with_the_other_arrays_after_a_merge() {
        let mut inputs = shards(true);
        for (_, v) in &mut inputs {
            let labels: Vec<Value> = v["input_lens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| json!(format!("len {n}")))
                .collect();
            v["recorded_errors"] = Value::Array(labels);
        }
        let merged = merge(&inputs).unwrap();
        let (lens, errs) = (
            merged["input_lens"].as_array().unwrap(),
            &merged["recorded_errors"],
        );
        assert_eq!(errs.as_array().map(Vec::len), Some(30));
        for (n, e) in lens.iter().zip(errs.as_array().unwrap()) {
            assert_eq!(e, &json!(format!("len {n}")));
        }
        assert!(
            merged.get("server_cached_tokens").is_none(),
            "no input had it"
        );
    }

    #[test]
    fn detailed_merge_equals_one_process() {
        let merged = merge(&shards(true)).unwrap();
        let whole = result(&all(), true, 3.0);
        for k in [
            "completed",
            "failed",
            "total_input_tokens",
            "total_output_tokens",
        ] {
            assert_eq!(merged[k], whole[k], "{k}");
        }
        assert_eq!(merged["duration"], json!(3.0), "longest shard");
        assert_eq!(merged["errors_by_kind"], whole["errors_by_kind"]);
        assert_eq!(merged["merged_from_histograms"], json!(false));
        for fam in [
            "ttft",
            "tpot",
            "itl",
            "e2el",
            "ttft_from_intended",
            "drift",
            "client_queue",
            "server_queue",
            "server_ttft",
            "unattributed",
        ] {
            for stat in ["mean", "median", "std", "p50", "p99"] {
                let k = format!("{stat}_{fam}_ms");
                let (a, b) = (merged[&k].as_f64().unwrap(), whole[&k].as_f64().unwrap());
                assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{k}: {a} vs {b}");
            }
        }
        for k in [
            "request_throughput",
            "output_throughput",
            "total_token_throughput",
        ] {
            assert!(
                (merged[k].as_f64().unwrap() - whole[k].as_f64().unwrap()).abs() < 1e-9,
                "{k}"
            );
        }
        // the per-request arrays in schedule order, as one process's: pairable with it
        for k in ARRAY_KEYS {
            assert_eq!(merged[k], whole[k], "{k}");
        }
        let load = |v: &Value| crate::report::load::from_value("x.json".as_ref(), v).unwrap();
        let p = crate::report::compare::paired_ttft(&load(&whole), &load(&merged)).unwrap();
        assert!((p.geo_mean_ratio - 1.0).abs() < 1e-12);
        for name in HISTOGRAMS {
            assert_eq!(hist_len(&merged, name), hist_len(&whole, name), "{name}");
        }
    }

    /// Shards' `--sessions` reports: counts summed, drift pooled exactly (count, mean, std, min,
    /// max), percentiles null; without any, no `sessions` key.
    #[test]
    fn session_reports_are_summed_and_pooled() {
        use crate::replay::plan::turns::SessionReport;
        let drifts = [vec![0.010, 0.020], vec![0.030, 0.050, 0.040]];
        let mut inputs = shards(false);
        assert!(merge(&inputs).unwrap().get("sessions").is_none());
        for (k, (_, v)) in inputs.iter_mut().take(2).enumerate() {
            let r = SessionReport {
                sessions: 1 + k,
                turns: 3 + k,
                dependent_turns: drifts[k].len(),
                released_after_failure: k,
                drift: Stats::from_seconds(&drifts[k], &[50.0, 99.0]),
            };
            v["sessions"] = r.to_json();
        }
        let m = merge(&inputs).unwrap();
        let s = &m["sessions"];
        assert_eq!(s["sessions"], 3);
        assert_eq!(s["turns"], 7);
        assert_eq!(s["dependent_turns"], 5);
        assert_eq!(s["released_after_failure"], 1);
        let all: Vec<f64> = drifts.concat();
        let whole = Stats::from_seconds(&all, &[50.0]);
        let d = &s["drift"];
        assert_eq!(d["count"], 5);
        for (k, want) in [
            ("mean_ms", whole.mean),
            ("std_ms", whole.std),
            ("min_ms", whole.min),
            ("max_ms", whole.max),
        ] {
            assert!((d[k].as_f64().unwrap() - want).abs() < 1e-9, "{k}");
        }
        assert!(d["p99_ms"].is_null() && d["median_ms"].is_null());
        assert_eq!(d["pooled"], true);
        // server-side scrapes are not merged
        inputs[0].1["server_metrics"] = json!({"scrapes": 3});
        assert!(merge(&inputs).unwrap().get("server_metrics").is_none());
        // probes: rates and counts add, distributions pool
        let probe = |ttft: &[f64]| {
            let ok: Vec<Sample> = ttft
                .iter()
                .map(|&s| Sample {
                    scalars: Scalars {
                        output_tokens: 1,
                        ttft_ns: Some((s * 1e9) as u64),
                        e2el_ns: Some((s * 1e9) as u64),
                        ..Default::default()
                    },
                    ..Default::default()
                })
                .collect();
            crate::replay::probe::summarize(2.0, &ok, 1.0, &[50.0, 99.0])
        };
        inputs[0].1["probes"] = probe(&[0.010, 0.020]);
        inputs[1].1["probes"] = probe(&[0.030]);
        let merged = merge(&inputs).unwrap();
        let p = merged["probes"].clone();
        assert_eq!(
            (p["rate"].as_f64(), p["sent"].as_u64()),
            (Some(4.0), Some(3))
        );
        // vLLM's probe keys come from the pooled probes, not from the first input
        assert_eq!(merged["probe_completed"], 3);
        assert_eq!(merged["probe_max_e2el_ms"], 30.0);
        assert_eq!(p["completed"], 3);
        assert!((p["ttft"]["mean_ms"].as_f64().unwrap() - 20.0).abs() < 1e-9);
        assert_eq!(p["ttft"]["count"], 3);
        assert!(p["ttft"]["p99_ms"].is_null());
    }

    /// The shards' peaks add up (an upper bound); an input without a peak key drops it.
    #[test]
    fn peaks_are_summed_and_dropped_when_an_input_lacks_them() {
        let mut inputs = shards(false);
        let m = merge(&inputs).unwrap();
        for k in [
            "max_concurrent_requests",
            "peak_in_flight",
            "max_output_tokens_per_s",
        ] {
            let sum: f64 = inputs.iter().map(|(_, v)| v[k].as_f64().unwrap()).sum();
            assert_eq!(m[k].as_f64(), Some(sum), "{k}");
        }
        inputs[1]
            .1
            .as_object_mut()
            .unwrap()
            .remove("peak_in_flight");
        assert!(merge(&inputs).unwrap().get("peak_in_flight").is_none());
    }

    /// One detailed input merged alone reproduces its own vLLM statistics bit for bit.
    #[test]
    fn merging_one_detailed_input_is_identity_for_vllm_stats() {
        let one = result(&all(), true, 2.0);
        let m = merge(&[("a.json".into(), one.clone())]).unwrap();
        for fam in ["ttft", "tpot", "itl", "e2el"] {
            for stat in ["mean", "median", "std", "p99"] {
                let k = format!("{stat}_{fam}_ms");
                assert_eq!(m[&k], one[&k], "{k}");
            }
        }
    }

    #[test]
    fn histogram_merge_is_lossless_and_self_merge_doubles() {
        let sh = shards(false);
        let merged = merge(&sh).unwrap();
        assert_eq!(merged["merged_from_histograms"], json!(true));
        assert!(merged.get("ttfts").is_none());
        for name in HISTOGRAMS {
            let sum: u64 = sh.iter().map(|(_, v)| hist_len(v, name)).sum();
            assert_eq!(hist_len(&merged, name), sum, "{name}");
        }
        let one = result(&all(), false, 2.0);
        // two runs with equal samples (not one file given twice, which is refused)
        let mut other = one.clone();
        other["date"] = json!("20260101-000001");
        let twice = merge(&[("a".into(), one.clone()), ("b".into(), other)]).unwrap();
        for name in ["ttft_us", "itl_us", "drift_abs_ns"] {
            let a = Histograms::decode(one["histograms"][name].as_str().unwrap()).unwrap();
            let b = Histograms::decode(twice["histograms"][name].as_str().unwrap()).unwrap();
            for (x, y) in a.iter_recorded().zip(b.iter_recorded()) {
                assert_eq!(x.value_iterated_to(), y.value_iterated_to());
                assert_eq!(2 * x.count_at_value(), y.count_at_value(), "{name}");
            }
        }
        assert_eq!(
            twice["completed"],
            json!(2 * one["completed"].as_u64().unwrap())
        );
        // pooled (exact) mean/std of a family without histograms: same as the one input
        let (a, b) = (
            one["mean_server_ttft_ms"].as_f64().unwrap(),
            twice["mean_server_ttft_ms"].as_f64().unwrap(),
        );
        assert!((a - b).abs() < 1e-9);
        assert!(twice["p99_server_ttft_ms"].is_null());
    }

    #[test]
    fn mixed_detail_falls_back_to_histograms() {
        let mut sh = shards(true);
        sh[1].1 = shards(false)[1].1.clone();
        let m = merge(&sh).unwrap();
        assert_eq!(m["merged_from_histograms"], json!(true));
        assert!(
            m.get("input_lens").is_none(),
            "arrays could not stay aligned"
        );
        let p99 = m["p99_ttft_ms"].as_f64().unwrap();
        let whole = result(&all(), false, 3.0)["p99_ttft_ms"].as_f64().unwrap();
        assert!((p99 - whole).abs() / whole < 0.01, "{p99} vs {whole}");
    }

    #[test]
    fn refuses_other_schema_and_other_experiment_naming_file_and_key() {
        let mut sh = shards(false);
        sh[2].1["seed"] = json!(7);
        let e = merge(&sh).unwrap_err().to_string();
        assert!(e.contains("shard-2.json") && e.contains("`seed`"), "{e}");
        let mut sh = shards(false);
        sh[1].1["schema"] = json!("retrace.replay/2");
        let e = merge(&sh).unwrap_err().to_string();
        assert!(e.contains("shard-1.json") && e.contains("`schema`"), "{e}");
        let mut sh = shards(false);
        sh[0].1["speed"] = json!(2.0);
        let e = merge(&sh).unwrap_err().to_string();
        assert!(e.contains("shard-1.json") && e.contains("`speed`"), "{e}");
        let mut sh = shards(false);
        sh[1].1["histograms"]["ttft_us"] = json!("not base64!");
        let e = merge(&sh).unwrap_err().to_string();
        assert!(
            e.contains("shard-1.json") && e.contains("histograms.ttft_us"),
            "{e}"
        );
        assert!(merge(&[]).is_err());
    }

    /// Counts are summed exactly or refused: a sum past 2^64 − 1 is never wrapped or saturated.
    #[test]
    fn counts_whose_sum_would_pass_u64_are_refused_naming_file_and_key() {
        let mut sh = shards(false);
        for (k, (_, v)) in sh.iter_mut().enumerate().take(2) {
            let big = (1u64 << 63) + k as u64;
            for key in ["num_prompts", "completed"] {
                v[key] = json!(big);
            }
            v["failed"] = json!(0);
        }
        let e = merge(&sh[..2]).unwrap_err().to_string();
        assert!(
            e.contains("shard-1.json") && e.contains("`num_prompts`") && e.contains("2^64"),
            "{e}"
        );
    }

    #[test]
    fn merge_refuses_the_same_shard_twice_and_shards_of_different_splits() {
        let sh = shards(false);
        let e = merge(&[sh[0].clone(), sh[1].clone(), sh[0].clone()]).unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("shard-0.json") && e.contains("given twice"),
            "{e}"
        );
        let with = |k: usize, s: &str| {
            let (p, mut v) = sh[k].clone();
            v["shard"] = json!(s);
            (p, v)
        };
        let e = merge(&[with(0, "0/2"), with(1, "0/3")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("shard-1.json") && e.contains("`shard`"), "{e}");
        assert!(e.contains("0/3") && e.contains("0/2"), "{e}");
        let e = merge(&[with(0, "1/3"), with(1, "1/3")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("shard-1.json") && e.contains("already given"),
            "{e}"
        );
        let m = merge(&[with(0, "0/3"), with(1, "1/3"), with(2, "2/3")]).unwrap();
        assert!(m.get("shard").is_none(), "the merged run is not one shard");
    }
}
