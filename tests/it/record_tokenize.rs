//! `retrace record` counting estimated input lengths with the upstream's own `POST /tokenize`:
//! the mock's count reaches the record, `--no-upstream-tokenize` sends nothing of the proxy's
//! own, the rate bound holds for a burst, and unusable answers leave the estimate in place.

use retrace::record::RecordConfig;
use retrace::trace::{native, InputCount, Request as TraceRequest, TraceHeader};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::support::{spawn_recorder, stop_recorder};

/// One HTTP/1.1 request (`Connection: close`) → (status, body).
async fn http(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out))
        .await
        .expect("an answer")
        .unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text[9..12].parse().unwrap();
    let body = text.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
    (status, body)
}

/// A relay in front of `to` counting the requests for `/tokenize` that pass through it.
async fn spy(to: std::net::SocketAddr) -> (std::net::SocketAddr, Arc<AtomicU64>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(AtomicU64::new(0));
    let s2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            let seen = s2.clone();
            tokio::spawn(async move {
                let Ok(mut u) = TcpStream::connect(to).await else {
                    return;
                };
                let (mut cr, mut cw) = c.split();
                let (mut ur, mut uw) = u.split();
                let up = async {
                    let mut buf = vec![0u8; 16 << 10];
                    let mut tail: Vec<u8> = Vec::new();
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        tail.extend_from_slice(&buf[..n]);
                        let hits = tail.windows(14).filter(|w| w == b"POST /tokenize").count();
                        seen.fetch_add(hits as u64, Relaxed);
                        let keep = tail.len().saturating_sub(13);
                        tail.drain(..keep);
                        if uw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = uw.shutdown().await;
                };
                let down = tokio::io::copy(&mut ur, &mut cw);
                let _ = tokio::join!(up, down);
            });
        }
    });
    (addr, seen)
}

/// The records and header of the files a recording wrote.
fn read(files: &[std::path::PathBuf]) -> (TraceHeader, Vec<TraceRequest>) {
    let mut recs = Vec::new();
    let mut header = None;
    for f in files {
        let (t, rep) = native::read_file(f).unwrap();
        assert!(rep.is_clean(), "{}", rep.summary());
        header.get_or_insert(t.header);
        recs.extend(t.requests);
    }
    (header.expect("a file"), recs)
}

const CHAT: &str = r#"{"messages":[{"role":"system","content":"You are brief."},{"role":"user","content":"What is the capital of France? One word, please."}],"stream":true,"max_tokens":4}"#;

/// A chat without include_usage, recorded without --tokenizer in front of the mock, takes the
/// length the mock's /tokenize counts (and says the server counted it); with
/// --no-upstream-tokenize the mock sees no /tokenize and the record is labelled an estimate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_estimated_chat_length_is_counted_by_the_upstream_unless_turned_off() {
    let mock = retrace::mock::start(
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
        retrace::mock::MockConfig {
            fixed_timing: Some((2.0, 1.0)),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let (tok_status, tok) = http(mock.addr, "POST", "/tokenize", CHAT).await;
    assert_eq!(tok_status, 200, "{tok}");
    let tok: serde_json::Value = serde_json::from_str(&tok).unwrap();
    let server_count = tok["count"].as_u64().unwrap();
    let server_ids: Vec<u32> = tok["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();

    let mut estimates = Vec::new();
    for off in [false, true] {
        let (front, seen) = spy(mock.addr).await;
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = RecordConfig::new(&format!("http://{front}"), dir.path()).unwrap();
        cfg.block_size = 4;
        cfg.upstream_tokenize = !off;
        let rec = spawn_recorder(cfg).await;
        let (st, body) = http(rec.addr, "POST", "/v1/chat/completions", CHAT).await;
        assert_eq!(st, 200, "{body}");
        assert!(
            !body.contains("\"usage\""),
            "no usage without include_usage"
        );
        let stats = stop_recorder(rec.stop, rec.task).await;
        let (header, recs) = read(&stats.files);
        let chat: Vec<_> = recs
            .iter()
            .filter(|r| r.endpoint == retrace::trace::Endpoint::Chat)
            .collect();
        assert_eq!(chat.len(), 1);
        let r = chat[0];
        if off {
            assert_eq!(seen.load(Relaxed), 0, "nothing of the proxy's own");
            assert_eq!(r.input_count, InputCount::Estimated);
            assert_ne!(header.meta["tokenization"], "server");
            estimates.push(r.input_tokens);
        } else {
            assert_eq!(
                seen.load(Relaxed),
                1,
                "one /tokenize for one estimated length"
            );
            assert_eq!(header.meta["tokenization"], "server");
            assert_eq!(r.input_count, InputCount::Server);
            assert_eq!(r.input_tokens, server_count);
            // The block hashes are the server's token ids'.
            let want = retrace::trace::hash::BlockHasher::xxh3().chain(&server_ids, 4, true);
            assert_eq!(r.hash_ids, want);
        }
    }
    assert_ne!(
        estimates[0], server_count,
        "the estimate differs from the count"
    );
    mock.shutdown().await;
}

/// What a scripted `/tokenize` answers.
#[derive(Clone, Copy)]
enum TokAnswer {
    /// `{"count": prompt bytes, ...}` after a short wait.
    Count,
    /// A count over any bound.
    Huge,
    /// Not JSON.
    Garbage,
}

/// A server that answers `/tokenize` as told (counting the requests, and the most at once) and
/// every completion with a two-event stream without usage.
async fn scripted(answer: TokAnswer) -> (std::net::SocketAddr, Arc<AtomicU64>, Arc<AtomicU64>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (asked, most) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let now = Arc::new(AtomicU64::new(0));
    let (a2, m2) = (asked.clone(), most.clone());
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            let (asked, most, now) = (a2.clone(), m2.clone(), now.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let (head_end, len) = loop {
                    let Ok(n) = c.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..p]).to_ascii_lowercase();
                        let len = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                        break (p + 4, len);
                    }
                };
                while buf.len() < head_end + len {
                    let Ok(n) = c.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let body = &buf[head_end..head_end + len];
                let (ctype, out) = if buf.starts_with(b"POST /tokenize ") {
                    asked.fetch_add(1, Relaxed);
                    let at_once = now.fetch_add(1, Relaxed) + 1;
                    most.fetch_max(at_once, Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    now.fetch_sub(1, Relaxed);
                    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
                    let n = v["prompt"].as_str().map_or(1, |p| p.len());
                    let out = match answer {
                        TokAnswer::Count => format!(r#"{{"count":{n},"max_model_len":4096}}"#),
                        TokAnswer::Huge => r#"{"count":100000000000,"max_model_len":4096}"#.into(),
                        TokAnswer::Garbage => "<html>busy</html>".into(),
                    };
                    ("application/json", out)
                } else {
                    let ev = r#"data: {"choices":[{"index":0,"text":"x"}]}"#;
                    (
                        "text/event-stream",
                        format!("{ev}\n\n{ev}\n\ndata: [DONE]\n\n"),
                    )
                };
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{out}",
                    out.len()
                );
                let _ = c.write_all(resp.as_bytes()).await;
            });
        }
    });
    (addr, asked, most)
}

/// Records `n` text completions without usage through a proxy in front of `upstream`.
async fn record_burst(
    upstream: std::net::SocketAddr,
    n: usize,
    rate: u32,
) -> (Vec<TraceRequest>, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = RecordConfig::new(&format!("http://{upstream}"), dir.path()).unwrap();
    cfg.block_size = 4;
    cfg.upstream_tokenize_rate = rate;
    let start = Instant::now();
    let rec = spawn_recorder(cfg).await;
    let sends = (0..n).map(|k| {
        let body = format!(r#"{{"prompt":"prompt number {k} of a burst","stream":true}}"#);
        let addr = rec.addr;
        async move { http(addr, "POST", "/v1/completions", &body).await }
    });
    for (st, body) in futures_join(sends).await {
        assert_eq!(st, 200, "{body}");
    }
    let stats = stop_recorder(rec.stop, rec.task).await;
    let took = start.elapsed();
    let (_, recs) = read(&stats.files);
    assert_eq!(recs.len(), n);
    (recs, took)
}

/// Runs the futures as tasks at once; their outputs in order.
async fn futures_join<F>(fs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

/// A burst of 30 estimated lengths at `--upstream-tokenize-rate 3`: the upstream is asked at
/// most 3 times a second (a bucket of one second's worth, so at most 3 × (seconds + 1)), never
/// more than 4 at once; every record is written, counted by the server or labelled an estimate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_own_tokenize_requests_are_rate_bounded() {
    let (up, asked, most) = scripted(TokAnswer::Count).await;
    let (recs, took) = record_burst(up, 30, 3).await;
    let asked = asked.load(Relaxed);
    let bound = 3 * (took.as_secs() + 2);
    assert!(asked >= 1, "the upstream was asked");
    assert!(asked <= bound, "{asked} requests in {took:?}: over {bound}");
    assert!(asked < 30, "a burst is not all asked at 3/s");
    assert!(most.load(Relaxed) <= 4, "{} at once", most.load(Relaxed));
    let server = recs
        .iter()
        .filter(|r| r.input_count == InputCount::Server)
        .count();
    let estimated = recs
        .iter()
        .filter(|r| r.input_count == InputCount::Estimated)
        .count();
    assert_eq!(server as u64, asked, "each answer reached its record");
    assert_eq!(server + estimated, 30);
    for r in recs.iter().filter(|r| r.input_count == InputCount::Server) {
        // The scripted count is the prompt's length in bytes.
        assert!(r.input_tokens >= 26, "{}", r.input_tokens);
        assert_eq!(r.hash_ids.len() as u64, r.input_tokens.div_ceil(4));
    }
}

/// An upstream whose /tokenize answers garbage or an absurd count: the estimate stays, labelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_tokenize_answers_leave_the_estimate() {
    for answer in [TokAnswer::Huge, TokAnswer::Garbage] {
        let (up, asked, _) = scripted(answer).await;
        let (recs, _) = record_burst(up, 3, 20).await;
        assert!(asked.load(Relaxed) >= 1, "the upstream was asked");
        for r in &recs {
            assert_eq!(r.input_count, InputCount::Estimated);
            // "prompt number 0 of a burst": 26 bytes, 7 pseudo-tokens of 4 bytes.
            assert_eq!(r.input_tokens, 7);
            assert_eq!(r.hash_ids.len(), 2);
        }
    }
}

/// Chats recorded without usage, a tokenizer or the server's count (estimated lengths), replayed
/// from their bodies into the mock, which counts them otherwise: `compare` does not call the
/// replay unfaithful for those lengths, and names them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_names_estimated_lengths_and_does_not_judge_them() {
    let mock = || async {
        retrace::mock::start(
            TcpListener::bind("127.0.0.1:0").await.unwrap(),
            retrace::mock::MockConfig {
                fixed_timing: Some((2.0, 1.0)),
                ..Default::default()
            },
        )
        .await
        .unwrap()
    };
    let up = mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg =
        RecordConfig::new(&format!("http://{}", up.addr), dir.path().join("rec")).unwrap();
    cfg.block_size = 4;
    cfg.upstream_tokenize = false;
    cfg.bodies = retrace::record::Bodies::Request;
    cfg.flush_every = Duration::from_millis(100);
    let rec = spawn_recorder(cfg).await;
    for k in 0..3 {
        let body = format!(
            r#"{{"messages":[{{"role":"user","content":"question {k}: what is the capital of France?"}}],"stream":true,"max_tokens":4,"ignore_eos":true}}"#
        );
        let (st, out) = http(rec.addr, "POST", "/v1/chat/completions", &body).await;
        assert_eq!(st, 200, "{out}");
    }
    let stats = stop_recorder(rec.stop, rec.task).await;
    up.shutdown().await;
    let (_, recs) = read(&stats.files);
    assert!(recs.iter().all(|r| r.input_count == InputCount::Estimated));

    let target = mock().await;
    let result = dir.path().join("replay.json");
    let out =
        super::real_traffic::replay_recording(&stats.files[0], &target.addr.to_string(), &result)
            .await;
    target.shutdown().await;
    assert_eq!(out.summary.completed, 3, "{:?}", out.summary.errors);
    let load = |p: &std::path::Path| retrace::report::load::load(p).unwrap();
    let replayed = load(&result);
    let counted = replayed
        .requests
        .as_ref()
        .unwrap()
        .server_input_lens
        .clone();
    assert!(
        counted
            .iter()
            .zip(&recs)
            .all(|(c, r)| c.is_some_and(|c| c != r.input_tokens)),
        "the server counted other lengths than the estimates: {counted:?}"
    );
    let (cmp, f) = super::real_traffic::compare_runs(&load(&stats.files[0]), &replayed);
    assert_eq!(f.isl_estimated, 3, "{f:?}");
    assert!(f.faithful, "{f:?}");
    let text =
        retrace::report::render::render(&cmp, &[], retrace::report::render::RenderFormat::Text);
    assert!(!text.contains("lengths differ"), "{text}");
    assert!(
        text.contains(
            "3 input lengths were estimated at record time (no usage, no tokenizer): not judged"
        ),
        "{text}"
    );
}
