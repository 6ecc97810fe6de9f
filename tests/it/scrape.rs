//! `retrace replay --scrape-metrics` end to end: against the embedded mock (vLLM-named
//! `/metrics`) the achieved prefix-cache hits equal the theoretical count for a trace with known
//! reuse, the time series lands in the result file; an explicit URL works; an unreachable one is
//! counted, never fatal; flag errors name the flag.

use crate::support;
use retrace::replay::{self};
use serde_json::Value;

/// Mooncake blocks are 512 tokens; the mock's KV blocks 16. By domain.md's rule, hits =
/// min(floor(P/16)*16, floor((L-1)/16)*16): r1 shares 2 blocks (P = 1024) → 1024; r2 shares 1
/// (P = 512) → 512; r3 repeats r0 (P = 1100) → 1088. Total 2,624 of 3,830 tokens.
const ROWS: [(u64, u64, u64, &[u64]); 4] = [
    (0, 1100, 2, &[0, 1, 2]),
    (40, 1030, 2, &[0, 1, 3]),
    (80, 600, 2, &[0, 4]),
    (120, 1100, 2, &[0, 1, 2]),
];
const HITS: f64 = 2624.0;
const QUERIES: f64 = 3830.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn achieved_hits_on_the_embedded_mock_equal_the_theoretical_count() {
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(dir.path(), &ROWS);
    let out = dir.path().join("r.json");
    let o = replay::replay(
        support::replay_config(&[
            trace.to_str().unwrap(),
            "--scrape-metrics",
            "--result-json",
            out.to_str().unwrap(),
        ])
        .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!((o.summary.completed, o.summary.failed), (4, 0));
    let v: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let sm = &v["server_metrics"];
    let pc = &sm["prefix_cache"];
    assert_eq!(pc["server_block_size"], 16);
    assert_eq!(pc["theoretical_hits"], HITS as u64);
    assert_eq!(pc["theoretical_queries"], QUERIES as u64);
    assert_eq!(pc["hits"], HITS, "{pc}");
    assert_eq!(pc["queries"], QUERIES);
    assert_eq!(pc["hit_rate"], pc["theoretical_hit_rate"]);
    assert_eq!(sm["prompt_tokens"], QUERIES);
    assert_eq!(sm["generation_tokens"], 8.0);
    assert_eq!(
        (sm["before_ok"].as_bool(), sm["after_ok"].as_bool()),
        (Some(true), Some(true))
    );
    assert_eq!(sm["failed_scrapes"], 0);
    // The series: before (t < 0) and after, columns aligned; cumulative hits end at the total.
    let t: Vec<f64> = sm["series"]["t"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert!(
        t.len() >= 2 && t[0] < 0.0 && t.windows(2).all(|w| w[0] < w[1]),
        "{t:?}"
    );
    for k in [
        "running",
        "waiting",
        "kv_cache_usage",
        "prefix_cache_hits",
        "prefix_cache_queries",
    ] {
        assert_eq!(sm["series"][k].as_array().unwrap().len(), t.len(), "{k}");
    }
    assert_eq!(sm["series"]["prefix_cache_hits"][0], 0.0);
    assert_eq!(sm["series"]["prefix_cache_hits"][t.len() - 1], HITS);
    assert_eq!(sm["series"]["running"][t.len() - 1], 0.0);
    assert!(o.report.contains("Server metrics (--scrape-metrics)"));
    assert!(
        o.report.contains("68.51 % (2624 / 3830 tokens)"),
        "{}",
        o.report
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_url_and_server_block_size_and_an_unreachable_url() {
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(dir.path(), &ROWS);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mock = retrace::mock::start(
        listener,
        retrace::mock::MockConfig {
            fixed_timing: Some((2.0, 1.0)),
            block_size: 64,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let url = format!("http://{}", mock.addr);
    let scrape = format!("--scrape-metrics={url}/metrics");
    let o = replay::replay(
        support::replay_config(&[
            trace.to_str().unwrap(),
            "--target",
            &url,
            &scrape,
            "--server-block-size",
            "64",
        ])
        .unwrap(),
    )
    .await
    .unwrap();
    let r: Value = o.result.clone();
    let pc = &r["server_metrics"]["prefix_cache"];
    // block 64: r1 1024, r2 512, r3 min(1088, 1088) = 1088 → the same total here; queries equal.
    assert_eq!(pc["hits"], pc["theoretical_hits"].as_f64().unwrap(), "{pc}");
    assert_eq!(pc["server_block_size"], 64);
    assert!(!o.report.contains("theoretical:"), "{}", o.report);
    // The same run again on the now-warm server: more hits than the trace alone explains, said so.
    let again = replay::replay(
        support::replay_config(&[
            trace.to_str().unwrap(),
            "--target",
            &url,
            &scrape,
            "--server-block-size",
            "64",
        ])
        .unwrap(),
    )
    .await
    .unwrap();
    let pc = &again.result["server_metrics"]["prefix_cache"];
    assert!(
        pc["hits"].as_f64().unwrap() > pc["theoretical_hits"].as_f64().unwrap(),
        "{pc}"
    );
    assert!(
        again.report.contains("(above theoretical: a cache warm"),
        "{}",
        again.report
    );
    mock.shutdown().await;

    // Nothing listens on the scrape URL: counted, the run still completes.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!(
        "--scrape-metrics=http://{}/metrics",
        dead.local_addr().unwrap()
    );
    drop(dead);
    let o = replay::replay(support::replay_config(&[trace.to_str().unwrap(), &dead_url]).unwrap())
        .await
        .unwrap();
    assert_eq!(o.summary.completed, 4);
    let sm = &o.result["server_metrics"];
    assert!(sm["failed_scrapes"].as_u64().unwrap() >= 2, "{sm}");
    assert!(
        sm["last_error"].as_str().unwrap().contains("connect"),
        "{sm}"
    );
    assert_eq!(sm["prefix_cache"]["hit_rate"], Value::Null);
    assert!(o.report.contains("n/a"));
}

#[test]
fn scrape_flag_errors_name_the_flag() {
    let e = support::replay_config(&["t.jsonl", "--scrape-metrics=ftp://x/metrics"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--scrape-metrics=ftp://x/metrics"), "{e}");
    let e = support::replay_config(&["t.jsonl", "--scrape-metrics", "--server-block-size", "0"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--server-block-size 0"), "{e}");
}
