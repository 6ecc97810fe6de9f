//! `record --shadow` and `compare --shadow`: copies measured and paired, the client untouched by
//! any shadow fault, credentials never mirrored, and the paired comparison's figures.
//!
//! Every server is in-process on 127.0.0.1:0: scripted test servers of fixed timings (the
//! primary, a candidate 2 ms slower in TTFT and ITL, a control like the primary), the real mock
//! (output agreement), and raw sockets that misbehave.

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retrace::record::shadow::ShadowConfig;
use retrace::record::RecordConfig;
use retrace::trace::{native, Request as TraceRequest};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::support::{self, ServerConfig};

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// POSTs `body` to `url`; status and the whole response body, within 30 s.
async fn post(c: &HttpClient, url: &str, body: &str, headers: &[(&str, &str)]) -> (u16, Vec<u8>) {
    let mut b = Request::post(url).header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let fut = async {
        let resp = c.request(req).await.expect("a response head");
        let st = resp.status();
        let body = resp.into_body().collect().await.expect("a whole body");
        (st, body.to_bytes().to_vec())
    };
    let (st, body) = tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .expect("a response in time");
    (st.as_u16(), body)
}

fn completion(k: usize, max_tokens: u32) -> String {
    serde_json::json!({
        "model": "test-model",
        "prompt": format!("shadow test prompt {k}"),
        "max_tokens": max_tokens,
        "stream": true,
        "temperature": 0,
    })
    .to_string()
}

/// A recorder on `upstream` shadowing to `shadows` (the last one the control when `control`).
async fn recorder(
    upstream: &str,
    shadows: &[String],
    control: Option<&str>,
    tweak: impl FnOnce(&mut RecordConfig),
) -> (support::Recorder, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = RecordConfig::new(upstream, dir.path().join("out")).unwrap();
    cfg.flush_every = Duration::from_millis(100);
    cfg.drain_timeout = Duration::from_secs(5);
    cfg.upstream_tokenize = false;
    let sc = ShadowConfig::new(shadows, control, cfg.upstream_uri()).unwrap();
    cfg.shadow = Some(sc);
    tweak(&mut cfg);
    (support::spawn_recorder(cfg).await, dir)
}

/// Stops the recorder; its files and every record, by arrival.
async fn stop(r: support::Recorder) -> (Vec<std::path::PathBuf>, Vec<TraceRequest>) {
    let stats = support::stop_recorder(r.stop, r.task).await;
    let mut recs = Vec::new();
    for f in &stats.files {
        recs.extend(native::read_file(f).unwrap().0.requests);
    }
    recs.sort_by_key(|r| r.arrival_us);
    (stats.files, recs)
}

async fn metrics(admin: std::net::SocketAddr) -> String {
    let (st, body) = {
        let url = format!("http://{admin}/metrics");
        let resp =
            tokio::time::timeout(Duration::from_secs(20), client().get(url.parse().unwrap()))
                .await
                .unwrap()
                .unwrap();
        let st = resp.status();
        (st, resp.into_body().collect().await.unwrap().to_bytes())
    };
    assert_eq!(st, StatusCode::OK);
    String::from_utf8(body.to_vec()).unwrap()
}

fn metric(text: &str, sample: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(sample).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("metric {sample} missing in\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// `retrace compare --shadow FILES --format json`, parsed; its exit code.
fn compare_json(files: &[std::path::PathBuf], extra: &[&str]) -> (serde_json::Value, i32) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_retrace"));
    cmd.arg("compare").arg("--shadow").args(files);
    cmd.args(["--format", "json"]).args(extra);
    let o = support::Running::spawn(&mut cmd)
        .unwrap()
        .wait_within(support::CHILD_LIMIT)
        .unwrap();
    let v = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "compare --shadow: {e}; stderr: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    (v, o.status.code().unwrap_or(-1))
}

fn row<'a>(shadow: &'a serde_json::Value, key: &str) -> &'a serde_json::Value {
    shadow["comparison"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == key)
        .unwrap_or_else(|| panic!("no row {key} in {shadow}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paired_shadow_compare_finds_the_configured_differences_and_none_in_a_control() {
    let ms = Duration::from_millis;
    let server = |ttft, itl| {
        support::start(ServerConfig {
            ttft: ms(ttft),
            itl: ms(itl),
            ..Default::default()
        })
    };
    let (primary, cand, control) = (
        server(30, 5).await,
        server(32, 7).await,
        server(30, 5).await,
    );
    let (rec, dir) = recorder(&primary.url(), &[cand.url()], Some(&control.url()), |_| {}).await;
    let proxy = format!("http://{}/v1/completions", rec.addr);
    let direct = format!("{}/v1/completions", primary.url());
    // Four keep-alive clients, 12 requests each; every proxied body is the direct one's bytes.
    let mut tasks = Vec::new();
    for w in 0..4 {
        let (proxy, direct) = (proxy.clone(), direct.clone());
        tasks.push(tokio::spawn(async move {
            let c = client();
            for i in 0..12 {
                let body = completion(w * 100 + i, 8);
                let via = post(&c, &proxy, &body, &[("authorization", "Bearer sk-client")]).await;
                let straight = post(&c, &direct, &body, &[]).await;
                assert_eq!(via.0, 200);
                assert_eq!(via, straight, "the proxied response is the direct one");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let m = metrics(rec.admin).await;
    let (files, recs) = stop(rec).await;
    assert_eq!(recs.len(), 48);
    for r in &recs {
        assert_eq!(r.shadows.len(), 2, "a candidate and a control copy each");
        for c in &r.shadows {
            let resp = c.response.as_ref().expect("the copy was measured");
            assert!(resp.completed() && c.skipped.is_none(), "{c:?}");
            assert_eq!(c.output_tokens, 8);
        }
    }
    for k in ["0", "1"] {
        let sample = format!("retrace_record_shadow_mirrored_total{{shadow=\"{k}\"}}");
        assert_eq!(metric(&m, &sample), 48.0);
    }
    let (v, code) = compare_json(&files, &[]);
    assert_eq!(code, 0, "{v}");
    let shadows = v["shadows"].as_array().unwrap();
    assert_eq!(
        shadows.len(),
        1,
        "the control is the noise band, not a candidate"
    );
    let s = &shadows[0];
    assert_eq!(s["target"]["pairs"], 48);
    for key in ["median_ttft_ms", "median_itl_ms", "median_tpot_ms"] {
        let r = row(s, key);
        let d = r["abs_change"].as_f64().unwrap();
        assert!((1.0..=3.0).contains(&d), "{key}: {d} ms, configured +2 ms");
        assert_eq!(r["verdict"], "worse", "{key}: {r}");
        // the control, a copy of the primary, moved by less than a millisecond
        let noise = r["noise"].as_f64().unwrap();
        assert!(noise < 1.0, "{key}: the control differs by {noise} ms");
    }
    // both test servers write the same text: every deterministic output agrees
    assert_eq!(s["target"]["deterministic"], 48);
    assert_eq!(s["target"]["identical_fraction"], 1.0);
    // a rule gates as on result files
    let (_, code) = compare_json(&files, &["--fail-on", "median_ttft_ms>+1"]);
    assert_eq!(code, 1);
    report_shows_each_shadow_beside_the_primary(&files[0], dir.path());
}

/// A client that writes the request head, then its body 200 ms later (the Python openai SDK
/// writes them apart): the copy goes out once the body is whole, and the pairs time the
/// primary from that moment too, so a twin shadow reads no change (not 200 ms faster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_counts_on_neither_side_of_a_pair() {
    let twin = || {
        support::start(ServerConfig {
            ttft: Duration::from_millis(20),
            itl: Duration::from_millis(5),
            ..Default::default()
        })
    };
    let (primary, shadow) = (twin().await, twin().await);
    let (rec, _dir) = recorder(&primary.url(), &[shadow.url()], None, |_| {}).await;
    for k in 0..6 {
        let body = completion(k, 4);
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let mut c = tokio::net::TcpStream::connect(rec.addr).await.unwrap();
        c.write_all(head.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        c.write_all(body.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), c.read_to_end(&mut got))
            .await
            .expect("the response in time")
            .unwrap();
        assert!(
            got.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&got)
        );
    }
    let (files, recs) = stop(rec).await;
    assert_eq!(recs.len(), 6);
    for r in &recs {
        let c = &r.shadows[0];
        assert!(
            // Less only when the proxy read the head that late.
            c.ready_us >= 100_000,
            "the request was whole about 200 ms in: {c:?}"
        );
        assert!(c.sent_us >= c.ready_us);
    }
    let (v, code) = compare_json(&files, &[]);
    assert_eq!(code, 0, "{v}");
    let judged = &v["shadows"][0];
    assert_eq!(judged["target"]["pairs"], 6, "{judged}");
    for key in ["median_ttft_ms", "median_e2el_ms"] {
        let d = row(judged, key)["abs_change"].as_f64().unwrap();
        assert!(
            d.abs() < 50.0,
            "{key}: {d} ms between twins; 200 ms is the upload"
        );
    }
}

/// `retrace report` of the recording above: each shadow beside the primary (both sides' CDFs,
/// the paired change with its median, the shadow's timeline), rendered without a script error.
fn report_shows_each_shadow_beside_the_primary(rec: &std::path::Path, dir: &std::path::Path) {
    let page = dir.join("report.html");
    let (data, _) = report_data(rec, &page);
    let sides = data["shadows"].as_array().unwrap();
    assert_eq!(sides.len(), 2, "the candidate and the control");
    let median = |side: &serde_json::Value, key: &str| {
        let d = side["deltas"].as_array().unwrap();
        let d = d.iter().find(|d| d["key"] == key).unwrap();
        assert_eq!(d["n"], 48);
        d["median"].as_f64().unwrap()
    };
    let (cand, control) = (&sides[0], &sides[1]);
    assert!(cand["name"]
        .as_str()
        .unwrap()
        .starts_with("shadow 0 (candidate http://"));
    assert_eq!(cand["pairs"], 48);
    let d = median(cand, "ttft");
    assert!(
        (1.0..=3.0).contains(&d),
        "TTFT change {d} ms, configured +2 ms"
    );
    // E2EL: +2 ms of TTFT and 7 gaps each 2 ms longer
    let d = median(cand, "e2el");
    assert!(
        (12.0..=20.0).contains(&d),
        "E2EL change {d} ms, configured +16 ms"
    );
    assert!(median(control, "ttft").abs() < 1.0, "{control}");
    let keys: Vec<&str> = (cand["cdfs"].as_array().unwrap().iter())
        .filter_map(|c| c["key"].as_str())
        .collect();
    assert!(keys.contains(&"ttft") && keys.contains(&"e2el"), "{keys:?}");
    assert_eq!(cand["timeline"]["total"], 48);
    two_shadow_sections_render(&page, "report-shadow.png");
}

/// `retrace report INPUT -o PAGE`, which must succeed: the page's data and the stderr.
pub(crate) fn report_data(
    input: &std::path::Path,
    page: &std::path::Path,
) -> (serde_json::Value, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_retrace"));
    cmd.arg("report").arg(input).arg("-o").arg(page);
    let out = support::Running::spawn(&mut cmd)
        .unwrap()
        .wait_within(support::CHILD_LIMIT)
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let html = std::fs::read_to_string(page).unwrap();
    (crate::scrape::page_data(&html), stderr)
}

/// The report page `page` renders in headless Chromium (screenshot `shot`) with no script
/// error, two shadow sections, and the first one's charts inside it.
pub(crate) fn two_shadow_sections_render(page: &std::path::Path, shot: &str) {
    let doms = crate::compare::open_headless(page, &crate::compare::shots_dir().join(shot));
    crate::compare::check_rendered(
        &doms,
        &[
            "shadow-0",
            "chart-shadow-0-cdf-ttft",
            "chart-shadow-0-delta-ttft",
            "chart-shadow-0-timeline",
            "shadow-1",
        ],
        &[],
    );
}

/// A raw server: reads a request head and its `Content-Length` body, notes the head, then
/// answers with `answer` (which may never end).
async fn raw_server<F, Fut>(answer: F) -> (String, Arc<Mutex<Vec<String>>>)
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let (answer, seen) = (answer.clone(), seen.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let head_end = loop {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break p + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                let len = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0usize);
                while buf.len() < head_end + len {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                seen.lock().unwrap().push(head);
                answer(s).await;
            });
        }
    });
    (url, heads)
}

const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

fn sse_chunk(text: &str) -> Vec<u8> {
    let ev = format!("data: {{\"choices\":[{{\"index\":0,\"text\":\"{text}\"}}]}}\n\n");
    format!("{:x}\r\n{ev}\r\n", ev.len()).into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faulty_shadows_never_delay_fail_or_alter_a_client_response() {
    let primary = support::start(ServerConfig::default()).await;
    // down: a port that refuses connections
    let (_held, port) = support::refusing_port();
    let down = format!("http://127.0.0.1:{port}");
    // endless: one event every 5 ms, never an end
    let (endless, _) = raw_server(|mut s| async move {
        let _ = s.write_all(SSE_HEAD).await;
        while s.write_all(&sse_chunk("x")).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // reset: a head and one event, then the connection drops
    let (reset, _) = raw_server(|mut s| async move {
        let _ = s.write_all(SSE_HEAD).await;
        let _ = s.write_all(&sse_chunk("a")).await;
        // a zero linger makes the close a reset (it does not block)
        #[allow(deprecated)]
        let _ = s.set_linger(Some(Duration::ZERO));
    })
    .await;
    // invalid chunk framing after one event
    let (bad_chunk, _) = raw_server(|mut s| async move {
        let _ = s.write_all(SSE_HEAD).await;
        let _ = s.write_all(&sse_chunk("a")).await;
        let _ = s.write_all(b"zz-not-hex\r\n").await;
        tokio::time::sleep(Duration::from_secs(30)).await;
    })
    .await;
    // slowloris: never a response head
    let (slowloris, heads) = raw_server(|s| async move {
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(s);
    })
    .await;
    let shadows = [down, endless, reset, bad_chunk];
    let (rec, _dir) = recorder(&primary.url(), &shadows, Some(slowloris.as_str()), |c| {
        c.headers_timeout = Duration::from_secs(2);
        c.total_timeout = Some(Duration::from_secs(3));
        if let Some(s) = c.shadow.as_mut() {
            s.api_key = Some(retrace::record::shadow::Secret("sk-shadow-only".into()));
        }
    })
    .await;
    let proxy = format!("http://{}/v1/completions", rec.addr);
    let direct = format!("{}/v1/completions", primary.url());
    let c = client();
    let cookie = [
        ("authorization", "Bearer sk-client"),
        ("cookie", "session=s3cret"),
    ];
    for k in 0..4 {
        let body = completion(k, 6);
        let via = post(&c, &proxy, &body, &cookie).await;
        assert_eq!(via, post(&c, &direct, &body, &[]).await, "request {k}");
    }
    let (_, recs) = stop(rec).await;
    assert_eq!(recs.len(), 4);
    let want = [
        "upstream_connect",
        "timeout_total",
        "upstream_reset",
        "upstream_framing",
        "timeout_headers",
    ];
    for r in &recs {
        assert!(
            r.response.as_ref().unwrap().completed(),
            "the client's exchange"
        );
        let kinds: Vec<&str> = r
            .shadows
            .iter()
            .map(|c| {
                c.response
                    .as_ref()
                    .unwrap()
                    .error
                    .as_deref()
                    .unwrap_or("none")
            })
            .collect();
        assert_eq!(kinds, want, "each copy ends alone, with its own kind");
    }
    // the shadow got the key it was given, never the client's credentials
    let heads = heads.lock().unwrap().join("\n").to_ascii_lowercase();
    assert!(
        heads.contains("authorization: bearer sk-shadow-only"),
        "{heads}"
    );
    assert!(
        !heads.contains("sk-client") && !heads.contains("s3cret"),
        "{heads}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_shadow_is_measured_whole_and_copies_past_the_bound_are_skipped_and_counted() {
    let ms = Duration::from_millis;
    let primary = support::start(ServerConfig {
        ttft: ms(20),
        itl: ms(5),
        ..Default::default()
    })
    .await;
    // ten times slower
    let slow = support::start(ServerConfig {
        ttft: ms(200),
        itl: ms(50),
        ..Default::default()
    })
    .await;
    // a body past --capture-max (8 KiB here)
    let (big, _) = raw_server(|mut s| async move {
        let _ = s.write_all(SSE_HEAD).await;
        for _ in 0..64 {
            if s.write_all(&sse_chunk(&"y".repeat(400))).await.is_err() {
                return;
            }
        }
        let _ = s.write_all(b"0\r\n\r\n").await;
    })
    .await;
    let (rec, _dir) = recorder(&primary.url(), &[slow.url(), big], None, |c| {
        c.capture_max = 8 << 10;
        if let Some(s) = c.shadow.as_mut() {
            s.max_in_flight = 3;
        }
    })
    .await;
    let proxy = format!("http://{}/v1/completions", rec.addr);
    let mut tasks = Vec::new();
    for k in 0..8 {
        let proxy = proxy.clone();
        tasks.push(tokio::spawn(async move {
            let t = std::time::Instant::now();
            let r = post(&client(), &proxy, &completion(k, 4), &[]).await;
            (r.0, t.elapsed())
        }));
    }
    for t in tasks {
        let (st, _) = t.await.unwrap();
        assert_eq!(st, 200, "no client failure");
    }
    // the slow copies end after their primaries: wait for the last
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let m = loop {
        let m = metrics(rec.admin).await;
        if metric(&m, "retrace_record_shadow_in_flight") == 0.0
            && metric(&m, "retrace_record_shadow_bytes") == 0.0
        {
            break m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "copies still held:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (_, recs) = stop(rec).await;
    assert_eq!(recs.len(), 8);
    let mut skipped = 0;
    let mut measured_slow = 0;
    for r in &recs {
        for c in &r.shadows {
            match (&c.skipped, c.target) {
                (Some(why), _) => {
                    assert_eq!(why, "in_flight");
                    skipped += 1;
                }
                (None, 0) => {
                    let resp = c.response.as_ref().unwrap();
                    assert!(resp.completed(), "{resp:?}");
                    assert!(resp.ttft_us.unwrap() >= 200_000, "the slow shadow's TTFT");
                    measured_slow += 1;
                }
                (None, _) => {
                    let resp = c.response.as_ref().unwrap();
                    assert_eq!(resp.error.as_deref(), Some("capture_max"));
                }
            }
        }
    }
    assert!(
        skipped > 0,
        "8 requests at once, 2 copies each, 3 in flight at most"
    );
    assert!(measured_slow > 0);
    let counted: f64 = ["0", "1"]
        .iter()
        .map(|k| {
            metric(
                &m,
                &format!(
                    "retrace_record_shadow_skipped_total{{shadow=\"{k}\",reason=\"in_flight\"}}"
                ),
            )
        })
        .sum();
    assert_eq!(counted, skipped as f64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_agreement_is_whole_for_the_same_mock_seed_and_none_for_another() {
    let mock = |seed| async move {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let cfg = retrace::mock::MockConfig {
            fixed_timing: Some((5.0, 1.0)),
            seed,
            ..Default::default()
        };
        retrace::mock::start(l, cfg).await.unwrap()
    };
    let (primary, same, other) = (mock(0).await, mock(0).await, mock(7).await);
    let url = |m: &retrace::mock::MockHandle| format!("http://{}", m.addr);
    let (rec, _dir) = recorder(&url(&primary), &[url(&same), url(&other)], None, |_| {}).await;
    let proxy = format!("http://{}/v1/completions", rec.addr);
    let c = client();
    for k in 0..6 {
        let body = serde_json::json!({
            "model": "mock-llama",
            "prompt": format!("agreement {k}"),
            "max_tokens": 12,
            "stream": k % 2 == 0,
            "temperature": 0,
        });
        assert_eq!(post(&c, &proxy, &body.to_string(), &[]).await.0, 200);
    }
    let (files, _) = stop(rec).await;
    let (v, _) = compare_json(&files, &[]);
    let by = |k: usize| &v["shadows"][k]["target"];
    assert_eq!(by(0)["deterministic"], 6);
    assert_eq!(
        by(0)["identical_fraction"],
        1.0,
        "the same seed: the same text"
    );
    assert_eq!(by(1)["deterministic"], 6);
    assert_eq!(
        by(1)["identical_fraction"],
        0.0,
        "another seed: another text"
    );
    for m in [primary, same, other] {
        m.shutdown().await;
    }
}

#[test]
fn shadow_urls_are_checked_as_the_upstream_is() {
    let cfg = |extra: &[&str]| {
        let mut args = vec![
            "record",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:8000",
            "--out",
            "o",
        ];
        args.extend_from_slice(extra);
        let retrace::cli::Command::Record(a) = support::cli(&args).command else {
            unreachable!()
        };
        a.config().map(drop).map_err(|e| format!("{e:#}"))
    };
    let e = cfg(&["--shadow", "http://user:pw@127.0.0.1:9000"]).unwrap_err();
    assert!(e.contains("--shadow") && !e.contains("pw"), "{e}");
    let e = cfg(&["--shadow", "http://127.0.0.1:9000/?key=abc"]).unwrap_err();
    assert!(e.contains("--shadow") && !e.contains("abc"), "{e}");
    let e = cfg(&["--shadow", "http://127.0.0.1:8000/"]).unwrap_err();
    assert!(e.contains("the --upstream itself"), "{e}");
    let five: Vec<String> = (1..=5)
        .map(|k| format!("http://127.0.0.1:900{k}"))
        .collect();
    let mut args = Vec::new();
    for u in &five {
        args.extend(["--shadow", u.as_str()]);
    }
    assert!(cfg(&args).unwrap_err().contains("at most 4"));
    let e = cfg(&["--shadow-model", "m"]).unwrap_err();
    assert!(e.contains("--shadow-model needs --shadow"), "{e}");
    let e = cfg(&[
        "--shadow",
        "http://127.0.0.1:9000",
        "--shadow-fraction",
        "2",
    ])
    .unwrap_err();
    assert!(e.contains("--shadow-fraction"), "{e}");
    assert!(cfg(&["--shadow", "http://127.0.0.1:9000"]).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_that_is_the_proxy_itself_is_refused() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let me = format!("http://{}", l.local_addr().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = RecordConfig::new("http://127.0.0.1:9", dir.path().join("out")).unwrap();
    cfg.shadow = Some(ShadowConfig::new(&[me], None, cfg.upstream_uri()).unwrap());
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        retrace::record::run_with_admin(l, None, cfg, std::future::pending()),
    )
    .await
    .expect("refused at once");
    let e = format!("{:#}", r.unwrap_err());
    assert!(e.contains("the proxy itself"), "{e}");
}

#[test]
fn the_sidecar_manifest_runs_a_command_record_accepts() {
    let yaml = std::fs::read_to_string(support::repo("tools/k8s/shadow-sidecar.yaml")).unwrap();
    let args: Vec<String> = yaml
        .lines()
        .skip_while(|l| l.trim() != r#"command: ["retrace"]"#)
        .skip(2)
        .take_while(|l| l.trim().starts_with("- "))
        .map(|l| {
            l.trim()
                .trim_start_matches("- ")
                .trim_matches('"')
                .to_string()
        })
        .collect();
    assert_eq!(args.first().map(String::as_str), Some("record"), "{args:?}");
    // the key's variable is the pod's (from its Secret): left out here
    let at = args
        .iter()
        .position(|a| a == "--shadow-api-key-env")
        .unwrap();
    let mut argv: Vec<&str> = args.iter().map(String::as_str).collect();
    argv.drain(at..at + 2);
    let retrace::cli::Command::Record(a) = support::cli(&argv).command else {
        unreachable!()
    };
    let cfg = a.config().unwrap();
    let sc = cfg.shadow.expect("a shadowing recorder");
    assert_eq!(sc.targets.len(), 2, "a candidate and a control");
    assert_eq!(sc.fraction, 0.25);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadowed_recording_is_read_by_every_path() {
    let (primary, cand) = (
        support::start(ServerConfig::default()).await,
        support::start(ServerConfig::default()).await,
    );
    let (rec, dir) = recorder(&primary.url(), &[cand.url()], None, |_| {}).await;
    let proxy = format!("http://{}/v1/completions", rec.addr);
    let c = client();
    for k in 0..3 {
        assert_eq!(post(&c, &proxy, &completion(k, 4), &[]).await.0, 200);
    }
    let (files, recs) = stop(rec).await;
    assert!(recs.iter().all(|r| r.shadows.len() == 1));
    let t = files[0].to_str().unwrap().to_string();
    let o = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let (jsonl, copy, result) = (o("m.jsonl"), o("copy.trace.zst"), o("r.json"));
    let run = |args: &[&str]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_retrace"));
        cmd.args(args);
        let o = support::Running::spawn(&mut cmd)
            .unwrap()
            .wait_within(support::CHILD_LIMIT)
            .unwrap();
        let said = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(o.status.success(), "retrace {}: {said}", args.join(" "));
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let seen = run(&["inspect", &t]);
    assert!(
        seen.contains("shadow 0 (candidate http://")
            && seen.contains("3 copies, 0 skipped, 0 failed"),
        "{seen}"
    );
    run(&["convert", &t, "-o", &jsonl]);
    run(&["convert", &t, "-o", &copy]);
    run(&["replay", &t, "--dry-run"]);
    run(&[
        "replay",
        &t,
        "--result-json",
        &result,
        "--detailed",
        "--speed",
        "10",
    ]);
    run(&["compare", &t, &result]);
    // native to native keeps the copies and the header's targets
    let (back, _) = native::read_file(std::path::Path::new(&copy)).unwrap();
    let mut back = back.requests;
    back.sort_by_key(|r| r.arrival_us);
    assert_eq!(
        back.iter().map(|r| r.shadows.clone()).collect::<Vec<_>>(),
        recs.iter().map(|r| r.shadows.clone()).collect::<Vec<_>>()
    );
    let (v, _) = compare_json(&[copy.into()], &[]);
    assert_eq!(v["shadows"][0]["target"]["pairs"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_still_running_at_the_drain_deadline_are_cut_and_recorded() {
    let primary = support::start(ServerConfig::default()).await;
    let (endless, _) = raw_server(|mut s| async move {
        let _ = s.write_all(SSE_HEAD).await;
        while s.write_all(&sse_chunk("x")).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let (rec, _dir) = recorder(&primary.url(), &[endless], None, |c| {
        c.drain_timeout = Duration::from_secs(1);
    })
    .await;
    let proxy = format!("http://{}/v1/completions", rec.addr);
    let c = client();
    for k in 0..3 {
        assert_eq!(post(&c, &proxy, &completion(k, 4), &[]).await.0, 200);
    }
    let (_, recs) = stop(rec).await;
    assert_eq!(recs.len(), 3, "every primary is written, its copy cut");
    for r in &recs {
        let copy = r.shadows[0].response.as_ref().unwrap();
        assert_eq!(copy.error.as_deref(), Some("drain_deadline"));
        assert!(!copy.events.is_empty(), "what came before the cut is kept");
    }
}

/// An HTTP/2 client's POST whose head ends its stream (no body at all) is mirrored like one
/// with a body: hyper never polls an ended body, so the copy starts from the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_post_without_a_body_is_mirrored() {
    let primary = support::start(ServerConfig::default()).await;
    let (shadow, heads) = raw_server(|mut s| async move {
        let _ = s
            .write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
            )
            .await;
    })
    .await;
    let (rec, _dir) = recorder(&primary.url(), &[shadow], None, |_| {}).await;
    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let url = format!("http://{}/v1/completions", rec.addr);
    for body in [String::new(), completion(0, 4)] {
        let req = Request::post(&url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let exchange = async {
            let resp = h2.request(req).await.expect("a response head");
            resp.into_body().collect().await.expect("a whole body");
        };
        tokio::time::timeout(Duration::from_secs(30), exchange)
            .await
            .expect("a response in time");
    }
    let (_, recs) = stop(rec).await;
    assert_eq!(recs.len(), 2);
    for r in &recs {
        assert_eq!(r.shadows.len(), 1, "{r:?}");
        let copy = &r.shadows[0];
        assert_eq!(copy.skipped, None, "{r:?}");
        assert_eq!(copy.response.as_ref().unwrap().status, 200, "{r:?}");
    }
    let heads = heads.lock().unwrap();
    assert_eq!(heads.len(), 2, "{heads:?}");
    assert!(
        heads.iter().all(|h| h.starts_with("POST /v1/completions ")),
        "{heads:?}"
    );
}
