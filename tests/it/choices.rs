//! `n > 1`: each choice's output length is recorded (by choice index in a stream), and a replay
//! asks each choice for its own length, not the total over the choices. Streamed and not, chat
//! and completions, `n` = 2 and 3, recorded through the proxy in front of the mock, replayed
//! against a fresh mock and compared.

use super::real_traffic::{compare_files, mock, read_trace, replay_recording};
use super::support::{spawn_recorder, stop_recorder};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retrace::record::{Bodies, RecordConfig};
use serde_json::{json, Value};
use std::time::Duration;

/// Tokens each choice generates (`max_tokens` with `ignore_eos`).
const EACH: u64 = 8;

/// (path, n, streamed) of the requests sent, in order.
const SENT: [(&str, u32, bool); 4] = [
    ("/v1/completions", 2, true),
    ("/v1/completions", 3, false),
    ("/v1/chat/completions", 3, true),
    ("/v1/chat/completions", 2, false),
];

fn body(path: &str, n: u32, stream: bool) -> Value {
    let mut b = json!({"model": "mock-llama", "n": n, "max_tokens": EACH, "ignore_eos": true});
    match path {
        "/v1/completions" => b["prompt"] = json!("one two three four five"),
        _ => b["messages"] = json!([{"role": "user", "content": "one two three"}]),
    }
    if stream {
        b["stream"] = json!(true);
        b["stream_options"] = json!({"include_usage": true});
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_choice_of_n_is_recorded_and_replayed_at_its_own_length() {
    let dir = tempfile::tempdir().unwrap();
    let up = mock().await;
    let mut cfg =
        RecordConfig::new(&format!("http://{}", up.addr), dir.path().join("rec")).unwrap();
    cfg.bodies = Bodies::Request;
    cfg.flush_every = Duration::from_millis(100);
    let rec = spawn_recorder(cfg).await;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    for (path, n, stream) in SENT {
        let req = http::Request::post(format!("http://{}{path}", rec.addr))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body(path, n, stream).to_string())))
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(20), client.request(req))
            .await
            .expect("response in time")
            .expect("response");
        assert_eq!(resp.status(), 200, "{path} n={n}");
        resp.into_body().collect().await.expect("whole body");
    }
    drop(client);
    stop_recorder(rec.stop, rec.task).await;
    up.shutdown().await;

    let (path, trace) = read_trace(&dir.path().join("rec"));
    assert_eq!(trace.requests.len(), SENT.len());
    for (r, (p, n, stream)) in trace.requests.iter().zip(SENT) {
        let what = format!("{p} n={n} stream={stream}");
        assert_eq!(r.output_tokens, EACH * u64::from(n), "{what}: the total");
        let by_choice = &r.response.as_ref().unwrap().choice_tokens;
        match stream {
            true => assert_eq!(by_choice, &vec![EACH as u32; n as usize], "{what}"),
            false => assert!(by_choice.is_empty(), "{what}: {by_choice:?}"),
        }
        assert_eq!(
            r.choice_output_tokens(),
            EACH,
            "{what}: one choice's length"
        );
    }

    let target = mock().await;
    let result = dir.path().join("replay.json");
    let out = replay_recording(&path, &target.addr.to_string(), &result).await;
    target.shutdown().await;
    let lens: Vec<u64> = serde_json::from_value(out.result["output_lens"].clone()).unwrap();
    let want: Vec<u64> = SENT.iter().map(|s| EACH * u64::from(s.1)).collect();
    assert_eq!(
        lens, want,
        "each choice asked for its own length, not the total"
    );
    let (_, f) = compare_files(&path, &result);
    assert_eq!((f.isl_exact, f.osl_exact), (1.0, 1.0), "{f:?}");
    super::support::assert_faithful_or_sent_late(&f);
}
