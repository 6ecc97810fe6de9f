//! The bounds a result file's values are read within (a retrace result or vLLM's): the one check
//! that `compare`, `report` and `merge` share through [`crate::report::load`], so that no absurd, negative
//! or self-contradicting value of an input reaches a statistic, a page or a merged result.
//!
//! Per-request arrays: each the same length (a retrace result's `num_prompts`), each element of
//! its kind (a latency in 0..=[`MAX_SECONDS`], a send time within a span of [`MAX_SECONDS`], a
//! token count up to [`MAX_TOKENS`], a string, a flag). Scalars: counts that are counts (a
//! retrace result's `completed + failed = num_prompts`, its peaks and per-family counts at most
//! `num_prompts`), a duration and every `*_ms` statistic within [`MAX_SECONDS`], rates that are
//! not negative. Pure: no I/O.

use crate::result::sidecar::ARRAYS;
use serde_json::{Map, Value};

/// The longest time a result may hold: a latency, a drift, the run's duration, the span of its
/// send times (a year and a day, far above any real run).
pub(crate) const MAX_SECONDS: f64 = 366.0 * 86_400.0;

/// The most tokens a request may count (the readers' token bound).
pub(crate) const MAX_TOKENS: u64 = crate::trace::rows::MAX_TOKENS;

/// A value out of bounds: its key (`a.b` inside a section) and what is wrong with it.
#[derive(Debug, PartialEq)]
pub(crate) struct Bad {
    pub(crate) key: String,
    pub(crate) msg: String,
}

/// `x` as JSON, cut for a message.
fn shown(x: &Value) -> String {
    crate::trace::clip(&x.to_string()).into_owned()
}

fn bad(key: &str, msg: impl Into<String>) -> Bad {
    Bad {
        key: key.into(),
        msg: msg.into(),
    }
}

/// What an element of a per-request array is (null is allowed for each).
#[derive(Clone, Copy, PartialEq)]
enum Elem {
    /// Seconds, 0..=MAX_SECONDS.
    Latency,
    /// A list of latencies.
    Latencies,
    /// Seconds on the run's clock: the array's span (with the other clock arrays) at most
    /// MAX_SECONDS.
    Clock,
    /// Seconds either way, |x| <= MAX_SECONDS.
    Signed,
    /// A token count, 0..=MAX_TOKENS.
    Tokens,
    Text,
    Flag,
}

/// Every per-request array and its element kind.
const ELEMS: [(&str, Elem); 17] = [
    ("input_lens", Elem::Tokens),
    ("output_lens", Elem::Tokens),
    ("ttfts", Elem::Latency),
    ("itls", Elem::Latencies),
    ("latencies", Elem::Latency),
    ("start_times", Elem::Clock),
    ("queue_times", Elem::Latency),
    ("errors", Elem::Text),
    ("server_queue_times", Elem::Latency),
    ("server_ttfts", Elem::Latency),
    ("server_input_lens", Elem::Tokens),
    ("server_cached_tokens", Elem::Tokens),
    ("intended_times", Elem::Clock),
    ("drifts", Elem::Signed),
    ("client_queue_times", Elem::Latency),
    ("recorded_errors", Elem::Text),
    ("non_streamed", Elem::Flag),
];

/// Why `x` (not null) is not a `kind`, if it is not.
fn elem_fault(kind: Elem, x: &Value) -> Option<String> {
    let f = x.as_f64();
    let ok = match kind {
        Elem::Latency if f.is_some_and(|v| v < 0.0) => return Some("is negative".into()),
        Elem::Latency => f.is_some_and(|v| v <= MAX_SECONDS),
        Elem::Latencies => {
            let Some(a) = x.as_array() else {
                return Some("is not a list".into());
            };
            let (i, why) = a
                .iter()
                .enumerate()
                .find_map(|(i, v)| Some((i, elem_fault(Elem::Latency, v)?)))?;
            return Some(format!("holds a value that {why} (its element {i})"));
        }
        Elem::Clock => f.is_some(),
        Elem::Signed => f.is_some_and(|v| v.abs() <= MAX_SECONDS),
        Elem::Tokens => x.as_u64().is_some_and(|v| v <= MAX_TOKENS),
        Elem::Text => x.is_string(),
        Elem::Flag => x.is_boolean(),
    };
    let want = match kind {
        Elem::Latency | Elem::Latencies => format!("a time of 0 to {MAX_SECONDS} s"),
        Elem::Clock => "a time in seconds".into(),
        Elem::Signed => format!("a time of at most {MAX_SECONDS} s either way"),
        Elem::Tokens => format!("a token count of at most {MAX_TOKENS}"),
        Elem::Text => "a string".into(),
        Elem::Flag => "a boolean".into(),
    };
    let v = shown(x);
    (!ok).then(|| format!("is {v}, expected {want} or null"))
}

/// The per-request arrays of `obj`: each one present an array of the same length as `ttfts` (a
/// retrace result's: `num_prompts`), each element of its kind, the send times within a span of
/// [`MAX_SECONDS`]. Returns their length, `None` when the result has no `ttfts`.
pub(crate) fn check_arrays(obj: &Map<String, Value>, retrace: bool) -> Result<Option<usize>, Bad> {
    let present: Vec<(&str, Elem, &Value)> = ELEMS
        .iter()
        .filter_map(|&(k, e)| Some((k, e, obj.get(k)?)))
        .collect();
    debug_assert!(ELEMS.iter().zip(ARRAYS).all(|((k, _), a)| *k == a));
    let Some(ttfts) = obj.get("ttfts") else {
        return match present.first() {
            Some((k, _, _)) => Err(bad(k, "is present but `ttfts` is not")),
            None => Ok(None),
        };
    };
    let n = ttfts
        .as_array()
        .ok_or_else(|| bad("ttfts", "expected an array"))?
        .len();
    if let Some(np) = obj.get("num_prompts").and_then(Value::as_u64) {
        if retrace && np != n as u64 {
            return Err(bad(
                "ttfts",
                format!("has {n} elements, num_prompts is {np}"),
            ));
        }
    }
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for (k, kind, v) in present {
        let Value::Array(a) = v else {
            return Err(bad(k, "expected an array"));
        };
        if a.len() != n {
            return Err(bad(k, format!("has {} elements, ttfts has {n}", a.len())));
        }
        if let Some((i, why)) = a
            .iter()
            .enumerate()
            .find_map(|(i, x)| Some((i, elem_fault(kind, x).filter(|_| !x.is_null())?)))
        {
            return Err(bad(k, format!("element {i} {why}")));
        }
        if kind == Elem::Clock {
            for x in a.iter().filter_map(Value::as_f64) {
                (lo, hi) = (lo.min(x), hi.max(x));
            }
            if hi - lo > MAX_SECONDS {
                let (lo, hi) = (shown(&Value::from(lo)), shown(&Value::from(hi)));
                let msg =
                    format!("spans {lo} to {hi} s with the send times: more than {MAX_SECONDS} s");
                return Err(bad(k, msg));
            }
        }
    }
    Ok(Some(n))
}

/// Counts of a result file: non-negative integers (a negative or float count such as 1e300 is
/// not a count).
const COUNT_KEYS: [&str; 7] = [
    "num_prompts",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "inexact_prompts",
    "server_reported",
];

/// A retrace result's counts of its requests: at most `num_prompts`.
const REQUEST_COUNTS: [&str; 3] = ["completed", "max_concurrent_requests", "peak_in_flight"];

/// Rates: not negative.
const RATES: [&str; 5] = [
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "request_goodput",
    "max_output_tokens_per_s",
];

/// The vLLM latency families, whose statistics are never negative.
const LATENCY_FAMILIES: [&str; 4] = ["ttft", "tpot", "itl", "e2el"];

/// Counts inside the `sessions` and `probes` sections (summed by a merge).
const SECTION_COUNTS: [&str; 8] = [
    "count",
    "sent",
    "completed",
    "failed",
    "sessions",
    "turns",
    "dependent_turns",
    "released_after_failure",
];

fn count(obj: &Map<String, Value>, k: &str) -> Result<Option<u64>, Bad> {
    match obj.get(k) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            let v = shown(v);
            bad(k, format!("is {v}, expected a non-negative integer"))
        }),
    }
}

/// Why the number `x` under `key` (`{stat}_{family}_ms`) is out of bounds, if it is (a value
/// that is not a number is no statistic).
fn ms_fault(key: &str, x: &Value) -> Option<String> {
    let v = x.as_f64()?;
    let max_ms = MAX_SECONDS * 1e3;
    let latency = LATENCY_FAMILIES
        .iter()
        .any(|f| key.ends_with(&format!("_{f}_ms")));
    let ok = v.abs() <= max_ms && (v >= 0.0 || !latency);
    let want = if latency { "0 to " } else { "at most " };
    (!ok).then(|| {
        let v = shown(x);
        format!("is {v}, expected {want}{max_ms} ms or null")
    })
}

/// The scalars of a result: counts, the duration, `*_ms` statistics, rates, `errors_by_kind`,
/// and the `sessions` and `probes` sections' counts and times.
pub(crate) fn check_scalars(obj: &Map<String, Value>, retrace: bool) -> Result<(), Bad> {
    let mut counts = std::collections::BTreeMap::new();
    for k in COUNT_KEYS {
        if let Some(c) = count(obj, k)? {
            counts.insert(k, c);
        }
    }
    match obj.get("duration") {
        Some(v) if !v.as_f64().is_some_and(|d| (0.0..=MAX_SECONDS).contains(&d)) => {
            let v = shown(v);
            let msg = format!("is {v}, expected a number of seconds from 0 to {MAX_SECONDS}");
            return Err(bad("duration", msg));
        }
        _ => {}
    }
    for (k, v) in obj {
        if k.ends_with("_ms") {
            if let Some(why) = ms_fault(k, v) {
                return Err(bad(k, why));
            }
        }
    }
    for k in RATES {
        match obj.get(k) {
            Some(v) if !v.is_null() && !v.as_f64().is_some_and(|r| r >= 0.0) => {
                let v = shown(v);
                return Err(bad(
                    k,
                    format!("is {v}, expected a non-negative rate or null"),
                ));
            }
            _ => {}
        }
    }
    for section in ["sessions", "probes"] {
        check_section(obj, section)?;
    }
    if retrace {
        check_retrace_counts(obj, &counts)?;
    }
    Ok(())
}

/// A retrace result's counts agree: `completed + failed = num_prompts`, and its peaks, family
/// counts, errors and good requests are at most its requests.
fn check_retrace_counts(
    obj: &Map<String, Value>,
    counts: &std::collections::BTreeMap<&str, u64>,
) -> Result<(), Bad> {
    let Some(&n) = counts.get("num_prompts") else {
        return Ok(());
    };
    if let (Some(c), Some(f)) = (counts.get("completed"), counts.get("failed")) {
        if c.checked_add(*f) != Some(n) {
            let msg = format!("{c} completed and {f} failed, but num_prompts is {n}");
            return Err(bad("failed", msg));
        }
    }
    let over = |k: &str, c: u64| {
        (c > n).then(|| bad(k, format!("is {c}, more than the result's {n} requests")))
    };
    for k in REQUEST_COUNTS {
        if let Some(e) = count(obj, k)?.and_then(|c| over(k, c)) {
            return Err(e);
        }
    }
    for k in obj.keys().filter(|k| k.starts_with("count_")) {
        if let Some(e) = count(obj, k)?.and_then(|c| over(k, c)) {
            return Err(e);
        }
    }
    if let Some(e) = obj.get("errors_by_kind") {
        let Value::Object(e) = e else {
            return Err(bad("errors_by_kind", "expected an object of counts"));
        };
        for (kind, c) in e {
            let key = format!("errors_by_kind.{kind}");
            let c = c
                .as_u64()
                .ok_or_else(|| bad(&key, "expected a non-negative integer"))?;
            if let Some(e) = over(&key, c) {
                return Err(e);
            }
        }
    }
    let tokens = n.saturating_mul(MAX_TOKENS);
    for k in ["total_input_tokens", "total_output_tokens"] {
        match counts.get(k) {
            Some(&t) if t > tokens => {
                let msg = format!("is {t}, more than {MAX_TOKENS} tokens for each of {n} requests");
                return Err(bad(k, msg));
            }
            _ => {}
        }
    }
    let num = |k: &str| obj.get(k).and_then(Value::as_f64);
    if let Some(p) = num("max_output_tokens_per_s").filter(|p| *p > tokens as f64) {
        let msg = format!("is {p}, more than {MAX_TOKENS} tokens for each of {n} requests");
        return Err(bad("max_output_tokens_per_s", msg));
    }
    if let (Some(g), Some(d)) = (num("request_goodput"), num("duration")) {
        let completed = counts.get("completed").copied().unwrap_or(n);
        if g * d > completed as f64 + 0.5 {
            let msg =
                format!("is {g}: {g} × duration {d} s is more than {completed} completed requests");
            return Err(bad("request_goodput", msg));
        }
    }
    Ok(())
}

/// The `sessions` or `probes` section: its counts are counts, its `*_ms` times within
/// [`MAX_SECONDS`], its rate not negative.
fn check_section(obj: &Map<String, Value>, section: &str) -> Result<(), Bad> {
    let Some(v) = obj.get(section) else {
        return Ok(());
    };
    fn walk(prefix: &str, v: &Value, depth: usize) -> Result<(), Bad> {
        let Value::Object(m) = v else {
            return Ok(());
        };
        for (k, x) in m {
            let key = format!("{prefix}.{k}");
            if k.ends_with("_ms") && !x.is_object() {
                if let Some(why) = ms_fault("", x) {
                    return Err(bad(&key, why));
                }
            } else if SECTION_COUNTS.contains(&k.as_str()) && !x.is_u64() {
                let v = shown(x);
                return Err(bad(
                    &key,
                    format!("is {v}, expected a non-negative integer"),
                ));
            } else if k == "rate" && !x.as_f64().is_some_and(|r| r >= 0.0) {
                let v = shown(x);
                return Err(bad(&key, format!("is {v}, expected a non-negative rate")));
            } else if depth < 2 {
                walk(&key, x, depth + 1)?;
            }
        }
        Ok(())
    }
    walk(section, v, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn arrays(extra: Value) -> Map<String, Value> {
        let mut m = obj(json!({
            "num_prompts": 2, "completed": 2, "failed": 0,
            "ttfts": [0.1, 0.2], "latencies": [0.2, 0.3], "itls": [[0.05], []],
            "input_lens": [10, 20], "output_lens": [2, 1], "start_times": [0.0, 0.01],
            "errors": ["", ""],
        }));
        m.extend(obj(extra));
        m
    }

    /// Every array's element is of its kind and bounded; the arrays agree in length with each
    /// other and with `num_prompts`.
    #[test]
    fn per_request_values_out_of_bounds_name_key_and_element() {
        assert_eq!(check_arrays(&arrays(json!({})), true), Ok(Some(2)));
        for (extra, key, want) in [
            (
                json!({"ttfts": [0.1, -0.2]}),
                "ttfts",
                "element 1 is negative",
            ),
            (
                json!({"latencies": [0.2, 1e303]}),
                "latencies",
                "element 1 is 1e+303",
            ),
            (
                json!({"itls": [[0.05], [1e303]]}),
                "itls",
                "element 1 holds",
            ),
            (json!({"input_lens": [10, 2.5]}), "input_lens", "element 1"),
            (
                json!({"output_lens": [1e12, 1]}),
                "output_lens",
                "element 0",
            ),
            (json!({"drifts": [0.0, -1e303]}), "drifts", "element 1"),
            (
                json!({"start_times": [-1e303, 1e303]}),
                "start_times",
                "spans",
            ),
            (
                json!({"intended_times": [0.0]}),
                "intended_times",
                "has 1 elements",
            ),
            (json!({"errors": ["", 3]}), "errors", "element 1"),
            (json!({"num_prompts": 4}), "ttfts", "num_prompts is 4"),
        ] {
            let e = check_arrays(&arrays(extra.clone()), true).unwrap_err();
            assert_eq!(e.key, key, "{extra}");
            assert!(e.msg.contains(want), "{extra}: {}", e.msg);
        }
        let mut m = arrays(json!({}));
        m.remove("ttfts");
        assert_eq!(check_arrays(&m, true).unwrap_err().key, "input_lens");
    }

    /// Counts agree with each other; times and rates are bounded and not negative.
    #[test]
    fn scalars_out_of_bounds_or_disagreeing_counts_name_the_key() {
        let base = json!({"num_prompts": 2, "completed": 1, "failed": 1, "duration": 1.0});
        let with = |extra: Value| {
            let mut m = obj(base.clone());
            m.extend(obj(extra));
            check_scalars(&m, true).map_err(|e| e.key)
        };
        assert_eq!(with(json!({})), Ok(()));
        assert_eq!(with(json!({"mean_drift_ms": -3.0})), Ok(()));
        for (extra, key) in [
            (json!({"failed": 3}), "failed"),
            (json!({"duration": 1e300}), "duration"),
            (json!({"mean_ttft_ms": 1e303}), "mean_ttft_ms"),
            (json!({"p99_itl_ms": -1.0}), "p99_itl_ms"),
            (
                json!({"max_output_tokens_per_s": 1e303}),
                "max_output_tokens_per_s",
            ),
            (json!({"request_throughput": -1.0}), "request_throughput"),
            (json!({"request_goodput": 1e303}), "request_goodput"),
            (json!({"peak_in_flight": 3}), "peak_in_flight"),
            (json!({"count_drift": 3}), "count_drift"),
            (
                json!({"errors_by_kind": {"http_500": 9}}),
                "errors_by_kind.http_500",
            ),
            (
                json!({"total_input_tokens": 1u64 << 60}),
                "total_input_tokens",
            ),
            (
                json!({"probes": {"ttft": {"mean_ms": 1e303}}}),
                "probes.ttft.mean_ms",
            ),
            (json!({"sessions": {"turns": -1}}), "sessions.turns"),
            (json!({"probes": {"rate": -2.0}}), "probes.rate"),
        ] {
            assert_eq!(with(extra.clone()), Err(key.to_string()), "{extra}");
        }
    }
}
