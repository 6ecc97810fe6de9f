//! `retrace mock` end to end over loopback: vLLM conformance of streams and errors (against
//! `fixtures/vllm/`), prefix-cache accounting, batching, fixed timing, faults, determinism.

use crate::support;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use retrace::mock::{self, MockConfig, MockHandle};
use retrace::wire::sse::SseParser;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

async fn start(cfg: MockConfig) -> MockHandle {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    mock::start(l, cfg).await.unwrap()
}

fn fixed(ttft: f64, itl: f64) -> MockConfig {
    MockConfig {
        fixed_timing: Some((ttft, itl)),
        ..MockConfig::default()
    }
}

/// One response as a client sees it.
#[derive(Debug, Default)]
struct Reply {
    status: u16,
    headers: http::HeaderMap,
    /// Time from send to response headers.
    headers_at: Duration,
    body: Vec<u8>,
    /// SSE `data` payloads with their arrival time after send.
    events: Vec<(Duration, String)>,
    /// The body ended with an error (e.g. reset).
    error: Option<String>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    /// Parsed JSON events, without `[DONE]`.
    fn chunks(&self) -> Vec<Value> {
        self.events
            .iter()
            .filter(|(_, d)| d != "[DONE]")
            .map(|(_, d)| serde_json::from_str(d).unwrap())
            .collect()
    }
    fn done(&self) -> bool {
        self.events.last().is_some_and(|(_, d)| d == "[DONE]")
    }
    /// Arrival times of events with non-empty `choices`.
    fn content_times(&self) -> Vec<Duration> {
        self.events
            .iter()
            .filter(|(_, d)| d != "[DONE]")
            .filter(|(_, d)| {
                let v: Value = serde_json::from_str(d).unwrap();
                v["choices"].as_array().is_some_and(|c| !c.is_empty())
            })
            .map(|(t, _)| *t)
            .collect()
    }
}

/// One request to the mock on a new connection, read to its end; a mock that has not
/// finished answering within [`support::CHILD_LIMIT`] fails the test (it hung).
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    hdrs: &[(&str, &str)],
) -> Reply {
    tokio::time::timeout(
        support::CHILD_LIMIT,
        send_unbounded(addr, method, path, body, hdrs),
    )
    .await
    .unwrap_or_else(|_| panic!("{method} {path}: no whole answer within the limit"))
}

async fn send_unbounded(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    hdrs: &[(&str, &str)],
) -> Reply {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut b = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "mock")
        .header("content-type", "application/json");
    for (k, v) in hdrs {
        b = b.header(*k, *v);
    }
    let req = b.body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let t0 = Instant::now();
    let resp = tx.send_request(req).await.unwrap();
    let mut r = Reply {
        status: resp.status().as_u16(),
        headers: resp.headers().clone(),
        headers_at: t0.elapsed(),
        ..Default::default()
    };
    let mut body = resp.into_body();
    let mut p = SseParser::default();
    let sse = r
        .headers
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap().starts_with("text/event-stream"));
    while let Some(f) = body.frame().await {
        match f {
            Ok(f) => {
                if let Some(d) = f.data_ref() {
                    let now = t0.elapsed();
                    r.body.extend_from_slice(d);
                    if sse {
                        p.feed(d, |e| r.events.push((now, e.unwrap().data)));
                    }
                }
            }
            Err(e) => {
                r.error = Some(e.to_string());
                break;
            }
        }
    }
    r
}

async fn post(addr: SocketAddr, path: &str, body: Value) -> Reply {
    send(addr, "POST", path, &body.to_string(), &[]).await
}

async fn metric(addr: SocketAddr, name: &str) -> f64 {
    let r = send(addr, "GET", "/metrics", "", &[]).await;
    let txt = String::from_utf8(r.body).unwrap();
    txt.lines()
        .find(|l| l.starts_with(name) && (name.ends_with('}') || l[name.len()..].starts_with('{')))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
}

/// The structure of a JSON value: objects keep their keys, leaves become type names.
fn shape(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), shape(v))).collect()),
        Value::Array(a) => Value::Array(a.iter().take(1).map(shape).collect()),
        Value::Null => json!("null"),
        Value::Bool(_) => json!("bool"),
        Value::Number(_) => json!("number"),
        Value::String(_) => json!("string"),
    }
}

fn fixture_events(name: &str) -> Vec<Value> {
    let raw = std::fs::read(crate::support::repo(&format!("fixtures/vllm/{name}"))).unwrap();
    let mut p = SseParser::default();
    let mut out = Vec::new();
    p.feed(&raw, |e| out.push(e.unwrap().data));
    assert_eq!(out.last().map(String::as_str), Some("[DONE]"));
    out[..out.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn assert_same_shapes(ours: &[Value], theirs: &[Value], what: &str) {
    assert_eq!(ours.len(), theirs.len(), "{what}: event count");
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        assert_eq!(
            shape(a),
            shape(b),
            "{what}: event {i}\nours:   {a}\nvllm:   {b}"
        );
    }
}

#[tokio::test]
async fn completion_streams_match_vllm_fixtures() {
    let h = start(fixed(1.0, 1.0)).await;
    let r = post(
        h.addr,
        "/v1/completions",
        json!({"model":"mock-llama","prompt":[0,3077,360,317,273,1383,16],"max_tokens":4,
               "ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.headers["content-type"],
        "text/event-stream; charset=utf-8"
    );
    assert!(r.done());
    let theirs = fixture_events("completions_tokenids_stream.sse");
    assert_same_shapes(&r.chunks(), &theirs, "token-id prompt with usage");
    assert_eq!(
        r.chunks()[4]["usage"],
        json!({"prompt_tokens":7,"total_tokens":11,"completion_tokens":4})
    );
    // text prompt without include_usage: fingerprint on the last content chunk
    let r = post(
        h.addr,
        "/v1/completions",
        json!({"model":"mock-llama","prompt":"Hello","max_tokens":4,"ignore_eos":true,"stream":true}),
    )
    .await;
    assert_same_shapes(
        &r.chunks(),
        &fixture_events("completions_text_stream.sse"),
        "text prompt",
    );
    // return_token_ids
    let r = post(
        h.addr,
        "/v1/completions",
        json!({"prompt":[0,3077,360],"max_tokens":2,"ignore_eos":true,"stream":true,"return_token_ids":true}),
    )
    .await;
    assert_same_shapes(
        &r.chunks(),
        &fixture_events("return_token_ids_stream.sse"),
        "return_token_ids",
    );
    assert_eq!(
        r.chunks()[0]["choices"][0]["prompt_token_ids"],
        json!([0, 3077, 360])
    );
    h.shutdown().await;
}

#[tokio::test]
async fn chat_stream_matches_vllm_fixture() {
    let h = start(fixed(1.0, 1.0)).await;
    let r = post(
        h.addr,
        "/v1/chat/completions",
        json!({"model":"mock-llama","messages":[{"role":"user","content":"Say something"}],
               "max_tokens":3,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}),
    )
    .await;
    assert!(r.done());
    let ours = r.chunks();
    assert_same_shapes(&ours, &fixture_events("chat_stream.sse"), "chat");
    assert_eq!(
        ours[0]["choices"][0]["delta"],
        json!({"role":"assistant","content":""})
    );
    assert_eq!(ours[4]["usage"]["completion_tokens"], 3);
    h.shutdown().await;
}

#[tokio::test]
async fn per_request_metrics_match_vllm_shapes() {
    let h = start(MockConfig {
        enable_per_request_metrics: true,
        ..fixed(20.0, 5.0)
    })
    .await;
    let txt = std::fs::read_to_string(crate::support::repo(
        "fixtures/vllm/per_request_metrics_example.txt",
    ))
    .unwrap();
    let body_line = txt.lines().find(|l| l.starts_with('{')).unwrap();
    let theirs_body: Value = serde_json::from_str(body_line).unwrap();
    let theirs_usage: Value = serde_json::from_str(
        &txt.lines()
            .find(|l| l.starts_with("data: ") && l.contains("metrics"))
            .unwrap()[6..],
    )
    .unwrap();
    let r = post(
        h.addr,
        "/v1/completions",
        json!({"prompt":[1,2,3,4,5,6,7],"max_tokens":4,"ignore_eos":true}),
    )
    .await;
    let ours = r.json();
    assert_eq!(
        shape(&ours),
        shape(&theirs_body),
        "non-streamed body\n{ours}"
    );
    let m = &ours["metrics"];
    assert_eq!(m["time_to_first_token_ms"], 20.0);
    assert_eq!(m["queue_time_ms"], 0.0);
    assert_eq!(m["generation_time_ms"], 15.0);
    assert_eq!(m["mean_itl_ms"], 5.0);
    assert!((m["tokens_per_second"].as_f64().unwrap() - 4.0 / 0.035).abs() < 1e-6);
    let r = post(
        h.addr,
        "/v1/completions",
        json!({"prompt":[1,2,3],"max_tokens":3,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}),
    )
    .await;
    let usage = r.chunks().pop().unwrap();
    assert_eq!(shape(&usage), shape(&theirs_usage));
    // without include_usage no chunk carries metrics
    let r = post(
        h.addr,
        "/v1/completions",
        json!({"prompt":[1,2,3],"max_tokens":3,"ignore_eos":true,"stream":true}),
    )
    .await;
    assert!(!String::from_utf8_lossy(&r.body).contains("metrics"));
    h.shutdown().await;
}

#[tokio::test]
async fn errors_are_vllm_shaped_and_never_hang() {
    let h = start(MockConfig {
        max_model_len: 64,
        kv_cache_tokens: 4096,
        ..fixed(1.0, 1.0)
    })
    .await;
    let err_shape =
        json!({"error":{"message":"string","type":"string","param":"string","code":"number"}});
    let r = post(
        h.addr,
        "/v1/completions",
        json!({"model":"nope","prompt":"x"}),
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(shape(&r.json()), err_shape);
    assert_eq!(
        r.json()["error"]["message"],
        "The model `nope` does not exist."
    );
    let long: Vec<u32> = (0..64).collect();
    for stream in [false, true] {
        let r = post(
            h.addr,
            "/v1/completions",
            json!({"prompt":long,"stream":stream}),
        )
        .await;
        assert_eq!(r.status, 400, "too-long prompt, stream={stream}");
        assert!(r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length is 64"));
    }
    let r = send(h.addr, "POST", "/v1/completions", "{\"prompt\": [1,2", &[]).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "BadRequestError");
    for bad in [
        json!({"prompt":"x","max_tokens":"5"}),
        json!({"prompt":{"a":1}}),
        json!({"prompt":[1,-2]}),
        json!({"prompt":[]}),
        json!({"prompt":"x","max_tokens":0}),
        json!({"prompt":"x","stream":"yes"}),
        json!([1, 2]),
    ] {
        let r = post(h.addr, "/v1/completions", bad.clone()).await;
        assert_eq!(r.status, 400, "{bad}");
        assert!(r.json()["error"]["message"].is_string());
    }
    let r = post(h.addr, "/v1/chat/completions", json!({"messages":"hi"})).await;
    assert_eq!(r.status, 400);
    let r = post(
        h.addr,
        "/v1/chat/completions",
        json!({"messages":[{"content":"no role"}]}),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(send(h.addr, "GET", "/nope", "", &[]).await.status, 404);
    assert_eq!(
        send(h.addr, "GET", "/v1/completions", "", &[]).await.status,
        405
    );
    // max_tokens beyond the context is cut silently (as vLLM 0.32 does)
    let r = post(
        h.addr,
        "/v1/completions",
        json!({"prompt":(0..60).collect::<Vec<u32>>(),"max_tokens":100,"ignore_eos":true}),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["usage"]["completion_tokens"], 4);
    h.shutdown().await;
}

#[tokio::test]
async fn models_health_tokenize() {
    let h = start(fixed(1.0, 1.0)).await;
    assert_eq!(send(h.addr, "GET", "/health", "", &[]).await.status, 200);
    let m = send(h.addr, "GET", "/v1/models", "", &[]).await.json();
    assert_eq!(m["data"][0]["id"], "mock-llama");
    let theirs: Value = serde_json::from_slice(
        &std::fs::read(crate::support::repo("fixtures/vllm/tokenize.json")).unwrap(),
    )
    .unwrap();
    let r = post(
        h.addr,
        "/tokenize",
        json!({"model":"mock-llama","prompt":"Hello world, this is a test"}),
    )
    .await;
    assert_eq!(shape(&r.json()), shape(&theirs));
    assert_eq!(
        r.json()["count"].as_u64().unwrap() as usize,
        r.json()["tokens"].as_array().unwrap().len()
    );
    // the count /tokenize gives is the prompt_tokens a completion reports
    let c = post(
        h.addr,
        "/v1/completions",
        json!({"prompt":"Hello world, this is a test","max_tokens":1}),
    )
    .await;
    assert_eq!(c.json()["usage"]["prompt_tokens"], r.json()["count"]);
    let r = post(
        h.addr,
        "/tokenize",
        json!({"messages":[{"role":"user","content":"hi"}]}),
    )
    .await;
    let chat = post(
        h.addr,
        "/v1/chat/completions",
        json!({"messages":[{"role":"user","content":"hi"}],"max_tokens":1}),
    )
    .await;
    assert_eq!(chat.json()["usage"]["prompt_tokens"], r.json()["count"]);
    assert_eq!(chat.json()["choices"][0]["message"]["role"], "assistant");
    h.shutdown().await;
}

/// `POST /detokenize` answers as vLLM does (`{"prompt": text}`), and its text tokenizes back
/// to the ids (BOS first, as `/tokenize` adds it), in a prompt and in a chat message alike;
/// ids outside the vocabulary, a list that is not ids and a list over the bound are 400s.
#[tokio::test]
async fn detokenize_answers_as_vllm_and_round_trips_through_tokenize() {
    let h = start(fixed(1.0, 1.0)).await;
    let t = post(
        h.addr,
        "/tokenize",
        json!({"model": "mock-llama", "prompt": "Hello world, this is a test of 12345 tokens"}),
    )
    .await
    .json();
    let ids: Vec<u64> = serde_json::from_value(t["tokens"].clone()).unwrap();
    assert_eq!(ids[0], 1, "BOS");
    let d = post(
        h.addr,
        "/detokenize",
        json!({"model": "mock-llama", "tokens": ids}),
    )
    .await;
    assert_eq!(d.status, 200);
    let d = d.json();
    assert_eq!(
        d.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["prompt"]
    );
    let text = d["prompt"].as_str().unwrap().to_string();
    let again = post(h.addr, "/tokenize", json!({"prompt": text}))
        .await
        .json();
    assert_eq!(again["tokens"], json!(ids));
    // ids chosen anywhere in the vocabulary, without BOS
    let mine: Vec<u32> = (0..500u32).map(|k| 256 + (k * 104_729) % 31_744).collect();
    let d = post(h.addr, "/detokenize", json!({"tokens": mine}))
        .await
        .json();
    let text = d["prompt"].as_str().unwrap().to_string();
    let again = post(h.addr, "/tokenize", json!({"prompt": text}))
        .await
        .json();
    assert_eq!(again["count"], 501);
    let back: Vec<u32> = serde_json::from_value(again["tokens"].clone()).unwrap();
    assert_eq!(back[1..], mine[..]);
    // as a chat message: the template's tokens around exactly those ids
    let chat = |content: &str| json!({"messages": [{"role": "user", "content": content}]});
    let one = post(h.addr, "/detokenize", json!({"tokens": [mine[0]]}))
        .await
        .json();
    let one = post(h.addr, "/tokenize", chat(one["prompt"].as_str().unwrap()))
        .await
        .json();
    let full = post(h.addr, "/tokenize", chat(&text)).await.json();
    assert_eq!(
        full["count"].as_u64().unwrap(),
        one["count"].as_u64().unwrap() + 499
    );
    for (body, what) in [
        (json!({"tokens": [300, 2]}), "token id 2 "),
        (json!({"tokens": [300, 32000]}), "token id 32000 "),
        (json!({"tokens": [300, -1]}), "list of token ids"),
        (json!({"tokens": "hello"}), "list of token ids"),
        (json!({"prompt": "hello"}), "list of token ids"),
        (json!({"tokens": vec![300; (1 << 20) + 1]}), "at most"),
    ] {
        let r = post(h.addr, "/detokenize", body).await;
        assert_eq!(r.status, 400, "{what}");
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.contains(what), "{msg}");
    }
    h.shutdown().await;
}

/// vLLM's rule, seen in /metrics: hits = min(floor(P/B)*B, floor((L-1)/B)*B), queries = L.
#[tokio::test]
async fn prefix_cache_hits_follow_vllm_rule_and_cut_ttft() {
    let h = start(MockConfig {
        block_size: 128,
        enable_per_request_metrics: true,
        cost: mock::CostModel {
            prefill_token_ms: 0.05,
            ..Default::default()
        },
        ..MockConfig::default()
    })
    .await;
    let prompt: Vec<u32> = (0..2048).map(|i| 100 + i).collect();
    let body = json!({"prompt":prompt,"max_tokens":2,"ignore_eos":true});
    let first = post(h.addr, "/v1/completions", body.clone()).await.json();
    assert_eq!(
        metric(h.addr, "vllm:prefix_cache_queries_total").await,
        2048.0
    );
    assert_eq!(metric(h.addr, "vllm:prefix_cache_hits_total").await, 0.0);
    let second = post(h.addr, "/v1/completions", body).await.json();
    // the same numbers real vLLM showed for the same experiment (fixtures/vllm/metrics_prefix_cache_before_after.txt)
    assert_eq!(
        metric(h.addr, "vllm:prefix_cache_queries_total").await,
        4096.0
    );
    assert_eq!(metric(h.addr, "vllm:prefix_cache_hits_total").await, 1920.0);
    let t1 = first["metrics"]["time_to_first_token_ms"].as_f64().unwrap();
    let t2 = second["metrics"]["time_to_first_token_ms"]
        .as_f64()
        .unwrap();
    assert!(t2 < t1 / 3.0, "cached TTFT {t2} ms vs cold {t1} ms");
    // a shared prefix of 300 tokens in a 1000-token prompt: floor(300/128)*128 = 256
    let mut other: Vec<u32> = (0..1000).map(|i| 100 + i).collect();
    for t in other.iter_mut().skip(300) {
        *t += 50_000;
    }
    post(
        h.addr,
        "/v1/completions",
        json!({"prompt":other,"max_tokens":1}),
    )
    .await;
    assert_eq!(
        metric(h.addr, "vllm:prefix_cache_hits_total").await,
        1920.0 + 256.0
    );
    assert_eq!(metric(h.addr, "vllm:prompt_tokens_total").await, 5096.0);
    h.shutdown().await;
}

#[tokio::test]
async fn batching_slows_tpot_and_queues_beyond_max_num_seqs() {
    let h = start(MockConfig {
        enable_per_request_metrics: true,
        max_num_seqs: 64,
        ..MockConfig::default()
    })
    .await;
    let req = |i: u32| json!({"prompt":(0..137).map(|t| t + i * 1000).collect::<Vec<u32>>(),"max_tokens":16,"ignore_eos":true});
    let sent = std::time::Instant::now();
    let lone = post(h.addr, "/v1/completions", req(0)).await.json();
    let lone_wall_ms = sent.elapsed().as_secs_f64() * 1e3;
    let lone_itl = lone["metrics"]["mean_itl_ms"].as_f64().unwrap();
    let lone_ttft = lone["metrics"]["time_to_first_token_ms"].as_f64().unwrap();
    // The engine's own TTFT is one 137-token step; the client also waits the front end's 56.4 ms:
    // about 70 ms in all, the calibration point.
    let c = mock::Profile::LLAMA8B.cost;
    let step = c.step_ms(137, 1, 137);
    assert!((lone_ttft - step).abs() < 0.01, "engine TTFT {lone_ttft}");
    assert!(
        (c.request_overhead_ms + step - 70.0).abs() < 0.5,
        "calibrated client TTFT"
    );
    assert!(
        lone_wall_ms >= c.request_overhead_ms + step + 15.0 * 7.9,
        "wall {lone_wall_ms} ms"
    );
    assert!((lone_itl - 8.0).abs() < 0.3, "calibrated TPOT: {lone_itl}");
    let mut tasks = Vec::new();
    for i in 1..=128 {
        let addr = h.addr;
        tasks.push(tokio::spawn(async move {
            post(addr, "/v1/completions", req(i)).await.json()
        }));
    }
    // How many of them share steps depends on how fast this machine sends them (the exact
    // batching figures are `mock::sched::tests::batching_slows_steps_and_queues_beyond_max_num_seqs`,
    // on the scheduler's own clock). What holds by construction: a step that decodes a sequence
    // costs at least what that sequence's lone step costs, so no request's ITL is below the lone one.
    for t in tasks {
        let v = t.await.unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 16);
        let itl = v["metrics"]["mean_itl_ms"].as_f64().unwrap();
        assert!(
            itl >= lone_itl - 1e-6,
            "ITL {itl} below the lone {lone_itl}"
        );
        assert!(v["metrics"]["queue_time_ms"].as_f64().unwrap() >= 0.0);
    }
    h.shutdown().await;
}

#[tokio::test]
async fn fixed_timing_is_exact_under_concurrency() {
    let h = start(MockConfig {
        enable_per_request_metrics: true,
        ..fixed(50.0, 10.0)
    })
    .await;
    let mut tasks = Vec::new();
    for i in 0..64u32 {
        let addr = h.addr;
        tasks.push(tokio::spawn(async move {
            post(
                addr,
                "/v1/completions",
                json!({"prompt":[i + 1, 2, 3],"max_tokens":20,"ignore_eos":true,"stream":true,
                       "stream_options":{"include_usage":true}}),
            )
            .await
        }));
    }
    for t in tasks {
        let r = t.await.unwrap();
        // The engine's schedule is exact, whatever the load.
        let m = r.chunks().last().unwrap()["metrics"].clone();
        assert_eq!(m["time_to_first_token_ms"], 50.0);
        assert_eq!(m["generation_time_ms"], 190.0);
        assert_eq!(m["mean_itl_ms"], 10.0);
        let ts = r.content_times();
        assert_eq!(ts.len(), 20);
        // Never early, by construction: the client's clock starts before its request is on the
        // wire, the mock counts from the kernel's receive stamp of it (never taken earlier than
        // the bytes arrived), and event i goes out no sooner than 50 + 10 i ms after that. How
        // late depends on the machine, so the upper bound only catches a hang.
        for (i, t) in ts.iter().enumerate() {
            let ms = t.as_secs_f64() * 1e3;
            let due = 50.0 + 10.0 * i as f64;
            assert!(
                (due..due + 30_000.0).contains(&ms),
                "event {i} at {ms} ms, due {due}"
            );
        }
    }
    // Every event's lateness was measured: 20 token events + the end of each stream.
    let l = h.lateness();
    assert_eq!(l.count, 64 * 21, "{l:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn tokens_per_event_makes_tpot_differ_from_itl() {
    let h = start(MockConfig {
        tokens_per_event: 4,
        enable_per_request_metrics: true,
        ..fixed(5.0, 8.0)
    })
    .await;
    let r = post(
        h.addr,
        "/v1/completions",
        json!({"prompt":[1,2,3],"max_tokens":13,"ignore_eos":true,"stream":true,"return_token_ids":true,"stream_options":{"include_usage":true}}),
    )
    .await;
    let chunks = r.chunks();
    let per_event: Vec<usize> = chunks
        .iter()
        .filter(|c| !c["choices"].as_array().unwrap().is_empty())
        .map(|c| c["choices"][0]["token_ids"].as_array().unwrap().len())
        .collect();
    assert_eq!(per_event, vec![1, 4, 4, 4]);
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 13);
    let ts = r.content_times();
    // Never early: the last event cannot reach the client before TTFT + 3 ITLs after the send.
    // (A client-side span between events is no bound: a late first event shortens it.)
    let last = ts[3].as_secs_f64() * 1e3;
    assert!(
        last >= 29.0,
        "TTFT 5 ms + 3 ITLs of 8 ms, never early: {last}"
    );
    // The engine's own timing: 3 event gaps of 8 ms carry 12 tokens, so TPOT = ITL / 4.
    let m = &chunks.last().unwrap()["metrics"];
    assert_eq!(m["generation_time_ms"], 24.0);
    assert_eq!(m["mean_itl_ms"], 2.0);
    h.shutdown().await;
}

#[tokio::test]
async fn outputs_are_deterministic_per_seed_and_honour_eos_rules() {
    let run = |seed: u64| async move {
        let h = start(MockConfig {
            seed,
            eos_prob: 0.1,
            ..fixed(1.0, 0.0)
        })
        .await;
        let mut out = Vec::new();
        for i in 0..8 {
            let r = post(
                h.addr,
                "/v1/completions",
                json!({"prompt":format!("question {i}"),"max_tokens":64,"min_tokens":5}),
            )
            .await
            .json();
            out.push((
                r["choices"][0]["text"].as_str().unwrap().to_string(),
                r["usage"]["completion_tokens"].as_u64().unwrap(),
                r["choices"][0]["finish_reason"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            ));
        }
        h.shutdown().await;
        out
    };
    let a = run(1).await;
    assert_eq!(a, run(1).await);
    assert_ne!(a, run(2).await);
    for (_, n, f) in &a {
        assert!((6..=64).contains(n), "min_tokens 5 and max 64: {n}");
        assert_eq!(f == "stop", *n < 64);
    }
    assert!(
        a.iter().any(|(_, _, f)| f == "stop"),
        "EOS at 10% per token ends some early"
    );
}

#[tokio::test]
async fn fault_status_and_seeded_rates() {
    let h = start(MockConfig {
        faults: mock::FaultConfig {
            status_rate: 0.5,
            status_codes: vec![429, 503],
            ..Default::default()
        },
        ..fixed(0.0, 0.0)
    })
    .await;
    let mut codes = std::collections::BTreeMap::new();
    for _ in 0..40 {
        let r = post(
            h.addr,
            "/v1/completions",
            json!({"prompt":"x","max_tokens":1}),
        )
        .await;
        *codes.entry(r.status).or_insert(0) += 1;
        if r.status != 200 {
            assert_eq!(r.json()["error"]["code"], r.status);
        }
    }
    assert!(
        codes[&200] >= 8 && codes[&429] >= 4 && codes[&503] >= 4,
        "{codes:?}"
    );
    let r = send(
        h.addr,
        "POST",
        "/v1/completions",
        r#"{"prompt":"x"}"#,
        &[("x-mock-fault", "none")],
    )
    .await;
    assert_eq!(r.status, 200, "the header overrides the rates");
    let r = send(
        h.addr,
        "POST",
        "/v1/completions",
        r#"{"prompt":"x"}"#,
        &[("x-mock-fault", "status=500")],
    )
    .await;
    assert_eq!(r.status, 500);
    assert_eq!(r.json()["error"]["type"], "InternalServerError");
    let r = send(
        h.addr,
        "POST",
        "/v1/completions",
        r#"{"prompt":"x"}"#,
        &[("x-mock-fault", "bogus")],
    )
    .await;
    assert_eq!(r.status, 400);
    assert!(metric(h.addr, "retrace_mock_faults_injected_total").await >= 9.0);
    h.shutdown().await;
}

#[tokio::test]
async fn fault_stalls_slow_headers_and_reset() {
    let h = start(fixed(10.0, 2.0)).await;
    let body = r#"{"prompt":"x","max_tokens":10,"ignore_eos":true,"stream":true}"#;
    let r = send(
        h.addr,
        "POST",
        "/v1/completions",
        body,
        &[("x-mock-fault", "stall-first=300")],
    )
    .await;
    let ts = r.content_times();
    assert!(
        ts[0] >= Duration::from_millis(310),
        "stalled first token at {:?}",
        ts[0]
    );
    assert!(r.done());
    let r = send(
        h.addr,
        "POST",
        "/v1/completions",
        body,
        &[("x-mock-fault", "stall-mid=3:300")],
    )
    .await;
    let ts = r.content_times();
    let gaps: Vec<f64> = ts
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
        .collect();
    // The stall comes after the third event: the fourth cannot arrive before 300 ms after the
    // send (a client-side gap is no lower bound: a late third event shortens it).
    assert!(
        ts[3] >= Duration::from_millis(300) && gaps[..2].iter().all(|g| *g < 300.0),
        "{ts:?} {gaps:?}"
    );
    let r = send(
        h.addr,
        "POST",
        "/v1/completions",
        body,
        &[("x-mock-fault", "slow-headers=300")],
    )
    .await;
    assert!(
        r.headers_at >= Duration::from_millis(300),
        "{:?}",
        r.headers_at
    );
    assert!(r.done());
    let generated = metric(h.addr, "vllm:generation_tokens_total").await;
    let r = send(
        h.addr,
        "POST",
        "/v1/completions",
        body,
        &[("x-mock-fault", "reset-after=3")],
    )
    .await;
    assert_eq!(r.status, 200);
    // The RST follows the 3rd token by 20 ms; a client slower than that to read loses the
    // unread tokens (the kernel discards them), so it sees at most 3; the engine made exactly 3.
    assert!(r.content_times().len() <= 3);
    let more = metric(h.addr, "vllm:generation_tokens_total").await - generated;
    assert_eq!(more, 3.0, "tokens generated before the reset");
    assert!(!r.done());
    assert!(r.error.is_some(), "the stream must end in an error");
    // non-streaming reset: the whole exchange fails
    let stream = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    let (mut tx, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = http::Request::post("/v1/completions")
        .header("host", "m")
        .header("x-mock-fault", "reset-after=1")
        .body(Full::new(Bytes::from_static(
            br#"{"prompt":"x","max_tokens":5}"#,
        )))
        .unwrap();
    assert!(tx.send_request(req).await.is_err());
    // the server keeps serving
    assert_eq!(
        post(
            h.addr,
            "/v1/completions",
            json!({"prompt":"x","max_tokens":2})
        )
        .await
        .status,
        200
    );
    h.shutdown().await;
}

#[tokio::test]
async fn shutdown_ends_open_streams() {
    let h = start(fixed(10.0, 50.0)).await;
    let addr = h.addr;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = http::Request::post("/v1/completions")
        .header("host", "m")
        .body(Full::new(Bytes::from_static(
            br#"{"prompt":"x","max_tokens":1000,"ignore_eos":true,"stream":true}"#,
        )))
        .unwrap();
    let mut body = tx.send_request(req).await.unwrap().into_body();
    // The stream is live: its first event has arrived.
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.data_ref().is_some_and(|d| d.starts_with(b"data: ")));
    let t0 = Instant::now();
    let shut = tokio::spawn(h.shutdown());
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(f) = body.frame().await {
            match f {
                Ok(f) => rest.extend_from_slice(f.data_ref().map(|d| &d[..]).unwrap_or(&[])),
                Err(_) => break,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the open stream must end on shutdown");
    shut.await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert!(
        !String::from_utf8_lossy(&rest).contains("[DONE]"),
        "1000 tokens at 50 ms cannot have finished"
    );
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "listener closed"
    );
}

#[tokio::test]
async fn hf_tokenizer_file_is_used_exactly() {
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::Whitespace;
    let vocab: std::collections::HashMap<String, u32> =
        [("[UNK]", 0), ("hello", 1), ("world", 2), ("again", 3)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
    let model = WordLevel::builder()
        .vocab(vocab.into_iter().collect())
        .unk_token("[UNK]".into())
        .build()
        .unwrap();
    let mut tk = tokenizers::Tokenizer::new(model);
    tk.with_pre_tokenizer(Some(Whitespace {}));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    tk.save(&path, false).unwrap();
    let h = start(MockConfig {
        tokenizer: Some(path),
        ..fixed(1.0, 0.0)
    })
    .await;
    let r = post(
        h.addr,
        "/tokenize",
        json!({"prompt":"hello world again zzz"}),
    )
    .await
    .json();
    assert_eq!(r["tokens"], json!([1, 2, 3, 0]));
    let c = post(
        h.addr,
        "/v1/completions",
        json!({"prompt":"hello world","max_tokens":3,"ignore_eos":true}),
    )
    .await
    .json();
    assert_eq!(c["usage"]["prompt_tokens"], 2);
    let text = c["choices"][0]["text"].as_str().unwrap();
    assert!(
        text.split_whitespace()
            .all(|w| ["[UNK]", "hello", "world", "again"].contains(&w)),
        "{text}"
    );
    h.shutdown().await;
    let bad = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let e = mock::start(
        bad,
        MockConfig {
            tokenizer: Some(dir.path().join("missing.json")),
            ..MockConfig::default()
        },
    )
    .await
    .err()
    .unwrap();
    assert!(format!("{e:#}").contains("missing.json"));
}

#[test]
fn config_errors_name_the_flag() {
    let cfg = |args: &[&str]| {
        let mut v = vec!["mock"];
        v.extend_from_slice(args);
        match crate::support::cli(&v).command {
            retrace::cli::Command::Mock(a) => a.config(),
            _ => unreachable!(),
        }
    };
    assert_eq!(
        cfg(&["--fixed-timing", "50,10"]).unwrap().fixed_timing,
        Some((50.0, 10.0))
    );
    assert!(format!("{:#}", cfg(&["--fixed-timing", "50"]).unwrap_err()).contains("--fixed-timing"));
    assert!(format!("{:#}", cfg(&["--max-num-seqs", "0"]).unwrap_err()).contains("--max-num-seqs"));
    for (flag, bad) in [
        ("--block-size", "0"),
        ("--seq-ms", "NaN"),
        ("--eos-prob", "2"),
    ] {
        let e = format!("{:#}", cfg(&[flag, bad]).unwrap_err());
        assert!(e.contains(flag) && e.contains(bad), "{e}");
    }
    assert!(
        format!("{:#}", cfg(&["--kv-cache-tokens", "100"]).unwrap_err())
            .contains("--kv-cache-tokens")
    );
    assert!(
        format!("{:#}", cfg(&["--fault-reset-rate", "2"]).unwrap_err())
            .contains("--fault-reset-rate")
    );
    assert!(
        format!("{:#}", cfg(&["--fault-status-codes", "200"]).unwrap_err())
            .contains("--fault-status-codes")
    );
}

/// 40 streams due together: more than the engine thread writes itself per hand-over, so the
/// burst goes to the writer threads; every stream keeps its events in order.
#[tokio::test]
async fn streams_keep_order_when_a_burst_goes_to_the_writer_threads() {
    let h = start(fixed(30.0, 5.0)).await;
    let mut tasks = Vec::new();
    for i in 0..40u32 {
        let addr = h.addr;
        tasks.push(tokio::spawn(async move {
            post(
                addr,
                "/v1/completions",
                json!({"prompt":[i + 1, 7],"max_tokens":12,"ignore_eos":true,"stream":true,
                       "return_token_ids":true}),
            )
            .await
        }));
    }
    for t in tasks {
        let r = t.await.unwrap();
        assert!(r.done(), "stream ended with [DONE]");
        let chunks = r.chunks();
        assert_eq!(chunks.len(), 12);
        let last = &chunks[11]["choices"][0];
        assert_eq!(last["finish_reason"], "length");
        assert!(chunks[..11]
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null()));
    }
    assert_eq!(h.lateness().count, 40 * 13);
    h.shutdown().await;
}

#[tokio::test]
async fn metrics_use_vllm_names() {
    let h = start(fixed(1.0, 1.0)).await;
    post(
        h.addr,
        "/v1/completions",
        json!({"prompt":"warm up","max_tokens":2}),
    )
    .await;
    let ours = String::from_utf8(send(h.addr, "GET", "/metrics", "", &[]).await.body).unwrap();
    let theirs = std::fs::read_to_string(crate::support::repo(
        "fixtures/vllm/metrics_prefix_cache_before_after.txt",
    ))
    .unwrap();
    for line in theirs
        .lines()
        .filter(|l| l.starts_with("vllm:") && !l.contains("_sum{"))
    {
        let name_labels = line
            .rsplit_once(' ')
            .unwrap()
            .0
            .replace("tiny-llama", "mock-llama");
        assert!(
            ours.lines().any(|l| l.starts_with(&name_labels)),
            "missing {name_labels}"
        );
    }
    for name in [
        "vllm:num_requests_running{",
        "vllm:num_requests_waiting{",
        "vllm:kv_cache_usage_perc{",
        "vllm:generation_tokens_total{",
        "vllm:time_to_first_token_seconds_bucket{",
        "vllm:inter_token_latency_seconds_count{",
        "retrace_mock_emit_lateness_seconds_bucket{",
    ] {
        assert!(ours.contains(name), "missing {name}");
    }
    assert_eq!(metric(h.addr, "vllm:generation_tokens_total").await, 2.0);
    h.shutdown().await;
}

#[tokio::test]
async fn client_disconnect_frees_the_engine() {
    let h = start(MockConfig {
        enable_per_request_metrics: true,
        ..MockConfig::default()
    })
    .await;
    let stream = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    let (mut tx, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = http::Request::post("/v1/completions")
        .header("host", "m")
        .body(Full::new(Bytes::from_static(
            br#"{"prompt":[1,2,3],"max_tokens":5000,"ignore_eos":true,"stream":true}"#,
        )))
        .unwrap();
    let mut body = tx.send_request(req).await.unwrap().into_body();
    body.frame().await.unwrap().unwrap();
    assert_eq!(metric(h.addr, "vllm:num_requests_running").await, 1.0);
    assert!(metric(h.addr, "vllm:kv_cache_usage_perc").await > 0.0);
    drop(body);
    drop(tx);
    conn.abort();
    let t0 = Instant::now();
    while metric(h.addr, "vllm:num_requests_running").await != 0.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "request still running after disconnect"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metric(h.addr, "vllm:kv_cache_usage_perc").await, 0.0);
    assert!(metric(h.addr, "vllm:request_success_total{engine=\"0\",model_name=\"mock-llama\",finished_reason=\"abort\"}").await >= 1.0);
    h.shutdown().await;
}

#[tokio::test]
async fn batched_prompts_and_n_give_indexed_choices() {
    let h = start(fixed(2.0, 1.0)).await;
    let r = post(
        h.addr,
        "/v1/completions",
        json!({"prompt":["a b c",[5,6,7]],"n":2,"max_tokens":3,"ignore_eos":true}),
    )
    .await
    .json();
    let idx: Vec<u64> = r["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, vec![0, 1, 2, 3]);
    assert_eq!(r["usage"]["completion_tokens"], 12);
    // vLLM counts each prompt once in usage, whatever `n`.
    let one = post(
        h.addr,
        "/v1/completions",
        json!({"prompt":["a b c",[5,6,7]],"n":1,"max_tokens":3,"ignore_eos":true}),
    )
    .await
    .json();
    assert!(one["usage"]["prompt_tokens"].as_u64().unwrap() > 3);
    assert_eq!(r["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"]);
    let chat = |n: u32| json!({"messages":[{"role":"user","content":"hi"}],"n":n,"max_tokens":2,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}});
    let r = post(h.addr, "/v1/chat/completions", chat(2)).await;
    assert!(r.done());
    let chunks = r.chunks();
    let one = post(h.addr, "/v1/chat/completions", chat(1)).await.chunks();
    assert_eq!(
        chunks.last().unwrap()["usage"]["prompt_tokens"],
        one.last().unwrap()["usage"]["prompt_tokens"]
    );
    let roles = chunks
        .iter()
        .filter(|c| c["choices"][0]["delta"]["role"] == "assistant")
        .count();
    assert_eq!(roles, 2, "one role chunk per choice");
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 4);
    let r = post(
        h.addr,
        "/v1/completions",
        json!({"prompt":"x","stream_options":{"include_usage":true}}),
    )
    .await;
    assert_eq!(r.status, 400, "stream_options without stream");
    h.shutdown().await;
}

/// Same seed and same (sequential) requests: the same cost-model timings, to the nanosecond.
#[tokio::test]
async fn cost_model_timings_are_deterministic() {
    let run = || async {
        let h = start(MockConfig {
            enable_per_request_metrics: true,
            ..MockConfig::default()
        })
        .await;
        let mut out = Vec::new();
        for (i, len) in [137u32, 40, 300].into_iter().enumerate() {
            let p: Vec<u32> = (0..len).map(|t| t + i as u32).collect();
            let r = post(
                h.addr,
                "/v1/completions",
                json!({"prompt":p,"max_tokens":6,"ignore_eos":true}),
            )
            .await
            .json();
            out.push((r["choices"][0]["text"].clone(), r["metrics"].clone()));
        }
        h.shutdown().await;
        out
    };
    let a = run().await;
    assert_eq!(a, run().await);
    // 300-token prompt: 7.9 + 0.04*300 + 0.12 + 0.00005*300 ms (the front end's latency is not
    // the engine's)
    let t = a[2].1["time_to_first_token_ms"].as_f64().unwrap();
    assert!((t - 20.035).abs() < 0.01, "{t}");
}

/// Stalls in cost-model mode hold back emissions past the request's end in the engine.
#[tokio::test]
async fn stalls_in_cost_model_mode_deliver_everything() {
    let h = start(MockConfig {
        cost: mock::CostModel {
            step_overhead_ms: 1.0,
            prefill_token_ms: 0.01,
            ..Default::default()
        },
        ..MockConfig::default()
    })
    .await;
    let body = r#"{"prompt":"x y z","max_tokens":6,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}"#;
    for fault in ["stall-first=200", "stall-mid=2:200", "reset-after=2"] {
        let generated = metric(h.addr, "vllm:generation_tokens_total").await;
        let r = send(
            h.addr,
            "POST",
            "/v1/completions",
            body,
            &[("x-mock-fault", fault)],
        )
        .await;
        let ts = r.content_times();
        if fault.starts_with("reset") {
            // At most 2 reach a slow client before the RST (see the test above); 2 were made.
            assert!(ts.len() <= 2, "{fault}");
            let more = metric(h.addr, "vllm:generation_tokens_total").await - generated;
            assert_eq!(more, 2.0, "{fault}");
            assert!(r.error.is_some() && !r.done(), "{fault}");
            continue;
        }
        assert!(r.done(), "{fault}: {:?}", r.events);
        assert_eq!(ts.len(), 6, "{fault}");
        assert_eq!(r.chunks().last().unwrap()["usage"]["completion_tokens"], 6);
        // The stalled event cannot arrive before the stall has passed since the send. (A gap
        // between two client-side arrivals is no bound: a late event before it shortens it.)
        let stalled = if fault.starts_with("stall-first") {
            ts[0]
        } else {
            ts[2]
        };
        assert!(stalled >= Duration::from_millis(200), "{fault}: {ts:?}");
    }
    h.shutdown().await;
}

/// Arbitrary bodies and field types: always an HTTP answer (200/400/404), never a panic or a hang.
#[tokio::test]
async fn arbitrary_requests_get_answers() {
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    let h = start(MockConfig {
        max_model_len: 256,
        kv_cache_tokens: 4096,
        ..fixed(0.0, 0.0)
    })
    .await;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (0u64..300).prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f)
            .map(Value::Number)
            .unwrap_or(Value::Null)),
        ".{0,12}".prop_map(Value::from),
    ];
    let val = leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("role".to_string()),
                    Just("content".to_string()),
                    ".{0,6}"
                ],
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    let keys = prop_oneof![
        Just("prompt"),
        Just("messages"),
        Just("max_tokens"),
        Just("min_tokens"),
        Just("n"),
        Just("stream"),
        Just("stream_options"),
        Just("ignore_eos"),
        Just("model"),
        Just("return_token_ids"),
        Just("temperature")
    ];
    let body = proptest::collection::btree_map(keys, val, 0..6);
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for i in 0..150 {
        let b: Value = Value::Object(
            body.new_tree(&mut runner)
                .unwrap()
                .current()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        );
        let path = if i % 2 == 0 {
            "/v1/completions"
        } else {
            "/v1/chat/completions"
        };
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            send(h.addr, "POST", path, &b.to_string(), &[]),
        )
        .await
        .unwrap_or_else(|_| panic!("hang on {b}"));
        assert!([200, 400, 404].contains(&r.status), "{} on {b}", r.status);
        if r.status != 200 {
            assert!(r.json()["error"]["message"].is_string());
        }
    }
    for raw in ["", "{", "nul", "\u{0}", "[[[[", "{\"prompt\":\"\\ud800\"}"] {
        assert_eq!(
            send(h.addr, "POST", "/v1/completions", raw, &[])
                .await
                .status,
            400,
            "{raw:?}"
        );
    }
    assert_eq!(send(h.addr, "GET", "/health", "", &[]).await.status, 200);
    h.shutdown().await;
}

/// Chunked prefill: a 200-token prompt with a 64-token step budget takes 4 steps (64+64+64+8).
#[tokio::test]
async fn chunked_prefill_spreads_a_long_prompt_over_steps() {
    let h = start(MockConfig {
        enable_per_request_metrics: true,
        max_num_batched_tokens: 64,
        cost: mock::CostModel {
            request_overhead_ms: 0.0,
            step_overhead_ms: 1.0,
            prefill_token_ms: 0.1,
            seq_ms: 0.0,
            context_token_ms: 0.0,
        },
        ..MockConfig::default()
    })
    .await;
    let r = post(
        h.addr,
        "/v1/completions",
        json!({"prompt":(0..200).collect::<Vec<u32>>(),"max_tokens":3,"ignore_eos":true}),
    )
    .await
    .json();
    let m = &r["metrics"];
    let ttft = m["time_to_first_token_ms"].as_f64().unwrap();
    assert!((ttft - (3.0 * 7.4 + 1.8)).abs() < 0.001, "{ttft}");
    assert!(
        (m["mean_itl_ms"].as_f64().unwrap() - 1.0).abs() < 0.001,
        "decode steps cost the overhead only"
    );
    h.shutdown().await;
}

/// Reads raw HTTP/1.1 responses from `s` until `want` complete ones have arrived (or 10 s).
/// Returns each response's head and its de-chunked (or content-length) body.
async fn read_raw_responses(s: &mut tokio::net::TcpStream, want: usize) -> Vec<(String, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // Try to parse `want` responses from what we have.
        let mut out = Vec::new();
        let mut pos = 0;
        while out.len() < want {
            let Some(h) = buf[pos..].windows(4).position(|w| w == b"\r\n\r\n") else {
                break;
            };
            let head = String::from_utf8_lossy(&buf[pos..pos + h]).to_string();
            let mut p = pos + h + 4;
            let mut body = Vec::new();
            let lower = head.to_ascii_lowercase();
            let complete = if lower.contains("transfer-encoding: chunked") {
                loop {
                    let Some(l) = buf[p..].windows(2).position(|w| w == b"\r\n") else {
                        break false;
                    };
                    let n = usize::from_str_radix(std::str::from_utf8(&buf[p..p + l]).unwrap(), 16)
                        .unwrap();
                    if buf.len() < p + l + 2 + n + 2 {
                        break false;
                    }
                    body.extend_from_slice(&buf[p + l + 2..p + l + 2 + n]);
                    p += l + 2 + n + 2;
                    if n == 0 {
                        break true;
                    }
                }
            } else {
                let n: usize = lower
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .map(|v| v.trim().parse().unwrap())
                    .unwrap_or(0);
                if buf.len() >= p + n {
                    body.extend_from_slice(&buf[p..p + n]);
                    p += n;
                    true
                } else {
                    false
                }
            };
            if !complete {
                break;
            }
            out.push((head, body));
            pos = p;
        }
        if out.len() == want {
            return out;
        }
        let mut tmp = [0u8; 65536];
        let n = tokio::time::timeout_at(deadline.into(), s.read(&mut tmp))
            .await
            .expect("responses within 10 s")
            .unwrap();
        assert!(
            n > 0,
            "connection closed early: {}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&tmp[..n]);
    }
}

#[tokio::test]
async fn direct_stream_writer_keeps_http_framing_keep_alive_and_pipelining() {
    use tokio::io::AsyncWriteExt;
    let h = start(fixed(5.0, 2.0)).await;
    let body = r#"{"prompt":[1,2,3],"max_tokens":5,"ignore_eos":true,"stream":true}"#;
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: m\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    // Two streams and a /health pipelined in one write on one connection, then one more stream.
    let mut s = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    let pipelined = format!("{req}{req}GET /health HTTP/1.1\r\nhost: m\r\n\r\n");
    s.write_all(pipelined.as_bytes()).await.unwrap();
    let rs = read_raw_responses(&mut s, 3).await;
    s.write_all(req.as_bytes()).await.unwrap();
    let more = read_raw_responses(&mut s, 1).await;
    for (i, (head, body)) in rs.iter().chain(more.iter()).enumerate() {
        let mut lines = head.lines();
        assert_eq!(
            lines.next(),
            Some("HTTP/1.1 200 OK"),
            "response {i}: {head}"
        );
        let mut names: Vec<String> = lines
            .map(|l| l.split(':').next().unwrap().to_ascii_lowercase())
            .collect();
        names.sort();
        if i == 2 {
            assert_eq!(names, ["content-length", "content-type", "date"], "{head}");
            continue;
        }
        // The same head hyper writes for a chunked SSE response, and no `connection: close`.
        assert_eq!(
            names,
            ["content-type", "date", "transfer-encoding"],
            "{head}"
        );
        assert!(head.contains("content-type: text/event-stream; charset=utf-8"));
        let mut p = SseParser::default();
        let mut evs = Vec::new();
        p.feed(body, |e| evs.push(e.unwrap().data));
        assert_eq!(evs.len(), 6, "5 token events and [DONE]: {evs:?}");
        assert_eq!(evs[5], "[DONE]");
        let last: Value = serde_json::from_str(&evs[4]).unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "length");
    }
    // HTTP/1.0: no chunks, the body ends with the connection (as hyper frames it).
    let mut s = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    s.write_all(req.replace("HTTP/1.1", "HTTP/1.0").as_bytes())
        .await
        .unwrap();
    let mut all = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_to_end(&mut s, &mut all),
    )
    .await
    .expect("HTTP/1.0 stream ends")
    .unwrap();
    let txt = String::from_utf8_lossy(&all);
    assert!(txt.starts_with("HTTP/1.0 200 OK\r\n"), "{txt}");
    assert!(!txt.to_ascii_lowercase().contains("transfer-encoding"));
    assert!(txt.ends_with("data: [DONE]\n\n"), "{txt}");
    // Both framings carry the same SSE bytes once de-chunked, but for the response id and the
    // `created` second.
    let hyper_body = &txt[txt.find("\r\n\r\n").unwrap() + 4..];
    let norm = |b: &str| {
        let id = b
            .split("\"id\":\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .to_string();
        let created = b
            .split("\"created\":")
            .nth(1)
            .unwrap()
            .split(',')
            .next()
            .unwrap()
            .to_string();
        b.replace(&id, "ID")
            .replace(&format!("\"created\":{created},"), "\"created\":0,")
    };
    let direct_body = String::from_utf8(rs[0].1.clone()).unwrap();
    assert_eq!(norm(&direct_body), norm(hyper_body));
    // Lateness is measured for every event of the direct streams (4 x (5 + [DONE])).
    assert!(h.lateness().count >= 24, "{:?}", h.lateness());
    h.shutdown().await;
}

#[tokio::test]
async fn profiles_pick_the_cost_model_and_flags_override_them() {
    let cfg = |args: &[&str]| {
        let mut v = vec!["mock"];
        v.extend_from_slice(args);
        match crate::support::cli(&v).command {
            retrace::cli::Command::Mock(a) => a.config(),
            _ => unreachable!(),
        }
    };
    // The default is the calibrated profile, exactly as before profiles existed.
    let d = cfg(&[]).unwrap();
    assert_eq!(d.cost, mock::Profile::LLAMA8B.cost);
    assert_eq!(d.cost, mock::CostModel::default());
    assert_eq!(d.max_num_batched_tokens, 2048);
    let f = cfg(&["--profile", "fast"]).unwrap();
    assert_eq!(f.cost, mock::Profile::FAST.cost);
    assert_eq!(f.max_num_batched_tokens, 8192);
    // replay's embedded target is the same engine as `--profile fast`.
    let e = retrace::replay::embedded_mock_config();
    assert_eq!(
        (e.cost, e.max_num_batched_tokens),
        (f.cost, f.max_num_batched_tokens)
    );
    // A flag given explicitly wins over the profile; the others keep the profile's values.
    let o = cfg(&[
        "--profile",
        "fast",
        "--prefill-token-ms",
        "0.1",
        "--max-num-batched-tokens",
        "4096",
    ])
    .unwrap();
    assert_eq!(o.cost.prefill_token_ms, 0.1);
    assert_eq!(
        o.cost.step_overhead_ms,
        mock::Profile::FAST.cost.step_overhead_ms
    );
    assert_eq!(o.max_num_batched_tokens, 4096);
    let err = format!("{:#}", cfg(&["--profile", "h200"]).unwrap_err());
    assert!(
        err.contains("--profile") && err.contains("llama8b") && err.contains("fast"),
        "{err}"
    );

    // A Mooncake-size prompt (7,000 tokens): one 8,192-token step on `fast`, which the engine
    // reports exactly (5 + 0.005 x 7000 + 0.05 + 0.00004 x 7000 ms); `llama8b` needs four
    // 2,048-token chunks of about 90 ms each.
    let h = start(MockConfig {
        enable_per_request_metrics: true,
        ..MockConfig::with_profile(mock::Profile::FAST)
    })
    .await;
    let prompt: Vec<u32> = (0..7000).map(|i| 1000 + i % 20000).collect();
    let r = post(
        h.addr,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 2, "ignore_eos": true, "stream": true,
               "stream_options": {"include_usage": true}}),
    )
    .await;
    let chunks = r.chunks();
    let m = &chunks.last().unwrap()["metrics"];
    let ttft = m["time_to_first_token_ms"].as_f64().unwrap();
    let want = mock::Profile::FAST.cost.step_ms(7000, 1, 7000);
    assert!(
        (ttft - want).abs() < 1e-3,
        "TTFT {ttft} ms, cost model {want} ms"
    );
    assert!(ttft < 50.0);
    let slow = mock::Profile::LLAMA8B.cost.step_ms(2048, 1, 2048);
    assert!(
        slow * 3.0 > 4.0 * want,
        "llama8b: {slow} ms per 2,048-token chunk, fast {want} ms for all 7,000"
    );
    h.shutdown().await;
}

/// What fixed timing counts from: the read that completed the request (its body's last bytes
/// reaching the socket). A request whose body arrives 150 ms after its head gets its first token
/// TTFT after the body's last bytes were sent, never sooner. Generous bounds (loaded machine).
#[tokio::test]
async fn fixed_timing_counts_from_the_read_that_completed_the_request() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = json!({"model": "mock-llama", "prompt": [1, 2, 3, 4], "max_tokens": 2,
        "ignore_eos": true, "stream": true})
    .to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: mock\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let h = start(fixed(200.0, 5.0)).await;
    let mut s = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    // Head and the first byte of the body, then the rest of the body 150 ms later.
    let (first, rest) = body.split_at(1);
    s.write_all(format!("{head}{first}").as_bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let t_body = Instant::now();
    s.write_all(rest.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let first_token = loop {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut tmp))
            .await
            .expect("a response within 10 s")
            .unwrap();
        assert!(n > 0, "closed early");
        buf.extend_from_slice(&tmp[..n]);
        if buf.windows(9).any(|w| w == b"\"choices\"") {
            break Instant::now();
        }
    };
    let since_body = first_token - t_body;
    assert!(
        since_body >= Duration::from_millis(199),
        "first token {since_body:?} after the request was complete"
    );
    h.shutdown().await;
}

/// Reads until the peer closes the connection (EOF or reset); panics if it stays open 20 s.
async fn closed_by_peer(s: &mut tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut tmp = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut tmp)).await {
            Err(_) => panic!("the mock kept the connection open"),
            Ok(Ok(0) | Err(_)) => return,
            Ok(Ok(_)) => {}
        }
    }
}

/// Issue: the mock never timed out half-sent heads or idle connections (300 partial heads
/// survived 90 s). With short limits: a connection that sends nothing, half a head, a head and
/// half a body, or goes quiet after a response is closed; a stream that lasts longer than both
/// limits is not cut.
#[tokio::test]
async fn mock_closes_half_sent_heads_and_idle_connections() {
    use tokio::io::AsyncWriteExt;
    let h = start(MockConfig {
        timeouts: mock::ConnTimeouts {
            request: Duration::from_millis(200),
            idle: Duration::from_millis(300),
        },
        ..fixed(1.0, 100.0)
    })
    .await;
    let connect = || tokio::net::TcpStream::connect(h.addr);
    let body = r#"{"prompt":[1,2,3],"max_tokens":8,"ignore_eos":true,"stream":true}"#;
    let post = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: m\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    for (what, sent) in [
        ("nothing", String::new()),
        (
            "half a head",
            "POST /v1/completions HTTP/1.1\r\nhost: m\r\n".to_string(),
        ),
        ("half a body", format!("{post}{}", &body[..10])),
        (
            "a whole request, then nothing",
            "GET /health HTTP/1.1\r\nhost: m\r\n\r\n".to_string(),
        ),
    ] {
        let t = Instant::now(); // before anything the mock's clocks count from
        let mut s = connect().await.unwrap();
        s.write_all(sent.as_bytes()).await.unwrap();
        closed_by_peer(&mut s).await;
        assert!(
            t.elapsed() >= Duration::from_millis(190),
            "{what}: closed too soon"
        );
    }
    // 8 tokens 100 ms apart: the stream outlasts both limits and still ends with [DONE].
    let r = post_raw(h.addr, &format!("{post}{body}")).await;
    assert!(
        r.contains("data: [DONE]") && r.ends_with("0\r\n\r\n"),
        "{r}"
    );
    h.shutdown().await;
}

/// Sends `raw` on a fresh connection and reads until the terminating chunk of a streamed reply.
async fn post_raw(addr: SocketAddr, raw: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(raw.as_bytes()).await.unwrap();
    let mut all = Vec::new();
    let mut tmp = [0u8; 4096];
    while !all.ends_with(b"0\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut tmp))
            .await
            .expect("the stream ends within 20 s")
            .unwrap();
        assert!(
            n > 0,
            "closed mid-stream: {}",
            String::from_utf8_lossy(&all)
        );
        all.extend_from_slice(&tmp[..n]);
    }
    String::from_utf8_lossy(&all).into_owned()
}

/// A stream pipelined behind a response larger than the socket buffers, which the client does not
/// read at first, goes out after it (the take-over waits until hyper holds no unsent bytes): both
/// responses arrive whole and in order.
#[tokio::test]
async fn pipelined_stream_waits_for_an_unsent_response() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = start(fixed(1.0, 1.0)).await;
    let big = json!({"prompt": "w ".repeat(3_000_000), "return_token_strs": true}).to_string();
    let stream = r#"{"prompt":[1,2,3],"max_tokens":3,"ignore_eos":true,"stream":true}"#;
    let post = |path: &str, body: &str, extra: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: m\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let mut s = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    let reqs =
        post("/tokenize", &big, "") + &post("/v1/completions", stream, "connection: close\r\n");
    s.write_all(reqs.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // the mock's socket fills meanwhile
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut all))
        .await
        .expect("both responses within 60 s")
        .unwrap();
    let split = |b: &[u8]| b.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let h1 = split(&all);
    let head1 = String::from_utf8_lossy(&all[..h1]).to_ascii_lowercase();
    let n: usize = head1
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .unwrap()
        .parse()
        .unwrap();
    let body1 = &all[h1 + 4..h1 + 4 + n];
    let v: Value = serde_json::from_slice(body1).unwrap();
    assert_eq!(
        v["count"].as_u64().unwrap() as usize,
        v["tokens"].as_array().unwrap().len()
    );
    assert!(
        n > 8 << 20,
        "the response must not fit in the socket buffers: {n} bytes"
    );
    let rest = &all[h1 + 4 + n..];
    let h2 = split(rest);
    let head2 = String::from_utf8_lossy(&rest[..h2]);
    assert!(head2.starts_with("HTTP/1.1 200 OK\r\n"), "{head2}");
    assert!(head2.contains("transfer-encoding: chunked"), "{head2}");
    let body2 = String::from_utf8_lossy(&rest[h2 + 4..]);
    assert!(
        body2.contains("data: [DONE]") && body2.ends_with("0\r\n\r\n"),
        "{body2}"
    );
    h.shutdown().await;
}

// ---------- what vLLM serves besides plain text: responses, embeddings, tools, JSON, logprobs, stop

/// `(event name, data)` of every event of an SSE body (`event:` line, then `data:` line).
fn named_events(body: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(body).unwrap();
    text.split_terminator("\n\n")
        .map(|ev| {
            let (name, data) = ev.split_once('\n').unwrap_or_else(|| panic!("{ev}"));
            let name = name
                .strip_prefix("event: ")
                .unwrap_or_else(|| panic!("{ev}"));
            let data = data
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("{ev}"));
            (name.to_string(), serde_json::from_str(data).unwrap())
        })
        .collect()
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    k.sort_unstable();
    k
}

async fn tokenize_count(addr: SocketAddr, body: Value) -> u64 {
    post(addr, "/tokenize", body).await.json()["count"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn responses_stream_and_body_have_the_responses_api_shapes() {
    let h = start(fixed(1.0, 1.0)).await;
    let req = json!({"model": "mock-llama", "input": "Tell me about caches", "instructions": "Be brief",
        "max_output_tokens": 5, "ignore_eos": true, "stream": true});
    let r = post(h.addr, "/v1/responses", req.clone()).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.headers["content-type"],
        "text/event-stream; charset=utf-8"
    );
    assert!(!r.done(), "the Responses API sends no [DONE]");
    let evs = named_events(&r.body);
    let kinds: Vec<&str> = evs.iter().map(|(k, _)| k.as_str()).collect();
    let mut want = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    want.extend(["response.output_text.delta"; 5]);
    want.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(kinds, want);
    for (k, (kind, v)) in evs.iter().enumerate() {
        assert_eq!(v["type"], *kind);
        assert_eq!(v["sequence_number"], k as u64);
    }
    let delta = &evs[4].1;
    assert_eq!(
        keys(delta),
        [
            "content_index",
            "delta",
            "item_id",
            "logprobs",
            "output_index",
            "sequence_number",
            "type"
        ]
    );
    assert!(delta["delta"].is_string());
    let text: String = evs[4..9]
        .iter()
        .map(|(_, v)| v["delta"].as_str().unwrap())
        .collect();
    assert_eq!(evs[9].1["text"], text.as_str());
    let done = &evs[12].1["response"];
    assert_eq!(done["object"], "response");
    // Cut by max_output_tokens (ignore_eos): incomplete, as real vLLM 0.32 says it.
    assert_eq!(done["status"], "incomplete");
    assert_eq!(done["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(done["output"][0]["type"], "message");
    assert_eq!(done["output"][0]["content"][0]["text"], text.as_str());
    // Input: the instructions and the input as a chat, counted as /tokenize counts that chat.
    let msgs = json!([{"role": "system", "content": "Be brief"},
        {"role": "user", "content": "Tell me about caches"}]);
    let n = tokenize_count(h.addr, json!({"messages": msgs})).await;
    let u = &done["usage"];
    assert_eq!(
        keys(u),
        [
            "input_tokens",
            "input_tokens_details",
            "output_tokens",
            "output_tokens_details",
            "total_tokens"
        ]
    );
    assert_eq!(
        (u["input_tokens"].as_u64(), u["output_tokens"].as_u64()),
        (Some(n), Some(5))
    );
    assert_eq!(u["total_tokens"], n + 5);
    // Not streamed: the same response object, whole, the same text (same seed and prompt).
    let mut whole = req;
    whole["stream"] = json!(false);
    let b = post(h.addr, "/v1/responses", whole).await.json();
    assert_eq!(shape(&b), shape(done), "{b}");
    assert_eq!(b["output"][0]["content"][0]["text"], text.as_str());
    assert_eq!(b["usage"], *u);
    // Input as messages; JSON mode through text.format.
    let j = post(
        h.addr,
        "/v1/responses",
        json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "text": {"format": {"type": "json_object"}}, "max_output_tokens": 9, "ignore_eos": true}),
    )
    .await
    .json();
    let t = j["output"][0]["content"][0]["text"].as_str().unwrap();
    assert!(serde_json::from_str::<Value>(t).unwrap().is_object(), "{t}");
    assert_eq!(j["usage"]["output_tokens"], 9);
    let bad = post(h.addr, "/v1/responses", json!({"input": 3})).await;
    assert_eq!(bad.status, 400);
    h.shutdown().await;
}

#[tokio::test]
async fn embeddings_answer_as_vllm_and_refuse_counts_beyond_their_bounds() {
    let h = start(fixed(1.0, 1.0)).await;
    let one = post(
        h.addr,
        "/v1/embeddings",
        json!({"model": "mock-llama", "input": "hello world"}),
    )
    .await;
    assert_eq!(one.status, 200);
    let v = one.json();
    assert_eq!(
        keys(&v),
        ["created", "data", "id", "model", "object", "usage"]
    );
    assert_eq!(v["object"], "list");
    assert_eq!(keys(&v["data"][0]), ["embedding", "index", "object"]);
    assert_eq!(v["data"][0]["object"], "embedding");
    let e = v["data"][0]["embedding"].as_array().unwrap();
    assert_eq!(e.len(), MockConfig::default().embedding_dim as usize);
    let norm: f64 = e.iter().map(|x| x.as_f64().unwrap().powi(2)).sum();
    assert!(
        (norm - 1.0).abs() < 1e-4,
        "unit vectors, as vLLM normalises them: {norm}"
    );
    let n = tokenize_count(h.addr, json!({"prompt": "hello world"})).await;
    assert_eq!(v["usage"]["prompt_tokens"], n);
    assert_eq!(v["usage"]["total_tokens"], n);
    // A list: one vector per input, in order; the same input gives the same vector.
    let list = post(
        h.addr,
        "/v1/embeddings",
        json!({"input": ["hello world", "other", [5, 6, 7]], "dimensions": 8}),
    )
    .await
    .json();
    let data = list["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    assert_eq!(data[2]["index"], 2);
    assert_eq!(data[0]["embedding"].as_array().unwrap().len(), 8);
    assert_ne!(data[0]["embedding"], data[1]["embedding"]);
    let again = post(
        h.addr,
        "/v1/embeddings",
        json!({"input": ["hello world"], "dimensions": 8}),
    )
    .await
    .json();
    assert_eq!(again["data"][0]["embedding"], data[0]["embedding"]);
    assert_eq!(
        list["usage"]["prompt_tokens"],
        n + tokenize_count(h.addr, json!({"prompt": "other"})).await + 3
    );
    // Bounded: the count and the dimension are refused before anything is made for them.
    let many = vec!["x"; 100_000];
    for (body, field) in [
        (json!({"input": many}), "input"),
        (json!({"input": "x", "dimensions": 1 << 30}), "dimensions"),
        (
            json!({"input": "x", "encoding_format": "int8"}),
            "encoding_format",
        ),
    ] {
        let r = post(h.addr, "/v1/embeddings", body).await;
        assert_eq!(r.status, 400, "{field}");
        assert_eq!(r.json()["error"]["param"], field);
    }
    assert_eq!(
        post(
            h.addr,
            "/v1/embeddings",
            json!({"model": "other", "input": "x"})
        )
        .await
        .status,
        404
    );
    assert_eq!(
        send(h.addr, "GET", "/v1/embeddings", "", &[]).await.status,
        405
    );
    h.shutdown().await;
}

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}}}])
}

#[tokio::test]
async fn tool_calls_come_in_vllm_shape_streamed_and_whole() {
    let h = start(fixed(1.0, 1.0)).await;
    let req = json!({"messages": [{"role": "user", "content": "weather in Paris?"}], "tools": weather_tools(),
        "max_tokens": 20, "ignore_eos": true});
    let b = post(h.addr, "/v1/chat/completions", req.clone())
        .await
        .json();
    let c = &b["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls");
    let m = &c["message"];
    assert!(m["content"].is_null());
    let call = &m["tool_calls"][0];
    assert_eq!(keys(call), ["function", "id", "type"]);
    assert_eq!(call["type"], "function");
    assert!(call["id"].as_str().unwrap().starts_with("chatcmpl-tool-"));
    assert_eq!(keys(&call["function"]), ["arguments", "name"]);
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(keys(&args), ["city", "unit"], "the schema's properties");
    assert_eq!(b["usage"]["completion_tokens"], 20);
    // Streamed: the role chunk, then tool-call deltas as vLLM sends them.
    let mut s = req.clone();
    s["stream"] = json!(true);
    s["stream_options"] = json!({"include_usage": true});
    let r = post(h.addr, "/v1/chat/completions", s).await;
    assert!(r.done());
    let ch = r.chunks();
    assert_eq!(
        ch[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let first = &ch[1]["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(keys(first), ["function", "id", "index", "type"]);
    assert_eq!(keys(&first["function"]), ["arguments", "name"]);
    assert_eq!(first["function"]["name"], "get_weather");
    let later = &ch[2]["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(keys(later), ["function", "index"]);
    assert_eq!(keys(&later["function"]), ["arguments"]);
    let deltas: Vec<&Value> = ch
        .iter()
        .filter(|c| c["choices"][0]["delta"]["tool_calls"].is_array())
        .collect();
    assert_eq!(deltas.len(), 20);
    let args: String = deltas
        .iter()
        .map(|c| {
            c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(
        args,
        call["function"]["arguments"].as_str().unwrap(),
        "same seed, same call"
    );
    assert_eq!(deltas[19]["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(ch.last().unwrap()["usage"]["completion_tokens"], 20);
    // tool_choice "none": plain text; a named function must be among the tools.
    let mut none = req.clone();
    none["tool_choice"] = json!("none");
    let b = post(h.addr, "/v1/chat/completions", none).await.json();
    assert_eq!(b["choices"][0]["message"]["tool_calls"], json!([]));
    assert!(b["choices"][0]["message"]["content"].is_string());
    let mut named = req;
    named["tool_choice"] = json!({"type": "function", "function": {"name": "nope"}});
    let r = post(h.addr, "/v1/chat/completions", named).await;
    assert_eq!(
        (r.status, r.json()["error"]["param"].clone()),
        (400, json!("tool_choice"))
    );
    h.shutdown().await;
}

#[tokio::test]
async fn json_mode_gives_valid_json_at_any_length() {
    let h = start(fixed(0.0, 0.0)).await;
    let schema = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
        "properties": {"answer": {"type": "string"}, "why": {"type": "string"}}}}});
    for (k, max) in [1u32, 2, 3, 9, 33].into_iter().enumerate() {
        let rf = if k % 2 == 0 {
            json!({"type": "json_object"})
        } else {
            schema.clone()
        };
        let chat = json!({"messages": [{"role": "user", "content": "json please"}], "response_format": rf,
            "max_tokens": max, "ignore_eos": true});
        let b = post(h.addr, "/v1/chat/completions", chat.clone())
            .await
            .json();
        let t = b["choices"][0]["message"]["content"].as_str().unwrap();
        let v: Value = serde_json::from_str(t).unwrap_or_else(|e| panic!("{max} tokens: {e}: {t}"));
        assert!(v.is_object());
        assert_eq!(
            b["usage"]["completion_tokens"], max,
            "the length budget is kept"
        );
        let mut s = chat;
        s["stream"] = json!(true);
        let joined: String = post(h.addr, "/v1/chat/completions", s)
            .await
            .chunks()
            .iter()
            .filter_map(|c| {
                c["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_string)
            })
            .collect();
        assert_eq!(joined, t, "{max} tokens streamed");
        // Completions with a token-id prompt too (not the typed fast path).
        let c = post(
            h.addr,
            "/v1/completions",
            json!({"prompt": [5, 6, 7], "response_format": rf_clone(k, &schema),
            "max_tokens": max, "ignore_eos": true}),
        )
        .await
        .json();
        serde_json::from_str::<Value>(c["choices"][0]["text"].as_str().unwrap()).unwrap();
    }
    // Cut by its own end (EOS) as well: valid JSON whatever ended it.
    let b = post(
        h.addr,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_object"}, "max_tokens": 4000}),
    )
    .await
    .json();
    serde_json::from_str::<Value>(b["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    h.shutdown().await;
}

fn rf_clone(k: usize, schema: &Value) -> Value {
    if k % 2 == 0 {
        json!({"type": "json_object"})
    } else {
        schema.clone()
    }
}

#[tokio::test]
async fn logprobs_come_in_vllm_shapes() {
    let h = start(fixed(0.0, 0.0)).await;
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 2,
        "max_tokens": 6, "ignore_eos": true});
    let b = post(h.addr, "/v1/chat/completions", chat.clone())
        .await
        .json();
    let lp = &b["choices"][0]["logprobs"];
    let content = lp["content"].as_array().unwrap();
    assert_eq!(content.len(), 6);
    assert_eq!(
        keys(&content[0]),
        ["bytes", "logprob", "token", "top_logprobs"]
    );
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
    assert_eq!(
        keys(&content[0]["top_logprobs"][0]),
        ["bytes", "logprob", "token"]
    );
    let joined: String = content
        .iter()
        .map(|e| e["token"].as_str().unwrap())
        .collect();
    assert_eq!(
        joined,
        b["choices"][0]["message"]["content"].as_str().unwrap()
    );
    let mut s = chat;
    s["stream"] = json!(true);
    let ch = post(h.addr, "/v1/chat/completions", s).await.chunks();
    let streamed: Vec<&Value> = ch[1..]
        .iter()
        .map(|c| &c["choices"][0]["logprobs"]["content"][0])
        .collect();
    assert_eq!(streamed.len(), 6);
    assert_eq!(*streamed[3], content[3]);
    // Completions: logprobs N.
    let c = post(
        h.addr,
        "/v1/completions",
        json!({"prompt": "hello", "logprobs": 3, "max_tokens": 4, "ignore_eos": true}),
    )
    .await
    .json();
    let lp = &c["choices"][0]["logprobs"];
    assert_eq!(
        keys(lp),
        ["text_offset", "token_logprobs", "tokens", "top_logprobs"]
    );
    for k in ["text_offset", "token_logprobs", "tokens", "top_logprobs"] {
        assert_eq!(lp[k].as_array().unwrap().len(), 4, "{k}");
    }
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 3);
    let joined: String = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(joined, c["choices"][0]["text"].as_str().unwrap());
    assert_eq!(lp["text_offset"][0], 0);
    let r = post(
        h.addr,
        "/v1/completions",
        json!({"prompt": "x", "logprobs": 99}),
    )
    .await;
    assert_eq!(
        (r.status, r.json()["error"]["param"].clone()),
        (400, json!("logprobs"))
    );
    h.shutdown().await;
}

#[tokio::test]
async fn stop_strings_cut_the_output_as_vllm_does() {
    let h = start(fixed(0.0, 0.0)).await;
    let base = json!({"prompt": [9, 8, 7], "max_tokens": 30, "ignore_eos": true});
    let full = post(h.addr, "/v1/completions", base.clone()).await.json();
    let text = full["choices"][0]["text"].as_str().unwrap().to_string();
    // The output's 6th token (" word") as the stop string: the text ends where it first
    // appears, the tokens with the one that completes it.
    let words: Vec<String> = text.split(' ').skip(1).map(|w| format!(" {w}")).collect();
    assert_eq!(words.len(), 30);
    let stop = words[5].clone();
    let at = text.find(&stop).unwrap();
    let mut end = 0;
    let tokens_to = 1 + words
        .iter()
        .take_while(|w| {
            end += w.len();
            end < at + stop.len()
        })
        .count() as u64;
    let mut req = base;
    req["stop"] = json!(["never-there", stop]);
    let b = post(h.addr, "/v1/completions", req.clone()).await.json();
    let c = &b["choices"][0];
    assert_eq!(c["text"], &text[..at]);
    assert_eq!(c["finish_reason"], "stop");
    assert_eq!(c["stop_reason"], stop.as_str());
    assert_eq!(
        b["usage"]["completion_tokens"], tokens_to,
        "the token that completed the stop string counts"
    );
    req["stream"] = json!(true);
    req["stream_options"] = json!({"include_usage": true});
    let ch = post(h.addr, "/v1/completions", req).await.chunks();
    let joined: String = ch
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(joined, &text[..at]);
    let last = &ch[ch.len() - 2]["choices"][0];
    assert_eq!(
        (last["finish_reason"].clone(), last["stop_reason"].clone()),
        (json!("stop"), json!(stop))
    );
    assert_eq!(ch.last().unwrap()["usage"]["completion_tokens"], tokens_to);
    // Chat too.
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 30, "ignore_eos": true});
    let t = post(h.addr, "/v1/chat/completions", chat.clone())
        .await
        .json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let w = format!(" {}", t.split(' ').nth(3).unwrap());
    let mut s = chat;
    s["stop"] = json!(w);
    let b = post(h.addr, "/v1/chat/completions", s).await.json();
    assert_eq!(
        b["choices"][0]["message"]["content"],
        &t[..t.find(&w).unwrap()]
    );
    assert_eq!(b["choices"][0]["finish_reason"], "stop");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_responses_embeddings_tools_and_json_replay_against_the_embedded_mock() {
    use retrace::record::{Bodies, RecordConfig};
    let dir = tempfile::tempdir().unwrap();
    let up = start(fixed(5.0, 1.0)).await;
    let mut cfg =
        RecordConfig::new(&format!("http://{}", up.addr), dir.path().join("rec")).unwrap();
    cfg.bodies = Bodies::Request;
    cfg.flush_every = Duration::from_millis(100);
    let rec = support::spawn_recorder(cfg).await;
    let user = |t: &str| json!([{"role": "user", "content": t}]);
    let traffic = [
        (
            "/v1/responses",
            json!({"input": "stream me", "max_output_tokens": 6, "stream": true}),
        ),
        (
            "/v1/responses",
            json!({"input": user("whole"), "instructions": "terse", "max_output_tokens": 4}),
        ),
        ("/v1/embeddings", json!({"input": "embed this"})),
        (
            "/v1/embeddings",
            json!({"input": ["a", "b c"], "encoding_format": "base64"}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user("weather?"), "tools": weather_tools(), "max_tokens": 12, "stream": true}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user("json"), "response_format": {"type": "json_object"}, "max_tokens": 7}),
        ),
    ];
    for (path, body) in &traffic {
        let r = send(rec.addr, "POST", path, &body.to_string(), &[]).await;
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    support::stop_recorder(rec.stop, rec.task).await;
    up.shutdown().await;
    let (path, trace) = crate::real_traffic::read_trace(&dir.path().join("rec"));
    let work: Vec<_> = trace.requests.iter().filter(|r| r.is_workload()).collect();
    assert_eq!(work.len(), traffic.len());
    assert!(
        work.iter().all(|r| r.recorded_failure().is_none()),
        "{work:?}"
    );
    // Replayed against the embedded default target (no --target).
    let result = dir.path().join("replay.json");
    let args = [
        path.to_str().unwrap(),
        "--detailed",
        "--result-json",
        result.to_str().unwrap(),
    ];
    let out = tokio::time::timeout(
        support::CHILD_LIMIT,
        retrace::replay::replay(support::replay_cfg(&args)),
    )
    .await
    .expect("replay ends")
    .unwrap();
    let r = &out.result;
    assert_eq!(
        (r["completed"].clone(), r["failed"].clone()),
        (json!(6), json!(0)),
        "{:?}",
        out.summary.errors
    );
    let lens = |k: &str| -> Vec<u64> { serde_json::from_value(r[k].clone()).unwrap() };
    let want_in: Vec<u64> = work.iter().map(|q| q.input_tokens).collect();
    let want_out: Vec<u64> = work.iter().map(|q| q.output_tokens).collect();
    assert_eq!(lens("input_lens"), want_in);
    assert_eq!(lens("output_lens"), want_out);
}
