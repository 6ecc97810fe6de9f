//! The page of a capacity search (`retrace report` of a `retrace.capacity/1` file): latency and
//! throughput against offered load, the SLO's bounds as lines and the knee (the answer) marked,
//! and the table of steps. The file is read into the few typed fields the page draws; each
//! step's `result` is a replay result, read as such.

use serde::Deserialize;
use serde_json::{json, Value};

/// The schema prefix of a capacity result (written by `retrace capacity`).
pub(crate) const SCHEMA_PREFIX: &str = "retrace.capacity/";

/// Most steps a capacity file may hold (one search runs at most 60).
pub(crate) const MAX_STEPS: usize = 60;

#[derive(Debug, Deserialize)]
struct File {
    trace: String,
    slo: Vec<String>,
    steps: Vec<Step>,
    capacity: Answer,
}

#[derive(Debug, Deserialize)]
struct Step {
    speed: f64,
    slo_met: bool,
    not_met_because: Option<String>,
    offered_request_rate: f64,
    result: StepResult,
}

/// The replay result's keys the page draws.
#[derive(Debug, Deserialize)]
struct StepResult {
    request_throughput: f64,
    output_throughput: f64,
    failed: u64,
    p50_ttft_ms: Option<f64>,
    p99_ttft_ms: Option<f64>,
    p99_itl_ms: Option<f64>,
}

#[derive(Debug, Deserialize)]
struct Answer {
    speed: Option<f64>,
    at_least: bool,
    limited_by: Option<String>,
}

/// Why a capacity file cannot be drawn.
#[derive(Debug, thiserror::Error)]
pub enum CapacityFileError {
    #[error("{path}: not a capacity result ({SCHEMA_PREFIX}1): {msg}")]
    Shape { path: String, msg: String },
    #[error("{path}: {n} steps, more than the {MAX_STEPS} one search runs")]
    TooMany { path: String, n: usize },
}

/// The page's data for the capacity file `v` (read from `path`).
pub(crate) fn page_data(path: &str, v: &Value) -> Result<Value, CapacityFileError> {
    let n = v["steps"].as_array().map_or(0, Vec::len);
    if n > MAX_STEPS {
        return Err(CapacityFileError::TooMany {
            path: path.into(),
            n,
        });
    }
    let f = File::deserialize(v).map_err(|e| CapacityFileError::Shape {
        path: path.into(),
        msg: e.to_string(),
    })?;
    let mut steps: Vec<&Step> = f.steps.iter().collect();
    steps.sort_by(|a, b| a.offered_request_rate.total_cmp(&b.offered_request_rate));
    let pts = |g: &dyn Fn(&Step) -> Option<f64>| -> Vec<Value> {
        steps
            .iter()
            .filter_map(|s| g(s).map(|y| json!([s.offered_request_rate, y])))
            .collect()
    };
    let knee = f.capacity.speed.and_then(|x| {
        steps
            .iter()
            .find(|s| s.speed == x)
            .map(|s| s.offered_request_rate)
    });
    Ok(json!({
        "page": "capacity",
        "title": format!("retrace capacity: {}", f.trace),
        "subtitle": format!("SLO {} · {path}", f.slo.join(",")),
        "answer": answer_text(&f),
        "latency": [
            {"name": "p50 TTFT", "pts": pts(&|s| s.result.p50_ttft_ms)},
            {"name": "p99 TTFT", "pts": pts(&|s| s.result.p99_ttft_ms)},
            {"name": "p99 ITL", "pts": pts(&|s| s.result.p99_itl_ms)},
        ],
        "throughput": [
            {"name": "achieved req/s", "pts": pts(&|s| Some(s.result.request_throughput))},
            {"name": "offered req/s", "pts": pts(&|s| Some(s.offered_request_rate))},
        ],
        "slo_lines": slo_lines(&f),
        "knee": knee,
        "steps": f.steps.iter().map(row).collect::<Vec<_>>(),
    }))
}

/// The SLO bounds drawn on the latency chart: those on a plotted metric.
fn slo_lines(f: &File) -> Vec<Value> {
    let plotted = ["median_ttft_ms", "p99_ttft_ms", "p99_itl_ms"];
    let mut out = Vec::new();
    for rule in &f.slo {
        let Some((metric, bound)) = rule.split_once("<=").or_else(|| rule.split_once('<')) else {
            continue;
        };
        let (Ok(y), true) = (
            bound.trim().parse::<f64>(),
            plotted.contains(&metric.trim()),
        ) else {
            continue;
        };
        out.push(json!({"name": format!("SLO {rule}"), "y": y}));
    }
    out
}

fn answer_text(f: &File) -> String {
    let a = &f.capacity;
    let by = a
        .limited_by
        .as_deref()
        .map_or(String::new(), |m| format!("; limited by {m}"));
    match (a.speed, a.at_least) {
        (None, _) => format!("The SLO was not met at any speed tried{by}."),
        (Some(x), true) => format!(
            "Capacity: at least {x}× the recorded traffic (met at the highest speed tried)."
        ),
        (Some(x), false) => format!("Capacity: {x}× the recorded traffic{by}."),
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

fn row(s: &Step) -> Value {
    let verdict = match (s.slo_met, &s.not_met_because) {
        (true, _) => "met".to_string(),
        (false, Some(w)) if w.starts_with("given up") => "not met (given up early)".into(),
        (false, Some(w)) => format!("not met ({w})"),
        (false, None) => "not met".into(),
    };
    json!([
        format!("{}×", s.speed),
        format!("{:.2}", s.offered_request_rate),
        format!("{:.2}", s.result.request_throughput),
        format!("{:.0}", s.result.output_throughput),
        ms(s.result.p50_ttft_ms),
        ms(s.result.p99_ttft_ms),
        ms(s.result.p99_itl_ms),
        s.result.failed,
        verdict,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(steps: usize) -> Value {
        let step = |speed: f64, met: bool| {
            json!({"speed": speed, "slo_met": met, "not_met_because": null,
                "offered_request_rate": 10.0 * speed, "rules": [{"metric": "p99_ttft_ms", "rule": "p99_ttft_ms<=300", "value": 1.0, "met": met}],
                "result": {"request_throughput": 9.0 * speed, "output_throughput": 90.0 * speed, "failed": 0,
                    "p50_ttft_ms": 10.0, "p99_ttft_ms": if met { 20.0 } else { 900.0 }, "p99_itl_ms": 5.0}})
        };
        json!({"schema": "retrace.capacity/1", "trace": "t.jsonl", "slo": ["p99_ttft_ms<=300", "failure_rate<=0.01"],
            "steps": (0..steps).map(|i| step(1.0 + i as f64, i + 1 < steps)).collect::<Vec<_>>(),
            "capacity": {"speed": (steps - 1) as f64, "at_least": false, "limited_by": "p99_ttft_ms"}})
    }

    #[test]
    fn the_page_draws_latency_and_throughput_against_offered_load_with_the_slo_and_the_knee() {
        let d = page_data("cap.json", &file(3)).unwrap();
        assert_eq!(
            d["latency"][1]["pts"],
            json!([[10.0, 20.0], [20.0, 20.0], [30.0, 900.0]])
        );
        assert_eq!(
            d["slo_lines"],
            json!([{"name": "SLO p99_ttft_ms<=300", "y": 300.0}])
        );
        assert_eq!(d["knee"], 20.0);
        assert_eq!(d["steps"].as_array().unwrap().len(), 3);
        assert!(d["answer"].as_str().unwrap().starts_with("Capacity: 2×"));
    }

    #[test]
    fn a_file_of_another_shape_or_too_many_steps_is_refused_naming_it() {
        let e = page_data("cap.json", &json!({"schema": "retrace.capacity/1"})).unwrap_err();
        assert!(
            e.to_string().starts_with("cap.json: not a capacity result"),
            "{e}"
        );
        let mut many = file(2);
        many["steps"] = json!(vec![many["steps"][0].clone(); MAX_STEPS + 1]);
        let e = page_data("cap.json", &many).unwrap_err();
        assert!(e.to_string().contains("more than the 60"), "{e}");
    }
}
