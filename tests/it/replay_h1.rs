//! `retrace replay`'s HTTP/1.1 client against a raw-socket server that controls the bytes on the
//! wire: chunked, Content-Length and close-delimited SSE bodies written in awkward pieces
//! (chunk-size lines and events split across writes), a connection closed mid-stream under both
//! framings, an HTTP error with a body, and a kept-alive connection the server closes while it is
//! idle. Bodies read on the reader threads and on the requests' tasks must give the same results.

use crate::support;
use retrace::replay;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Counts {
    connections: AtomicUsize,
    requests: AtomicUsize,
}

fn event(k: u64) -> String {
    format!("data: {{\"choices\":[{{\"index\":0,\"text\":\" t{k}\",\"finish_reason\":null}}]}}\n\n")
}

/// The SSE body of an `n`-token completion stream (usage and `[DONE]` included).
fn sse(n: u64) -> String {
    let mut s: String = (0..n).map(event).collect();
    s.push_str(&format!(
        "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":{n},\"total_tokens\":{}}}}}\n\n",
        n + 1
    ));
    s.push_str("data: [DONE]\n\n");
    s
}

fn chunk(s: &str) -> Vec<u8> {
    let mut v = format!("{:x}\r\n", s.len()).into_bytes();
    v.extend_from_slice(s.as_bytes());
    v.extend_from_slice(b"\r\n");
    v
}

/// Reads one request; returns its `max_tokens`, or `None` when the client closed.
async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<u64> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            let body_start = end + 4;
            while buf.len() < body_start + len {
                let mut b = [0u8; 4096];
                let n = s.read(&mut b).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&b[..n]);
            }
            let v: serde_json::Value = serde_json::from_slice(&buf[body_start..body_start + len])
                .expect("request body is JSON");
            buf.drain(..body_start + len);
            return v["max_tokens"].as_u64();
        }
        let mut b = [0u8; 4096];
        let n = s.read(&mut b).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&b[..n]);
    }
}

/// Writes `parts` one at a time with a pause between, so the client reads them separately.
async fn pieces(s: &mut TcpStream, parts: &[&[u8]]) -> std::io::Result<()> {
    for p in parts {
        s.write_all(p).await?;
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    Ok(())
}

/// One connection: answers requests by their `max_tokens` (the fault selector):
/// 3 chunked, 4 Content-Length, 5 close-delimited, 6 chunked cut after two events,
/// 7 Content-Length cut after two events, 8 HTTP 503 with a body, 9 Content-Length then the
/// connection is closed while idle (keep-alive was not refused), 10 Content-Length on a fresh
/// connection but on a reused one the request is read and the connection closed unanswered.
async fn serve(mut s: TcpStream, counts: Arc<Counts>) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut served = 0;
    while let Some(n) = read_request(&mut s, &mut buf).await {
        counts.requests.fetch_add(1, SeqCst);
        served += 1;
        if n == 10 && served > 1 {
            return Ok(());
        }
        let body = sse(n);
        let ok = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n";
        match n {
            3 => {
                let head = format!("{ok}transfer-encoding: chunked\r\n\r\n");
                // Event 0 split across two chunks; a chunk-size line split across writes.
                let (a, b) = body.split_at(10);
                let c1 = chunk(a);
                let c2 = chunk(b);
                let (c2a, c2b) = c2.split_at(1);
                let wire = [head.as_bytes(), &c1, c2a, c2b, b"0\r\n\r\n".as_slice()];
                pieces(&mut s, &wire).await?;
            }
            4 => {
                let head = format!("{ok}content-length: {}\r\n\r\n", body.len());
                let mut wire = head.into_bytes();
                wire.extend_from_slice(&body.as_bytes()[..30]);
                pieces(&mut s, &[&wire, &body.as_bytes()[30..]]).await?;
            }
            5 => {
                let head = format!("{ok}\r\n");
                let evs: Vec<String> = (0..5).map(event).collect();
                let mut parts: Vec<&[u8]> = vec![head.as_bytes()];
                parts.extend(evs.iter().map(|e| e.as_bytes()));
                let tail = &body[evs.concat().len()..];
                parts.push(tail.as_bytes());
                pieces(&mut s, &parts).await?;
                return Ok(());
            }
            6 => {
                let head = format!("{ok}transfer-encoding: chunked\r\n\r\n");
                let (c0, c1) = (chunk(&event(0)), chunk(&event(1)));
                pieces(&mut s, &[head.as_bytes(), &c0, &c1]).await?;
                return Ok(());
            }
            7 => {
                let head = format!("{ok}content-length: {}\r\n\r\n", body.len());
                let two = format!("{}{}", event(0), event(1));
                pieces(&mut s, &[head.as_bytes(), two.as_bytes()]).await?;
                return Ok(());
            }
            8 => {
                let msg = "server overloaded, try later";
                let r = format!(
                    "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{msg}",
                    msg.len()
                );
                s.write_all(r.as_bytes()).await?;
            }
            10 => {
                let head = format!("{ok}content-length: {}\r\n\r\n{body}", body.len());
                s.write_all(head.as_bytes()).await?;
            }
            _ => {
                let head = format!("{ok}content-length: {}\r\n\r\n{body}", body.len());
                s.write_all(head.as_bytes()).await?;
                tokio::time::sleep(Duration::from_millis(20)).await;
                return Ok(());
            }
        }
    }
    Ok(())
}

async fn raw_server() -> (String, Arc<Counts>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            c.connections.fetch_add(1, SeqCst);
            tokio::spawn(serve(s, c.clone()));
        }
    });
    (url, counts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_body_paths_follow_every_framing_and_fail_alike() {
    let dir = tempfile::tempdir().unwrap();
    // One at a time, 150 ms apart: the idle close of the max_tokens=9 answer happens before the
    // next request, which must still succeed (on a fresh connection).
    let rows: Vec<(u64, u64, u64, &[u64])> = vec![
        (0, 10, 3, &[0]),
        (150, 10, 4, &[1]),
        (300, 10, 9, &[2]),
        (450, 10, 3, &[3]),
        (600, 10, 5, &[4]),
        (750, 10, 6, &[5]),
        (900, 10, 7, &[6]),
        (1050, 10, 8, &[7]),
        (1200, 10, 4, &[8]),
    ];
    let trace = support::mooncake(dir.path(), &rows);
    let mut results = Vec::new();
    // Bodies are read on the reader threads by default, on the tasks with 0.
    for readers in ["auto", "0"] {
        let (url, counts) = raw_server().await;
        let out = dir.path().join(format!("readers-{readers}.json"));
        let cfg = support::replay_config(&[
            trace.to_str().unwrap(),
            "--target",
            &url,
            "--model",
            "m",
            "--max-concurrency",
            "1",
            "--reader-threads",
            readers,
            "--result-json",
            out.to_str().unwrap(),
            "--detailed",
        ])
        .unwrap();
        let on_readers = readers == "auto";
        let client = format!("readers {readers}");
        let o = replay::replay(cfg).await.unwrap();
        let s = &o.summary;
        assert_eq!((s.completed, s.failed), (6, 3), "{client}: {:?}", s.errors);
        assert_eq!(s.errors.get("reset"), Some(&2), "{client}: {:?}", s.errors);
        assert_eq!(s.errors.get("http_503"), Some(&1), "{client}");
        assert_eq!(s.total_output_tokens, 3 + 4 + 9 + 3 + 5 + 4, "{client}");
        assert_eq!(
            s.itl.count,
            2 + 3 + 8 + 2 + 4 + 3,
            "{client}: one ITL per gap"
        );
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        // The result says how bodies were read (kernel stamps: the default batch window).
        if on_readers {
            assert!(
                v["body_readers"]["threads"].as_u64().unwrap() >= 1,
                "{client}"
            );
            assert_eq!(v["body_readers"]["batch_us"], 500, "{client}");
        } else {
            assert!(
                v["body_readers"].is_null(),
                "{client}: {}",
                v["body_readers"]
            );
        }
        let errors: Vec<String> = v["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap_or("").to_string())
            .collect();
        assert!(
            errors.iter().any(|e| e.contains("server overloaded")),
            "{client}: the error body is the detail: {errors:?}"
        );
        assert_eq!(
            counts.requests.load(SeqCst),
            9,
            "{client}: no request sent twice"
        );
        results.push((
            client,
            v["output_lens"].clone(),
            counts.connections.load(SeqCst),
        ));
    }
    assert_eq!(
        results[0].1,
        serde_json::json!([3, 4, 9, 3, 5, 2, 2, 0, 4]),
        "output lengths (a cut stream counts what came before the cut)"
    );
    assert_eq!(
        results[0].1, results[1].1,
        "same output lengths on both paths"
    );
    // The warm connection serves 3, 4, 9; 9's idle close forces a new one for 3 and 5
    // (close-delimited); then one each for 6, 7 (cut), 8 (error: not reused) and the last 4.
    // The count holds however late the close is seen: a request written to the closed
    // connection is retried on a fresh one, and the server never reads it.
    assert_eq!(results[0].2, 6, "connections (reader threads)");
    assert_eq!(results[1].2, 6, "connections (tasks)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_connection_closed_before_the_response_is_retried_once() {
    let dir = tempfile::tempdir().unwrap();
    let trace = support::mooncake(
        dir.path(),
        &[(0, 10, 10, &[0]), (100, 10, 10, &[1]), (200, 10, 10, &[2])],
    );
    for readers in ["auto", "0"] {
        let client = format!("readers {readers}");
        let (url, counts) = raw_server().await;
        let cfg = support::replay_config(&[
            trace.to_str().unwrap(),
            "--target",
            &url,
            "--model",
            "m",
            "--max-concurrency",
            "1",
            "--reader-threads",
            readers,
        ])
        .unwrap();
        let o = replay::replay(cfg).await.unwrap();
        let s = &o.summary;
        assert_eq!((s.completed, s.failed), (3, 0), "{client}: {:?}", s.errors);
        assert_eq!(s.total_output_tokens, 30, "{client}");
        // Each reused connection swallows one request and closes: 3 answered + 2 retried.
        assert_eq!(counts.requests.load(SeqCst), 5, "{client}");
        assert_eq!(counts.connections.load(SeqCst), 3, "{client}");
    }
}
