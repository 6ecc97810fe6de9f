//! `retrace replay --sessions` end to end: turn ordering against the embedded mock (each turn sent
//! no earlier than its predecessor's end plus think time), the drift report in the result and on
//! the console, `--max-concurrency` together with sessions, and failed turns still releasing the
//! next one (against the test server's fault modes).

use crate::support::{self, OutputWithin, ServerConfig};
use retrace::replay::{self};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Writes a kv-cache-tester session file: per session, turns of (t s, in, out, think s).
fn sessions_file(dir: &Path, sessions: &[Vec<(f64, u64, u64, f64)>]) -> PathBuf {
    let mut s = String::new();
    for (k, turns) in sessions.iter().enumerate() {
        let reqs: Vec<String> = turns
            .iter()
            .map(|(t, i, o, think)| {
                let blocks: Vec<u64> = (1..=i / 16).collect();
                format!(
                    "{{\"t\":{t},\"type\":\"s\",\"in\":{i},\"out\":{o},\"hash_ids\":{blocks:?},\"think_time\":{think}}}"
                )
            })
            .collect();
        s.push_str(&format!(
            "{{\"id\":\"s{k}\",\"block_size\":16,\"requests\":[{}]}}\n",
            reqs.join(",")
        ));
    }
    let p = dir.join("sessions.jsonl");
    std::fs::write(&p, s).unwrap();
    p
}

fn f64s(v: &Value, key: &str) -> Vec<f64> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} missing"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Checks, from the detailed result, that every dependent turn (identified by its unique input
/// length, `turns[s][k]`) was sent no earlier than its predecessor's end + think.
fn assert_order(v: &Value, turns: &[Vec<(f64, u64, u64, f64)>]) {
    let lens: Vec<u64> = v["input_lens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    let (start, lat) = (f64s(v, "start_times"), f64s(v, "latencies"));
    let slot = |len: u64| lens.iter().position(|&l| l == len).unwrap();
    let mut checked = 0;
    for turns in turns {
        for w in turns.windows(2) {
            let (a, b) = (slot(w[0].1), slot(w[1].1));
            let pred_end = start[a] + lat[a];
            assert!(
                start[b] >= pred_end + w[1].3 - 1e-6,
                "turn of {} sent at {:.4} s, predecessor ended {:.4} s + think {}",
                w[1].1,
                start[b],
                pred_end,
                w[1].3
            );
            checked += 1;
        }
    }
    assert!(checked > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_wait_for_predecessor_plus_think_time_and_drift_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    // 3 sessions x 4 turns recorded 20 ms apart with 30 ms think time: against a 10 ms TTFT
    // server every dependent turn must come later than recorded (positive drift).
    let turns: Vec<Vec<(f64, u64, u64, f64)>> = (0..3u64)
        .map(|s| {
            (0..4u64)
                .map(|k| {
                    let think = if k == 0 { 0.0 } else { 0.03 };
                    (
                        0.005 * s as f64 + 0.02 * k as f64,
                        160 + 16 * k + s,
                        4,
                        think,
                    )
                })
                .collect()
        })
        .collect();
    let trace = sessions_file(dir.path(), &turns);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mock = retrace::mock::start(
        listener,
        retrace::mock::MockConfig {
            fixed_timing: Some((10.0, 1.0)),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let url = format!("http://{}", mock.addr);
    for conc in [None, Some("1")] {
        let out = dir.path().join("r.json");
        let mut args = vec![
            trace.to_str().unwrap(),
            "--target",
            &url,
            "--sessions",
            "--detailed",
            "--result-json",
            out.to_str().unwrap(),
        ];
        if let Some(c) = conc {
            args.extend(["--max-concurrency", c]);
        }
        let o = replay::replay(support::replay_cfg(&args)).await.unwrap();
        assert_eq!((o.summary.completed, o.summary.failed), (12, 0));
        let v: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        assert_order(&v, &turns);
        let s = &v["sessions"];
        assert_eq!(s["sessions"], 3);
        assert_eq!(s["turns"], 12);
        assert_eq!(s["dependent_turns"], 9);
        assert_eq!(s["released_after_failure"], 0);
        assert_eq!(s["drift"]["count"], 9);
        // Each dependent turn waits ≥ 10 ms TTFT + 30 ms think vs a 20 ms recorded gap.
        let min = s["drift"]["min_ms"].as_f64().unwrap();
        assert!(min >= 19.0, "min drift {min} ms");
        for k in ["mean_ms", "median_ms", "p50_ms", "p99_ms", "max_ms"] {
            assert!(s["drift"][k].as_f64().unwrap() >= min, "{k}");
        }
        assert!(o.report.contains("Session ordering (--sessions)"));
        assert!(o.report.contains("Drift from recorded arrival (ms):"));
        let r = o.sessions.unwrap();
        assert_eq!(r.dependent_turns, 9);
        // Dispatch drift is measured for every send against its own due instant (pred end +
        // think), never more than a timer tick before it: how late a loaded machine is belongs to a benchmark.
        let d = &o.summary.drift;
        assert_eq!(d.count, 12, "{d:?}");
        assert!(d.min > -1.0 && d.mean >= d.min, "{d:?}");
    }
    mock.shutdown().await;
    // The embedded default target (no --target): the same ordering holds.
    let out = dir.path().join("e.json");
    let o = replay::replay(support::replay_cfg(&[
        trace.to_str().unwrap(),
        "--sessions",
        "--detailed",
        "--result-json",
        out.to_str().unwrap(),
    ]))
    .await
    .unwrap();
    assert_eq!((o.summary.completed, o.summary.failed), (12, 0));
    let v: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(v["target"], "embedded-mock");
    assert_order(&v, &turns);
    assert_eq!(v["sessions"]["dependent_turns"], 9);
    // 30 ms think vs 20 ms recorded gaps: every dependent turn is at least 10 ms late.
    assert!(v["sessions"]["drift"]["min_ms"].as_f64().unwrap() >= 9.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_turn_still_releases_the_next_and_is_counted() {
    let srv = support::start(ServerConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    // The test server answers max_tokens 2 with HTTP 500 (3, 4, 5 are other faults): turn 1 of s0
    // fails.
    let turns = vec![
        vec![
            (0.0, 160, 6, 0.0),
            (0.01, 176, 2, 0.01),
            (0.02, 192, 6, 0.01),
        ],
        vec![(0.0, 161, 6, 0.0), (0.01, 177, 6, 0.02)],
    ];
    let trace = sessions_file(dir.path(), &turns);
    let out = dir.path().join("r.json");
    let o = replay::replay(support::replay_cfg(&[
        trace.to_str().unwrap(),
        "--target",
        &srv.url(),
        "--sessions",
        "--detailed",
        "--result-json",
        out.to_str().unwrap(),
    ]))
    .await
    .unwrap();
    assert_eq!(
        (o.summary.completed, o.summary.failed),
        (4, 1),
        "{:?}",
        o.summary.errors
    );
    let v: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(v["sessions"]["released_after_failure"], 1);
    assert_eq!(v["sessions"]["dependent_turns"], 3);
    // The turn after the failure was sent after the failure's end (its latency is 0 in vLLM's
    // arrays, so compare with intended times: intended = predecessor end + think).
    let lens: Vec<u64> = v["input_lens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    let slot = |len: u64| lens.iter().position(|&l| l == len).unwrap();
    let (start, intended) = (f64s(&v, "start_times"), f64s(&v, "intended_times"));
    assert!(intended[slot(192)] >= start[slot(176)] + 0.01 - 1e-6);
    assert!(start[slot(192)] >= intended[slot(192)] - 1e-6);
}

#[test]
fn sessions_on_a_trace_without_sessions_is_a_clear_error() {
    let bin = env!("CARGO_BIN_EXE_retrace");
    let o = std::process::Command::new(bin)
        .args(["replay", "--sessions", "--limit", "3"])
        .arg(support::repo(
            "fixtures/replay/mooncake_conversation_30.jsonl",
        ))
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--sessions: the trace has no session ids"),
        "{err}"
    );
}

#[test]
fn dry_run_tells_which_turns_wait() {
    let bin = env!("CARGO_BIN_EXE_retrace");
    let o = std::process::Command::new(bin)
        .args(["replay", "--sessions", "--dry-run", "--speed", "1"])
        .arg(support::repo("traces/kv_cache_tester_trace_0012.json"))
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("Planned requests:                        14"),
        "{out}"
    );
    assert!(
        out.contains("sessions: 1 sessions; 13 turns wait for their previous turn + think time"),
        "{out}"
    );
}
