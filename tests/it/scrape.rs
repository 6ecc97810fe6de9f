//! `retrace replay --scrape-metrics` end to end: against the embedded mock (vLLM-named
//! `/metrics`) the achieved prefix-cache hits equal the theoretical count for a trace with known
//! reuse, the time series lands in the result file; an explicit URL works; an unreachable one is
//! counted, never fatal; flag errors name the flag; the report's headline shows the hit rate.

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
    // The report's headline holds the achieved hit rate against the theoretical one.
    let run = retrace::report::load::load(&out).unwrap();
    let page = retrace::report::html::report_page(&run, (25.0, 50.0));
    let card = page_data(&page)["cards"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "prefix-cache")
        .cloned()
        .expect("a prefix-cache card");
    assert_eq!(card["value"], "68.5%");
    assert_eq!(card["sub"], "theoretical 68.5%");
}

/// The data block of a report page.
pub(crate) fn page_data(page: &str) -> Value {
    let open = "<script id=\"retrace-data\" type=\"application/json\">";
    let start = page.find(open).expect("a data block") + open.len();
    let end = start + page[start..].find("</script>").unwrap();
    serde_json::from_str(&page[start..end]).unwrap()
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

/// A llama-server stand-in: one slot whose prompt cache is the previous prompt (llama.cpp's
/// per-slot reuse: the common prefix, at most L − 1 tokens), `timings` on the last chunk as the
/// real one sends them (fixtures/llamacpp), `llamacpp:` counters on /metrics. Its first /metrics
/// GET fails (HTTP 500); it notes how many connections it had accepted when one first answered.
mod fake_llama {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper::{Request, Response};
    use serde_json::{json, Value};
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    pub struct State {
        last: Vec<Value>,
        prompt: u64,
        cached: u64,
        predicted: u64,
        metrics_gets: u64,
        pub conns_at_first_metrics: Option<u64>,
        pub cache_n: Vec<u64>,
    }

    pub struct Fake {
        pub addr: std::net::SocketAddr,
        pub state: Arc<Mutex<State>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    fn resp(status: u16, ctype: &str, body: String) -> Response<Full<Bytes>> {
        Response::builder()
            .status(status)
            .header("content-type", ctype)
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    }

    fn metrics(st: &mut State, conns: u64) -> Response<Full<Bytes>> {
        st.metrics_gets += 1;
        if st.metrics_gets == 1 {
            return resp(500, "text/plain", "busy".into());
        }
        st.conns_at_first_metrics.get_or_insert(conns);
        let text = format!(
            "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total {}\nllamacpp:prompt_tokens_cached_total {}\nllamacpp:tokens_predicted_total {}\nllamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n",
            st.prompt, st.cached, st.predicted
        );
        resp(200, "text/plain; version=0.0.4", text)
    }

    fn complete(st: &mut State, body: &Value) -> Response<Full<Bytes>> {
        let prompt = body["prompt"].as_array().cloned().unwrap_or_default();
        let n = body["max_tokens"].as_u64().unwrap_or(2);
        let l = prompt.len() as u64;
        let common = st
            .last
            .iter()
            .zip(&prompt)
            .take_while(|(a, b)| a == b)
            .count() as u64;
        let cache_n = common.min(l.saturating_sub(1));
        st.last = prompt;
        st.prompt += l - cache_n;
        st.cached += cache_n;
        st.predicted += n;
        st.cache_n.push(cache_n);
        let mut sse = String::new();
        for k in 0..n {
            let fin = if k + 1 == n {
                json!("length")
            } else {
                Value::Null
            };
            let mut c = json!({"choices": [{"text": format!(" t{k}"), "index": 0, "finish_reason": fin}], "object": "text_completion"});
            if k + 1 == n {
                c["usage"] =
                    json!({"completion_tokens": n, "prompt_tokens": l, "total_tokens": n + l});
                c["timings"] = json!({"cache_n": cache_n, "prompt_n": l - cache_n, "prompt_ms": 3.0, "predicted_n": n, "predicted_ms": 1.0});
            }
            sse.push_str(&format!("data: {c}\n\n"));
        }
        sse.push_str("data: [DONE]\n\n");
        resp(200, "text/event-stream", sse)
    }

    async fn handle(
        req: Request<hyper::body::Incoming>,
        state: Arc<Mutex<State>>,
        conns: u64,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let path = req.uri().path().to_string();
        let body = req.into_body().collect().await.map(|b| b.to_bytes());
        let body: Value = body
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null);
        let mut st = state.lock().unwrap();
        Ok(match path.as_str() {
            "/metrics" => metrics(&mut st, conns),
            "/v1/models" => resp(
                200,
                "application/json",
                json!({"data": [{"id": "tiny-llama"}]}).to_string(),
            ),
            "/v1/completions" => complete(&mut st, &body),
            _ => resp(
                404,
                "application/json",
                r#"{"error":{"message":"no"}}"#.into(),
            ),
        })
    }

    pub async fn start() -> Fake {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let conns = Arc::new(AtomicU64::new(0));
        let st = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let n = conns.fetch_add(1, Ordering::SeqCst) + 1;
                let (st, conns) = (st.clone(), conns.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        handle(req, st.clone(), conns.load(Ordering::SeqCst).max(n))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(sock), svc)
                        .await;
                });
            }
        });
        Fake { addr, state, task }
    }
}

/// Against a llama.cpp-named server: the family is found, the scraped hits equal the sum of the
/// per-response `timings.cache_n`, the breakdown uses `timings` (no queue time), the "before"
/// scrape was retried after a failure and taken before the warm connections were opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llamacpp_figures_are_not_na_and_the_before_scrape_precedes_warm_connections() {
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(dir.path(), &ROWS);
    let fake = fake_llama::start().await;
    let url = format!("http://{}", fake.addr);
    let o = replay::replay(
        support::replay_config(&[
            trace.to_str().unwrap(),
            "--target",
            &url,
            "--scrape-metrics",
            "--max-concurrency",
            "1",
            "--warm-connections",
            "4",
            "--detailed",
        ])
        .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(o.summary.completed, 4, "{}", o.report);
    let (cache_n, conns_at_first) = {
        let st = fake.state.lock().unwrap();
        (st.cache_n.clone(), st.conns_at_first_metrics)
    };
    let cached: u64 = cache_n.iter().sum();
    assert!(cached > 0, "{cache_n:?}");
    let sm = &o.result["server_metrics"];
    assert_eq!(sm["family"], "llama.cpp", "{sm}");
    assert_eq!(sm["before_ok"], true, "retried after the 500: {sm}");
    assert!(sm["failed_scrapes"].as_u64().unwrap() >= 1);
    assert_eq!(sm["prefix_cache"]["hits"], cached as f64, "{sm}");
    assert_eq!(sm["prefix_cache"]["queries"], QUERIES);
    assert_eq!(sm["prompt_tokens"], QUERIES);
    // before the warm connections: only the client's check connection (and the scraper's own)
    assert!(conns_at_first.unwrap() <= 2, "{conns_at_first:?}");
    // per-request: timings give the server TTFT and the cached tokens, no queue time
    let r = &o.result;
    assert_eq!(r["server_reported"], 4);
    assert_eq!(r["count_server_queue"], 0);
    assert_eq!(r["mean_server_ttft_ms"], 3.0);
    let want: Vec<Value> = cache_n.iter().map(|&c| c.into()).collect();
    assert_eq!(r["server_cached_tokens"], Value::Array(want));
    assert_eq!(r["server_prefix_cache"]["cached_tokens"], cached);
    assert_eq!(r["server_prefix_cache"]["prompt_tokens"], QUERIES as u64);
    for line in [
        "Server metrics family:",
        "llama.cpp",
        "Peak KV-cache usage:                     n/a (not exposed)",
        "no queue time reported",
        "Prompt tokens from server cache:",
    ] {
        assert!(o.report.contains(line), "{line}: {}", o.report);
    }
}

/// A server whose names no family knows: the console says so and lists some of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_metric_names_are_named_in_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(dir.path(), &ROWS);
    let srv = support::start(support::ServerConfig::default()).await;
    // the test server answers /metrics with 404: serve names of our own on another port
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    let body = "tgi_queue_size 0\ntgi_batch_current_size 1\n";
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(
                        http_body_util::Full::new(bytes::Bytes::from(body)),
                    ))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(sock), svc)
                    .await;
            });
        }
    });
    let scrape = format!("--scrape-metrics=http://{addr}/metrics");
    let o = replay::replay(
        support::replay_config(&[
            trace.to_str().unwrap(),
            "--target",
            &srv.url(),
            "--model",
            "m",
            &scrape,
        ])
        .unwrap(),
    )
    .await
    .unwrap();
    task.abort();
    assert_eq!(o.result["server_metrics"]["family"], Value::Null);
    assert!(
        o.report
            .contains("every server figure is n/a; saw tgi_queue_size, tgi_batch_current_size"),
        "{}",
        o.report
    );
}
