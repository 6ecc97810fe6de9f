//! The replay's console report: vLLM's `Serving Benchmark Result` block, then retrace's sections.
//!
//! The first block reproduces `vllm bench serve`'s layout exactly (rows `{:<40} {:<10}`, section
//! rules centred in 50 columns, TTFT/TPOT/ITL with mean, median and each chosen percentile), so it
//! can be read side by side with vLLM's. The sections after it are ours: failures by kind (and the
//! first distinct error messages), latency
//! from the intended send time, send drift (and the dispatcher's part of it), client queue, and
//! the server-side TTFT breakdown (client TTFT = server queue + server TTFT + unattributed).
//! Renders to a `String`; printing is the caller's business.

use super::outcome::FirstError;
use crate::metrics::{percentile_label, Stats, Summary};
use std::fmt::Write as _;

// vLLM pads the value to 10 columns; the reference output has trailing spaces trimmed.
fn row(out: &mut String, label: &str, value: impl std::fmt::Display) {
    let line = format!("{:<40} {:<10}", label, value);
    let _ = writeln!(out, "{}", line.trim_end());
}

fn rowf(out: &mut String, label: &str, value: f64) {
    let line = format!("{:<40} {:<10.2}", label, value);
    let _ = writeln!(out, "{}", line.trim_end());
}

fn rule(out: &mut String, title: &str, fill: char) {
    let _ = writeln!(out, "{}", center(title, fill));
}

fn center(title: &str, fill: char) -> String {
    let n = title.chars().count();
    if n >= 50 {
        return title.to_string();
    }
    let pad = 50 - n;
    let left = pad / 2;
    let f = fill.to_string();
    format!("{}{}{}", f.repeat(left), title, f.repeat(pad - left))
}

fn metric(out: &mut String, title: &str, short: &str, s: &Stats) {
    rule(out, title, '-');
    rowf(out, &format!("Mean {short} (ms):"), s.mean);
    rowf(out, &format!("Median {short} (ms):"), s.median);
    for (p, v) in &s.percentiles {
        rowf(out, &format!("P{} {short} (ms):", percentile_label(*p)), *v);
    }
}

/// vLLM's block, byte for byte in vLLM's layout.
pub fn vllm_block(sum: &Summary) -> String {
    let mut out = String::new();
    rule(&mut out, " Serving Benchmark Result ", '=');
    row(&mut out, "Successful requests:", sum.completed);
    rowf(&mut out, "Benchmark duration (s):", sum.duration_s);
    row(&mut out, "Total input tokens:", sum.total_input_tokens);
    row(&mut out, "Total generated tokens:", sum.total_output_tokens);
    rowf(
        &mut out,
        "Request throughput (req/s):",
        sum.request_throughput,
    );
    if let Some(g) = sum.request_goodput {
        rowf(&mut out, "Request goodput (req/s):", g);
    }
    rowf(
        &mut out,
        "Output token throughput (tok/s):",
        sum.output_throughput,
    );
    rowf(
        &mut out,
        "Total token throughput (tok/s):",
        sum.total_token_throughput,
    );
    metric(&mut out, "Time to First Token", "TTFT", &sum.ttft);
    metric(
        &mut out,
        "Time per Output Token (excl. 1st token)",
        "TPOT",
        &sum.tpot,
    );
    metric(&mut out, "Inter-token Latency", "ITL", &sum.itl);
    let _ = writeln!(out, "{}", "=".repeat(50));
    out
}

fn brief(out: &mut String, label: &str, s: &Stats) {
    brief_line(out, label, [s.mean, s.median, s.max], s.percentile(99.0));
}

/// `label  mean M median M[ p99 P] max M`, ms.
fn brief_line(out: &mut String, label: &str, [mean, median, max]: [f64; 3], p99: Option<f64>) {
    let p99 = p99.map_or(String::new(), |v| format!(" p99 {v:.3}"));
    let _ = writeln!(
        out,
        "{label:<40} mean {mean:.3} median {median:.3}{p99} max {max:.3}"
    );
}

/// The `--sessions` section: turn ordering and drift from the recorded arrivals.
pub fn sessions_section(r: &crate::replay::sessions::SessionReport) -> String {
    let mut out = String::new();
    rule(&mut out, "Session ordering (--sessions)", '-');
    row(&mut out, "Sessions:", r.sessions);
    row(&mut out, "Turns:", r.turns);
    row(
        &mut out,
        "Turns released by their predecessor:",
        r.dependent_turns,
    );
    row(
        &mut out,
        "  after a failed predecessor:",
        r.released_after_failure,
    );
    if r.dependent_turns > 0 {
        brief(&mut out, "Drift from recorded arrival (ms):", &r.drift);
    }
    out
}

/// The `--scrape-metrics` section, from the result's `server_metrics` object.
pub fn server_metrics_section(v: &serde_json::Value) -> String {
    let mut out = String::new();
    rule(&mut out, "Server metrics (--scrape-metrics)", '-');
    let num = |x: &serde_json::Value| x.as_f64();
    let or_na =
        |x: Option<f64>, prec: usize| x.map_or("n/a".to_string(), |x| format!("{x:.prec$}"));
    row(
        &mut out,
        "Scrapes (failed):",
        format!("{} ({})", v["scrapes"], v["failed_scrapes"]),
    );
    if let Some(e) = v["last_error"].as_str() {
        row(&mut out, "  last error:", e);
    }
    let pc = &v["prefix_cache"];
    let pct = |x: Option<f64>| x.map_or("n/a".to_string(), |x| format!("{:.2} %", x * 100.0));
    row(
        &mut out,
        "Prefix cache hit rate, achieved:",
        format!(
            "{} ({} / {} tokens)",
            pct(num(&pc["hit_rate"])),
            or_na(num(&pc["hits"]), 0),
            or_na(num(&pc["queries"]), 0)
        ),
    );
    row(
        &mut out,
        &format!(
            "  theoretical (block {}):",
            pc["server_block_size"].as_u64().unwrap_or(0)
        ),
        format!(
            "{} ({} / {} tokens)",
            pct(num(&pc["theoretical_hit_rate"])),
            pc["theoretical_hits"],
            pc["theoretical_queries"]
        ),
    );
    if let (Some(a), Some(t)) = (num(&pc["hit_rate"]), num(&pc["theoretical_hit_rate"])) {
        if a > t + 1e-9 {
            let _ = writeln!(
                out,
                "  (above theoretical: a cache warm from an earlier run, or other traffic on the server)"
            );
        } else if a + 1e-9 < t {
            let _ = writeln!(
                out,
                "  (below theoretical: eviction, concurrent prefills, failed requests, or another block size)"
            );
        }
    }
    row(
        &mut out,
        "Peak running / waiting requests:",
        format!(
            "{} / {}",
            or_na(num(&v["peak_running"]), 0),
            or_na(num(&v["peak_waiting"]), 0)
        ),
    );
    row(
        &mut out,
        "Peak KV-cache usage:",
        pct(num(&v["peak_kv_cache_usage"])),
    );
    out
}

/// The `--probe-request-rate` section, from the result's `probes` object.
pub fn probes_section(v: &serde_json::Value) -> String {
    let mut out = String::new();
    rule(&mut out, "Probe requests (--probe-request-rate)", '-');
    row(
        &mut out,
        "Probes sent / completed / failed:",
        format!("{} / {} / {}", v["sent"], v["completed"], v["failed"]),
    );
    for (label, key) in [("Probe TTFT (ms):", "ttft"), ("Probe E2EL (ms):", "e2el")] {
        let s = &v[key];
        let f = |k: &str| s[k].as_f64().unwrap_or(0.0);
        let stats = [f("mean_ms"), f("median_ms"), f("max_ms")];
        brief_line(&mut out, label, stats, s["p99_ms"].as_f64());
    }
    out
}

/// Our sections, after vLLM's block; `first_errors`: the first distinct failure messages.
pub fn extra_sections(
    sum: &Summary,
    max_drift_ms: Option<f64>,
    first_errors: &[FirstError],
    bodies_late: u64,
) -> String {
    let mut out = String::new();
    rule(&mut out, " retrace: beyond vLLM ", '=');
    row(&mut out, "Failed requests:", sum.failed);
    for (kind, n) in &sum.errors {
        row(&mut out, &format!("  {kind}:"), n);
    }
    if !first_errors.is_empty() {
        let _ = writeln!(out, "First error messages:");
    }
    for e in first_errors {
        let _ = writeln!(out, "  {} ({}): {}", e.kind, e.count, e.message);
    }
    row(
        &mut out,
        "Peak concurrent requests:",
        sum.max_concurrent_requests,
    );
    rule(&mut out, "End-to-end Latency", '-');
    rowf(&mut out, "Mean E2EL (ms):", sum.e2el.mean);
    rowf(&mut out, "Median E2EL (ms):", sum.e2el.median);
    for (p, v) in &sum.e2el.percentiles {
        rowf(
            &mut out,
            &format!("P{} E2EL (ms):", percentile_label(*p)),
            *v,
        );
    }
    rule(
        &mut out,
        "From intended send time (no coord. omission)",
        '-',
    );
    brief(&mut out, "TTFT (ms):", &sum.ttft_from_intended);
    brief(&mut out, "E2EL (ms):", &sum.e2el_from_intended);
    rule(&mut out, "Send drift (actual - intended)", '-');
    brief(&mut out, "Drift (ms):", &sum.drift);
    brief(&mut out, "  of which dispatcher (ms):", &sum.dispatch_drift);
    if bodies_late > 0 {
        row(&mut out, "Bodies built late (sent late):", bodies_late);
    }
    if let Some(d) = max_drift_ms {
        let p99 = sum.drift.percentile(99.0).unwrap_or(sum.drift.max);
        let verdict = if p99 <= d {
            "ok"
        } else {
            "EXCEEDED: run invalid"
        };
        row(&mut out, &format!("Limit p99 <= {d} ms:"), verdict);
    }
    rule(&mut out, "Client queue (waiting for a slot)", '-');
    brief(&mut out, "Client queue (ms):", &sum.client_queue);
    rule(&mut out, "Server-side TTFT breakdown", '-');
    if sum.server_reported == 0 {
        let _ = writeln!(
            out,
            "(the server sent no per-request metrics; vLLM: --enable-per-request-metrics)"
        );
    } else {
        row(
            &mut out,
            "Requests with server metrics:",
            sum.server_reported,
        );
        rowf(&mut out, "Mean client TTFT (ms):", sum.ttft.mean);
        rowf(
            &mut out,
            "  = mean server queue (ms):",
            sum.server_queue.mean,
        );
        rowf(&mut out, "  + mean server TTFT (ms):", sum.server_ttft.mean);
        rowf(
            &mut out,
            "  + mean unattributed (ms):",
            sum.unattributed.mean,
        );
    }
    let _ = writeln!(out, "{}", "=".repeat(50));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{summarize, Sample};

    #[test]
    fn centred_rules_match_vllm() {
        assert_eq!(
            center(" Serving Benchmark Result ", '='),
            "============ Serving Benchmark Result ============"
        );
        assert_eq!(
            center("Time per Output Token (excl. 1st token)", '-'),
            "-----Time per Output Token (excl. 1st token)------"
        );
    }

    /// The seed excerpt's numbers rendered by us give the seed excerpt, byte for byte.
    #[test]
    fn block_matches_vllm_seed_output() {
        let mut sum = summarize(&[Sample::default()], 0.0, &[99.0]);
        sum.completed = 10;
        sum.duration_s = 5.78;
        sum.total_input_tokens = 1369;
        sum.total_output_tokens = 2212;
        sum.request_throughput = 1.73;
        sum.output_throughput = 382.89;
        sum.total_token_throughput = 619.85;
        let st = |mean, median, p99| Stats {
            count: 1,
            mean,
            median,
            std: 0.0,
            min: 0.0,
            max: 0.0,
            percentiles: vec![(99.0, p99)],
        };
        sum.ttft = st(71.54, 73.88, 79.49);
        sum.tpot = st(7.91, 7.96, 8.03);
        sum.itl = st(7.74, 7.70, 8.39);
        let seed = include_str!("../../fixtures/replay/seed-output.txt");
        assert_eq!(vllm_block(&sum), seed);
    }
}
