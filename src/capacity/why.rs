//! `--scrape-metrics`: why the capacity is where it is, from the server's own gauges in each
//! step's `server_metrics` (vLLM's, SGLang's or llama.cpp's running and waiting requests and KV
//! cache usage, scraped every second).
//!
//! The rules, in order:
//! - the waiting queue **builds** at a step when the mean of `waiting` over the last third of its
//!   scrapes exceeds the mean over the first third by at least one request; the line names the
//!   lowest factor where it does;
//! - at the lowest factor that missed the SLO: KV cache usage at 90 % or more is
//!   **memory-bound**; else running requests that peak at the highest count seen in any step
//!   while requests wait are **batch-bound** (the server's cap on running sequences, vLLM's
//!   `--max-num-seqs`); else **compute-bound**.

use serde_json::Value;

/// A step's speed and its `server_metrics`.
pub(crate) struct Gauges<'a> {
    pub(crate) speed: f64,
    pub(crate) metrics: &'a Value,
}

fn series(m: &Value, key: &str) -> Vec<f64> {
    m["series"][key]
        .as_array()
        .map_or(Vec::new(), |a| a.iter().filter_map(Value::as_f64).collect())
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Whether the waiting queue builds over the step.
fn builds(m: &Value) -> bool {
    let w = series(m, "waiting");
    if w.len() < 3 {
        return false;
    }
    let third = w.len() / 3;
    match (mean(&w[..third]), mean(&w[w.len() - third..])) {
        (Some(a), Some(b)) => b >= a + 1.0,
        _ => false,
    }
}

/// The sentence; `None` when no step has the gauges.
pub(crate) fn why(steps: &[Gauges], failed_at: Option<f64>) -> Option<String> {
    let with: Vec<&Gauges> = steps
        .iter()
        .filter(|g| !series(g.metrics, "waiting").is_empty())
        .collect();
    if with.is_empty() {
        return None;
    }
    let mut parts = Vec::new();
    let from = with
        .iter()
        .filter(|g| builds(g.metrics))
        .map(|g| g.speed)
        .reduce(f64::min);
    if let Some(x) = from {
        parts.push(format!("waiting queue grows from {x}×"));
    }
    let failed = failed_at.and_then(|x| with.iter().rev().find(|g| g.speed == x));
    if let Some(g) = failed {
        let kv = g.metrics["peak_kv_cache_usage"].as_f64();
        let running = g.metrics["peak_running"].as_f64();
        let most = with
            .iter()
            .filter_map(|g| g.metrics["peak_running"].as_f64())
            .fold(0.0, f64::max);
        let waiting = g.metrics["peak_waiting"].as_f64().unwrap_or(0.0);
        let kv_text = kv.map_or(String::new(), |k| {
            format!("KV cache usage {:.0} %", k * 100.0)
        });
        parts.push(match (kv, running) {
            (Some(k), _) if k >= 0.9 => format!("{kv_text}: memory-bound"),
            (_, Some(r)) if r >= most && waiting >= 1.0 => {
                format!("running requests capped at {r:.0} while others wait: batch-bound (the server's cap on running sequences)")
            }
            _ => {
                let r = running.map_or(String::new(), |r| format!("running peak {r:.0}"));
                let said: Vec<String> = [kv_text, r].into_iter().filter(|s| !s.is_empty()).collect();
                format!("{}: compute-bound", said.join(", "))
            }
        });
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn m(waiting: &[f64], running: f64, kv: f64) -> Value {
        json!({"series": {"waiting": waiting}, "peak_running": running,
            "peak_waiting": waiting.iter().cloned().fold(0.0, f64::max), "peak_kv_cache_usage": kv})
    }

    #[test]
    fn names_where_the_queue_builds_and_what_binds() {
        let (a, b, c) = (
            m(&[0.0; 6], 4.0, 0.2),
            m(&[0.0, 1.0, 2.0, 4.0, 6.0, 9.0], 8.0, 0.4),
            m(&[0.0, 5.0, 9.0, 14.0, 20.0, 30.0], 8.0, 0.5),
        );
        let steps = [
            Gauges {
                speed: 1.0,
                metrics: &a,
            },
            Gauges {
                speed: 2.0,
                metrics: &b,
            },
            Gauges {
                speed: 4.0,
                metrics: &c,
            },
        ];
        assert_eq!(
            why(&steps, Some(4.0)).unwrap(),
            "waiting queue grows from 2×; running requests capped at 8 while others wait: batch-bound (the server's cap on running sequences)"
        );
        let full = m(&[0.0, 1.0, 5.0, 9.0, 9.0, 12.0], 3.0, 0.96);
        let steps = [
            Gauges {
                speed: 1.0,
                metrics: &a,
            },
            Gauges {
                speed: 2.0,
                metrics: &full,
            },
        ];
        assert_eq!(
            why(&steps, Some(2.0)).unwrap(),
            "waiting queue grows from 2×; KV cache usage 96 %: memory-bound"
        );
        assert_eq!(
            why(
                &[Gauges {
                    speed: 1.0,
                    metrics: &json!({})
                }],
                Some(1.0)
            ),
            None
        );
    }
}
