//! `retrace replay --start-at`: two shards started separately send nothing before the agreed
//! instant and everything right after it; a time in the past is refused with a clear error
//! (exit status 2) before anything is sent.

use crate::support::{self, OutputWithin, ServerConfig};
use retrace::replay::{self};
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shards_begin_together_at_the_agreed_instant() {
    let srv = support::start(ServerConfig {
        ttft: Duration::from_millis(5),
        itl: Duration::from_millis(1),
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.jsonl");
    let rows: String = (0..8)
        .map(|i| {
            format!(
                "{{\"timestamp\": {}, \"input_length\": 100, \"output_length\": 6, \"hash_ids\": [{i}]}}\n",
                i * 20
            )
        })
        .collect();
    std::fs::write(&trace, rows).unwrap();
    // Setup (trace, bodies, connections) must end before the instant, even on a loaded machine.
    // The instant is the one passed on the command line, rounded to the millisecond as written.
    let at = format!("{:.3}", unix_now() + 4.0);
    let start: f64 = at.parse().unwrap();
    let url = srv.url();
    let shard = |i: &str| {
        let shard = format!("{i}/2");
        support::replay_cfg(&[
            trace.to_str().unwrap(),
            "--target",
            &url,
            "--model",
            "test-model",
            "--shard",
            &shard,
            "--start-at",
            &at,
            "--detailed",
        ])
    };
    let (a, b) = (shard("0"), shard("1"));
    let (ra, rb) = tokio::join!(replay::replay(a), replay::replay(b));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    // The server stamps each request's arrival on its own clock: none before the instant, and
    // the first (offset 0) soon after it, whenever this test's thread got to run.
    let arrivals = srv.arrivals.lock().unwrap().clone();
    assert_eq!(arrivals.len(), 8, "{arrivals:?}");
    let first = arrivals.iter().copied().fold(f64::INFINITY, f64::min);
    assert!(
        first >= start,
        "a request reached the server {:.6} s before --start-at",
        start - first
    );
    let done = unix_now();
    assert_eq!(ra.summary.completed + rb.summary.completed, 8);
    assert_eq!(srv.requests.load(Ordering::SeqCst), 8);
    // Both shards ran on the one timeline from the instant: the k-th arrival is planned at
    // k × 20 ms, and a loaded machine can only make it later.
    let mut sorted = arrivals.clone();
    sorted.sort_by(f64::total_cmp);
    for (k, t) in sorted.iter().enumerate() {
        assert!(
            *t >= start + 0.020 * k as f64 - 0.001,
            "arrival {k} at {:.3} s after the start, planned at {} ms",
            t - start,
            20 * k
        );
    }
    assert!(
        done < start + 120.0,
        "did not hang: finished {:.3} s after the start",
        done - start
    );
    for r in [&ra, &rb] {
        assert!(r.result["start_at"].as_str().unwrap().ends_with('Z'));
        // offsets kept from the whole trace's origin: intended times are multiples of 20 ms
        for t in r.result["intended_times"].as_array().unwrap() {
            let ms = t.as_f64().unwrap() * 1000.0;
            assert!((ms / 20.0 - (ms / 20.0).round()).abs() < 1e-6, "{ms}");
        }
    }
}

#[test]
fn a_start_time_in_the_past_is_refused() {
    let bin = env!("CARGO_BIN_EXE_retrace");
    let past = format!("{}", unix_now() as u64 - 60);
    let o = std::process::Command::new(bin)
        .args(["replay", "--start-at", &past])
        .arg(support::repo(
            "fixtures/replay/mooncake_conversation_30.jsonl",
        ))
        .output_within(support::CHILD_LIMIT)
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("--start-at {past}")), "{err}");
    assert!(err.contains("s in the past"), "{err}");
}
