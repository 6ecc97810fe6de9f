//! `retrace replay --probe-request-rate`: probes go out at the steady rate beside the workload,
//! outside `--max-concurrency`, are reported on their own and never mixed into the workload's
//! metrics; with `--scrape-metrics` the server's query counter accounts for them exactly.

use crate::support::{self, ServerConfig};
use retrace::replay::{self};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_run_beside_the_workload_outside_the_concurrency_limit() {
    let srv = support::start(ServerConfig {
        ttft: Duration::from_millis(30),
        itl: Duration::from_millis(10),
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    // 3 requests of ~30 + 39 x 10 = 420 ms each, one at a time (--max-concurrency 1): the
    // workload lasts ≥ 1.2 s; probes at 10/s must keep going out meanwhile.
    let trace = support::mooncake(
        dir.path(),
        &[(0, 100, 40, &[0]), (10, 200, 40, &[1]), (20, 300, 40, &[2])],
    );
    let o = replay::replay(
        support::replay_config(&[
            trace.to_str().unwrap(),
            "--target",
            &srv.url(),
            "--max-concurrency",
            "1",
            "--probe-request-rate",
            "10",
        ])
        .unwrap(),
    )
    .await
    .unwrap();
    // The workload's metrics are the workload's alone.
    let s = &o.summary;
    assert_eq!((s.completed, s.failed), (3, 0));
    assert_eq!(s.total_input_tokens, 600);
    assert_eq!(s.total_output_tokens, 120);
    assert!(
        s.client_queue.max > 300.0,
        "the workload queued: {}",
        s.client_queue.max
    );
    let p = &o.result["probes"];
    let sent = p["sent"].as_u64().unwrap();
    let dur = s.duration_s;
    // ~10 per second over the run (first at t0, the last before the workload's end).
    assert!(
        sent as f64 >= (dur * 10.0).floor() - 1.0 && sent as f64 <= dur * 10.0 + 2.0,
        "{sent} probes over {dur} s"
    );
    assert_eq!(p["completed"].as_u64().unwrap(), sent, "{p}");
    assert_eq!(p["failed"], 0);
    assert_eq!(p["rate"], 10.0);
    // Outside the limit: the server held a probe open beside the workload's one request.
    assert!(
        srv.max_in_flight.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "a probe waited for the workload's slot"
    );
    let ttft = &p["ttft"];
    assert!(ttft["min_ms"].as_f64().unwrap() >= 30.0, "{ttft}");
    assert!(p["e2el"]["mean_ms"].as_f64().unwrap() >= ttft["mean_ms"].as_f64().unwrap());
    assert!(o.report.contains("Probe requests (--probe-request-rate)"));
    assert!(o.report.contains("Probe TTFT (ms):"));
    assert!(o.result.get("ttfts").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_counted_in_the_theoretical_queries_of_the_scrape() {
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(
        dir.path(),
        &[
            (0, 1100, 2, &[0, 1, 2]),
            (150, 1030, 2, &[0, 1, 3]),
            (300, 600, 2, &[0, 4]),
        ],
    );
    let o = replay::replay(
        support::replay_config(&[
            trace.to_str().unwrap(),
            "--probe-request-rate",
            "20",
            "--scrape-metrics",
        ])
        .unwrap(),
    )
    .await
    .unwrap();
    let sent = o.result["probes"]["sent"].as_u64().unwrap();
    assert!(sent >= 4, "{sent}");
    let pc = &o.result["server_metrics"]["prefix_cache"];
    assert_eq!(pc["theoretical_queries"], 2730 + 8 * sent, "{pc}");
    assert_eq!(
        pc["queries"],
        pc["theoretical_queries"].as_f64().unwrap(),
        "{pc}"
    );
    assert_eq!(pc["hits"], pc["theoretical_hits"].as_f64().unwrap(), "{pc}");
}

#[test]
fn probe_rate_must_be_positive() {
    let e = support::replay_config(&["t.jsonl", "--probe-request-rate", "0"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--probe-request-rate 0"), "{e}");
}
