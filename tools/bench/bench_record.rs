//! Benchmark helper for `retrace record` (driven by `tools/bench/bench_record.sh`): a fixed-timing SSE
//! upstream, a streaming load generator that measures TTFT and ITL at the client, a small-request
//! throughput loop, and an idle-stream holder for memory measurements.
//!
//! It only talks to loopback addresses given on its command line, and every loop is bounded in
//! count and time. It measures; it does not judge (the script compares targets side by side).
//!
//! ```text
//! cargo run --release --example bench_record -- upstream --listen 127.0.0.1:18001 --ttft-ms 50 --itl-ms 10 --tokens 100
//! cargo run --release --example bench_record -- stream --url http://127.0.0.1:18002/v1/completions --concurrency 1000 --requests 3000
//! cargo run --release --example bench_record -- small --url http://127.0.0.1:18002/small --concurrency 64 --seconds 5
//! cargo run --release --example bench_record -- idle --url http://127.0.0.1:18002/idle --streams 1000 --hold-s 10
//! ```

use bytes::Bytes;
use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Fixed-timing upstream: `/v1/completions` streams, `/small` answers at once, `/idle` holds.
    Upstream {
        #[arg(long)]
        listen: String,
        #[arg(long, default_value_t = 50)]
        ttft_ms: u64,
        #[arg(long, default_value_t = 10)]
        itl_ms: u64,
        #[arg(long, default_value_t = 100)]
        tokens: u32,
        /// Exit after this many seconds.
        #[arg(long, default_value_t = 3600)]
        lifetime_s: u64,
    },
    /// Streams `requests` requests over `concurrency` connections; prints TTFT/ITL percentiles.
    Stream {
        #[arg(long)]
        url: String,
        #[arg(long, default_value_t = 100)]
        concurrency: usize,
        #[arg(long, default_value_t = 1000)]
        requests: usize,
        #[arg(long, default_value = "target")]
        label: String,
        /// Unmeasured requests each connection makes first (connection setup is not TTFT).
        #[arg(long, default_value_t = 1)]
        warmup: usize,
        /// Spread the connections' first measured requests evenly over this many ms (after their
        /// warm-up), so that with a spread of one stream lifetime the streams' phases are spread
        /// (a steady state of `concurrency` streams in flight) instead of starting, and so ending
        /// and restarting, all together (0, the default: a burst).
        #[arg(long, default_value_t = 0)]
        spread_ms: u64,
        /// Speak HTTP/2 with prior knowledge (h2c): streams multiplexed on `--h2-conns` connections.
        #[arg(long)]
        h2: bool,
        #[arg(long, default_value_t = 4)]
        h2_conns: usize,
    },
    /// Small non-streamed requests for `seconds`; prints requests per second.
    Small {
        #[arg(long)]
        url: String,
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        #[arg(long, default_value = "target")]
        label: String,
    },
    /// Opens `streams` streams that stay idle (headers only), holds them `hold_s` seconds.
    Idle {
        #[arg(long)]
        url: String,
        #[arg(long, default_value_t = 1000)]
        streams: usize,
        #[arg(long, default_value_t = 10)]
        hold_s: u64,
        /// Speak HTTP/2 with prior knowledge (h2c): streams multiplexed on `--h2-conns` connections.
        #[arg(long)]
        h2: bool,
        #[arg(long, default_value_t = 4)]
        h2_conns: usize,
    },
}

struct ChanBody(mpsc::Receiver<Bytes>);

impl http_body::Body for ChanBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

async fn upstream(listen: String, ttft: Duration, itl: Duration, tokens: u32, lifetime: Duration) {
    // A deep backlog: a proxy opening thousands of upstream connections at once must not see
    // SYNs dropped (a one-second retransmit each).
    let sa: std::net::SocketAddr = listen.parse().expect("--listen IP:PORT");
    let sock = if sa.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .expect("socket");
    sock.set_reuseaddr(true).expect("SO_REUSEADDR");
    sock.bind(sa).expect("bind upstream");
    let l = sock.listen(4096).expect("listen");
    let end = Instant::now() + lifetime;
    loop {
        let (tcp, _) = tokio::select! {
            a = l.accept() => match a { Ok(x) => x, Err(_) => { tokio::time::sleep(Duration::from_millis(5)).await; continue } },
            _ = tokio::time::sleep_until(end) => return,
        };
        let _ = tcp.set_nodelay(true);
        tokio::spawn(async move {
            let svc = service_fn(
                move |req: hyper::Request<hyper::body::Incoming>| async move {
                    let path = req.uri().path().to_string();
                    let _ = req.into_body().collect().await;
                    let (tx, rx) = mpsc::channel::<Bytes>(4);
                    let mut resp = hyper::Response::new(ChanBody(rx));
                    match path.as_str() {
                        "/small" => {
                            let b = Bytes::from_static(br#"{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":1}}"#);
                            resp.headers_mut()
                                .insert("content-type", "application/json".parse().unwrap());
                            resp.headers_mut()
                                .insert("content-length", b.len().to_string().parse().unwrap());
                            let _ = tx.try_send(b);
                        }
                        "/idle" => {
                            resp.headers_mut()
                                .insert("content-type", "text/event-stream".parse().unwrap());
                            tokio::spawn(async move {
                                tokio::time::sleep(Duration::from_secs(600)).await;
                                drop(tx);
                            });
                        }
                        _ => {
                            resp.headers_mut()
                                .insert("content-type", "text/event-stream".parse().unwrap());
                            tokio::spawn(async move {
                                let t0 = Instant::now();
                                for k in 0..tokens {
                                    let due = t0 + ttft + itl * k;
                                    tokio::time::sleep_until(due).await;
                                    let ev = format!("data: {{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{{\"index\":0,\"text\":\" tok{k}\",\"finish_reason\":null}}]}}\n\n");
                                    if tx.send(Bytes::from(ev)).await.is_err() {
                                        return;
                                    }
                                }
                                let _ = tx.send(Bytes::from_static(b"data: {\"id\":\"cmpl-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":100}}\n\ndata: [DONE]\n\n")).await;
                            });
                        }
                    }
                    Ok::<_, Infallible>(resp)
                },
            );
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}

type Http = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn client(conc: usize) -> Http {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(conc)
        .build(http)
}

/// HTTP/1.1 keep-alive pool (one client), or `conns` h2c clients (each one multiplexed
/// connection); task `k` uses client `k % len`.
fn clients(conc: usize, h2: bool, conns: usize) -> Vec<Http> {
    if !h2 {
        return vec![client(conc)];
    }
    (0..conns.max(1))
        .map(|_| {
            let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
            http.set_nodelay(true);
            Client::builder(TokioExecutor::new())
                .http2_only(true)
                .http2_initial_stream_window_size(1 << 20)
                .http2_initial_connection_window_size(64 << 20)
                .build(http)
        })
        .collect()
}

const BODY: &[u8] = br#"{"model":"m","prompt":[1,2,3,4],"max_tokens":100,"stream":true}"#;

/// A duration in whole µs, saturating (a sample is at most the run's 300 s deadline).
fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

fn pct(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

struct StreamLoad {
    conc: usize,
    requests: usize,
    warmup: usize,
    spread: Duration,
}

async fn stream(url: String, load: StreamLoad, label: String, cs: Vec<Http>) {
    let StreamLoad {
        conc,
        requests: n,
        warmup,
        spread,
    } = load;
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(300);
    let mut tasks = Vec::new();
    for k in 0..conc {
        let c = cs[k % cs.len()].clone();
        let (url, next, errors) = (url.clone(), next.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            // Raw samples (µs), merged into one exact histogram at the end: per-connection
            // histograms with 3 significant digits had 32 µs buckets at 32-65 ms, too coarse for
            // added latencies of tens of µs.
            let mut ttft: Vec<u32> = Vec::new();
            let mut itl: Vec<u32> = Vec::new();
            let mut warm = warmup;
            // This connection's place in the spread, counted from the end of its warm-up.
            let offset = spread.mul_f64(k as f64 / conc as f64);
            let mut spread_pending = !spread.is_zero();
            while warm > 0
                || ((next.fetch_add(1, Ordering::Relaxed) as usize) < n
                    && Instant::now() < deadline)
            {
                let measured = warm == 0;
                warm = warm.saturating_sub(1);
                if measured && spread_pending {
                    spread_pending = false;
                    tokio::time::sleep(offset).await;
                }
                let req = hyper::Request::post(url.as_str())
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from_static(BODY)))
                    .unwrap();
                let t0 = Instant::now();
                let Ok(resp) = c.request(req).await else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                let mut body = resp.into_body();
                let mut last: Option<Instant> = None;
                loop {
                    match body.frame().await {
                        Some(Ok(f)) if f.is_data() && !measured => {}
                        Some(Ok(f)) if f.is_data() => {
                            let now = Instant::now();
                            match last {
                                None => ttft.push(micros(now - t0)),
                                Some(p) => itl.push(micros(now - p)),
                            }
                            last = Some(now);
                        }
                        Some(Ok(_)) => {}
                        Some(Err(_)) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        None => break,
                    }
                }
            }
            (ttft, itl)
        }));
    }
    // 5 significant digits: every value below 131 ms is its own 1 µs bucket.
    let mut ttft = Histogram::<u64>::new(5).unwrap();
    let mut itl = Histogram::<u64>::new(5).unwrap();
    for t in tasks {
        let (a, b) = t.await.unwrap();
        for v in a {
            let _ = ttft.record(u64::from(v));
        }
        for v in b {
            let _ = itl.record(u64::from(v));
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{{\"label\":\"{label}\",\"concurrency\":{conc},\"requests\":{},\"errors\":{},\"seconds\":{secs:.2},\"ttft_ms\":{{\"p50\":{:.3},\"p90\":{:.3},\"p99\":{:.3},\"mean\":{:.3}}},\"itl_ms\":{{\"p50\":{:.3},\"p90\":{:.3},\"p99\":{:.3},\"mean\":{:.3},\"n\":{}}}}}",
        ttft.len(),
        errors.load(Ordering::Relaxed),
        pct(&ttft, 0.5),
        pct(&ttft, 0.9),
        pct(&ttft, 0.99),
        ttft.mean() / 1000.0,
        pct(&itl, 0.5),
        pct(&itl, 0.9),
        pct(&itl, 0.99),
        itl.mean() / 1000.0,
        itl.len()
    );
}

async fn small(url: String, conc: usize, secs: u64, label: String) {
    let c = client(conc);
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..conc {
        let (c, url, done, errors) = (c.clone(), url.clone(), done.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Histogram::<u64>::new(3).unwrap();
            while Instant::now() < end {
                let req = hyper::Request::post(url.as_str())
                    .body(Full::new(Bytes::from_static(
                        br#"{"model":"m","prompt":"hi","max_tokens":1}"#,
                    )))
                    .unwrap();
                let t0 = Instant::now();
                let ok = match c.request(req).await {
                    Ok(r) if r.status().is_success() => r.into_body().collect().await.is_ok(),
                    _ => false,
                };
                if ok {
                    done.fetch_add(1, Ordering::Relaxed);
                    let _ = lat.record(t0.elapsed().as_micros() as u64);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            lat
        }));
    }
    let mut lat = Histogram::<u64>::new(3).unwrap();
    for t in tasks {
        lat.add(t.await.unwrap()).unwrap();
    }
    let el = start.elapsed().as_secs_f64();
    println!(
        "{{\"label\":\"{label}\",\"concurrency\":{conc},\"requests\":{},\"errors\":{},\"rps\":{:.0},\"latency_ms\":{{\"p50\":{:.3},\"p99\":{:.3}}}}}",
        done.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
        done.load(Ordering::Relaxed) as f64 / el,
        pct(&lat, 0.5),
        pct(&lat, 0.99)
    );
}

async fn idle(url: String, streams: usize, hold: u64, cs: Vec<Http>) {
    let mut bodies = Vec::with_capacity(streams);
    let mut futs = Vec::new();
    for k in 0..streams {
        let c = &cs[k % cs.len()];
        let req = hyper::Request::post(url.as_str())
            .body(Full::new(Bytes::from_static(BODY)))
            .unwrap();
        futs.push(tokio::spawn(c.request(req)));
    }
    let mut failed = 0;
    for f in futs {
        match f.await {
            Ok(Ok(r)) => bodies.push(r.into_body()),
            _ => failed += 1,
        }
    }
    println!(
        "{{\"idle_streams_open\":{},\"failed\":{failed}}}",
        bodies.len()
    );
    tokio::time::sleep(Duration::from_secs(hold.min(600))).await;
    drop(bodies);
}

fn main() {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(match cli.cmd {
            Cmd::Upstream { .. } => 1,
            _ => 2,
        })
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        match cli.cmd {
            Cmd::Upstream {
                listen,
                ttft_ms,
                itl_ms,
                tokens,
                lifetime_s,
            } => {
                upstream(
                    listen,
                    Duration::from_millis(ttft_ms),
                    Duration::from_millis(itl_ms),
                    tokens,
                    Duration::from_secs(lifetime_s),
                )
                .await
            }
            Cmd::Stream {
                url,
                concurrency,
                requests,
                label,
                warmup,
                spread_ms,
                h2,
                h2_conns,
            } => {
                let cs = clients(concurrency.max(1), h2, h2_conns);
                let load = StreamLoad {
                    conc: concurrency.max(1),
                    requests,
                    warmup,
                    spread: Duration::from_millis(spread_ms.min(600_000)),
                };
                stream(url, load, label, cs).await
            }
            Cmd::Small {
                url,
                concurrency,
                seconds,
                label,
            } => small(url, concurrency.max(1), seconds.min(120), label).await,
            Cmd::Idle {
                url,
                streams,
                hold_s,
                h2,
                h2_conns,
            } => idle(url, streams, hold_s, clients(streams, h2, h2_conns)).await,
        }
    });
}
