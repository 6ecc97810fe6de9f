//! Benchmark of `retrace mock` (run by `tools/bench/bench_mock.sh`; not part of `cargo test`).
//!
//! Starts the release `retrace mock` binary as a separate process on a loopback port, drives it
//! with a bounded Rust load client (one HTTP/1.1 connection per stream, each stream re-requesting
//! until the scenario's duration is over), and reports: SSE events per second, the mock process's
//! CPU (user+system from /proc, in cores), its peak and current RSS, its own emission lateness
//! (scraped from `/metrics`: `retrace_mock_emit_lateness_quantile_seconds`), and the client-side
//! TTFT and ITL for reference. Every scenario is bounded in streams, tokens and wall time, and
//! talks only to 127.0.0.1. Usage:
//! `bench_mock --retrace target/release/retrace [--streams 1000] [--tokens 100] [--secs 10]
//! [--ttft 50] [--itl 10] [--label NAME] [--mock-args "--realtime"]`.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Opts {
    retrace: String,
    streams: usize,
    tokens: u32,
    secs: f64,
    ttft: f64,
    itl: f64,
    label: String,
    /// Extra `retrace mock` arguments (whitespace-separated), e.g. "--realtime".
    extra: String,
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = Opts {
        retrace: "target/release/retrace".into(),
        streams: 1000,
        tokens: 100,
        secs: 10.0,
        ttft: 50.0,
        itl: 10.0,
        label: String::new(),
        extra: String::new(),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = args
            .get(i + 1)
            .ok_or_else(|| format!("{} needs a value", args[i]))?;
        let num = |v: &str| v.parse::<f64>().map_err(|e| format!("{}: {e}", args[i]));
        match args[i].as_str() {
            "--retrace" => o.retrace = v.clone(),
            "--streams" => o.streams = num(v)? as usize,
            "--tokens" => o.tokens = num(v)? as u32,
            "--secs" => o.secs = num(v)?,
            "--ttft" => o.ttft = num(v)?,
            "--itl" => o.itl = num(v)?,
            "--label" => o.label = v.clone(),
            "--mock-args" => o.extra = v.clone(),
            other => return Err(format!("unknown option {other}")),
        }
        i += 2;
    }
    if o.streams == 0 || o.streams > 20_000 || o.secs <= 0.0 || o.secs > 600.0 {
        return Err("--streams must be 1..=20000 and --secs 0..=600".into());
    }
    Ok(o)
}

/// (utime + stime) in seconds, RSS kB, peak RSS kB of a process.
fn proc_usage(pid: u32) -> (f64, u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = f.get(11).and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (cpu / tick, kb("VmRSS:"), kb("VmHWM:"))
}

/// CPU seconds per thread name of a process.
fn thread_cpu(pid: u32) -> std::collections::BTreeMap<String, f64> {
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let mut out = std::collections::BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in dir.flatten() {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let name = stat
            .split_once('(')
            .and_then(|(_, r)| r.rsplit_once(')'))
            .map(|(n, _)| n.to_string())
            .unwrap_or_default();
        let f: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect();
        let cpu = f.get(11).and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0)
            + f.get(12).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
        *out.entry(name).or_insert(0.0) += cpu / tick;
    }
    out
}

fn self_cpu() -> f64 {
    proc_usage(std::process::id()).0
}

#[derive(Default)]
struct Samples {
    ttft_us: Vec<u64>,
    itl_us: Vec<u64>,
}

async fn stream_loop(
    addr: SocketAddr,
    body: Bytes,
    until: Instant,
    events: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    samples: Arc<Mutex<Samples>>,
) {
    let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
        errors.fetch_add(1, Relaxed);
        return;
    };
    let _ = stream.set_nodelay(true);
    let Ok((mut tx, conn)) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await
    else {
        errors.fetch_add(1, Relaxed);
        return;
    };
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut local = Samples::default();
    while Instant::now() < until {
        let req = http::Request::post("/v1/completions")
            .header("host", "mock")
            .header("content-type", "application/json")
            .body(Full::new(body.clone()))
            .expect("static request");
        let t0 = Instant::now();
        let Ok(resp) = tx.send_request(req).await else {
            errors.fetch_add(1, Relaxed);
            return;
        };
        let mut b = resp.into_body();
        let mut p = retrace::wire::sse::SseParser::default();
        let mut last: Option<Instant> = None;
        let mut n = 0u64;
        while let Some(f) = b.frame().await {
            let Ok(f) = f else {
                errors.fetch_add(1, Relaxed);
                return;
            };
            if let Some(d) = f.data_ref() {
                let now = Instant::now();
                let mut got = 0;
                p.feed(d, |e| {
                    if e.map(|e| !e.is_done()).unwrap_or(false) {
                        got += 1;
                    }
                });
                if got > 0 {
                    match last {
                        None => local.ttft_us.push((now - t0).as_micros() as u64),
                        Some(l) => local.itl_us.push((now - l).as_micros() as u64),
                    }
                    last = Some(now);
                    n += got;
                }
            }
        }
        events.fetch_add(n, Relaxed);
    }
    let mut s = samples.lock().expect("no panics while holding");
    s.ttft_us.extend(local.ttft_us);
    s.itl_us.extend(local.itl_us);
}

fn pct(v: &mut [u64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_unstable();
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i] as f64 / 1000.0
}

async fn scrape(addr: SocketAddr) -> String {
    let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
        return String::new();
    };
    let Ok((mut tx, conn)) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await
    else {
        return String::new();
    };
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = http::Request::get("/metrics")
        .header("host", "mock")
        .body(Full::new(Bytes::new()))
        .expect("static request");
    match tx.send_request(req).await {
        Ok(r) => match r.into_body().collect().await {
            Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
            Err(_) => String::new(),
        },
        Err(_) => String::new(),
    }
}

fn gauge(txt: &str, name: &str, label: &str) -> f64 {
    txt.lines()
        .find(|l| l.starts_with(name) && l.contains(label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

fn main() {
    let o = match parse_opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("bench_mock: {e}");
            std::process::exit(2);
        }
    };
    let mut child = Command::new(&o.retrace)
        .args([
            "mock",
            "--listen",
            "127.0.0.1:0",
            "--fixed-timing",
            &format!("{},{}", o.ttft, o.itl),
        ])
        .args(o.extra.split_whitespace())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", o.retrace));
    let pid = child.id();
    let mut err = BufReader::new(child.stderr.take().expect("piped"));
    let mut line = String::new();
    err.read_line(&mut line).expect("mock prints its address");
    let addr: SocketAddr = line
        .split("http://")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no address in: {line}"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let body = Bytes::from(format!(
        r#"{{"model":"mock-llama","prompt":[1,2,3,4,5,6,7,8],"max_tokens":{},"ignore_eos":true,"stream":true}}"#,
        o.tokens
    ));
    let events = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let samples = Arc::new(Mutex::new(Samples::default()));
    let (cpu0, _, _) = proc_usage(pid);
    let ccpu0 = self_cpu();
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs_f64(o.secs);
    let mut rss_during = 0;
    rt.block_on(async {
        let mut tasks = Vec::with_capacity(o.streams);
        for i in 0..o.streams {
            tasks.push(tokio::spawn(stream_loop(
                addr,
                body.clone(),
                until,
                events.clone(),
                errors.clone(),
                samples.clone(),
            )));
            // Spread stream starts over the first ITL so events do not all fall due together.
            if i % 100 == 99 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        // Sample the mock's RSS while every stream is open.
        tokio::time::sleep(Duration::from_secs_f64((o.secs / 2.0).min(5.0))).await;
        rss_during = proc_usage(pid).1;
        for t in tasks {
            let _ = t.await;
        }
    });
    let wall = t0.elapsed().as_secs_f64();
    let (cpu1, _rss, hwm) = proc_usage(pid);
    let threads = thread_cpu(pid);
    let ccpu1 = self_cpu();
    let metrics = rt.block_on(scrape(addr));
    unsafe {
        libc::kill(pid as i32, libc::SIGINT);
    }
    let mut summary = String::new();
    for l in err.lines().map_while(Result::ok) {
        summary = l;
    }
    let _ = child.wait();
    let n = events.load(Relaxed);
    let mut s = samples.lock().expect("all tasks done");
    let q = |p: &str| {
        gauge(
            &metrics,
            "retrace_mock_emit_lateness_quantile_seconds",
            &format!("quantile=\"{p}\""),
        ) * 1e3
    };
    println!(
        "== {} streams={} fixed-timing={},{} tokens/request={} duration={:.1}s mock-args=[{}]",
        o.label, o.streams, o.ttft, o.itl, o.tokens, wall, o.extra
    );
    if let Ok(l) = std::fs::read_to_string("/proc/loadavg") {
        println!("machine load average (1/5/15 min) at the end: {}", l.trim());
    }
    println!(
        "events: {n} ({:.0} SSE events/s), client errors: {}",
        n as f64 / wall,
        errors.load(Relaxed)
    );
    println!(
        "mock CPU: {:.2} cores (user+sys {:.2} s over {:.1} s); load client CPU: {:.2} cores",
        (cpu1 - cpu0) / wall,
        cpu1 - cpu0,
        wall,
        (ccpu1 - ccpu0) / wall
    );
    println!(
        "mock RSS with all streams open: {:.1} MiB; peak RSS: {:.1} MiB",
        rss_during as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    println!(
        "mock emission lateness (its /metrics): p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms",
        q("0.5"),
        q("0.99"),
        q("0.999"),
        q("1")
    );
    println!(
        "client-side (incl. client overhead): TTFT p50 {:.2} ms p99 {:.2} ms; ITL p50 {:.2} ms p99 {:.2} ms",
        pct(&mut s.ttft_us, 0.5),
        pct(&mut s.ttft_us, 0.99),
        pct(&mut s.itl_us, 0.5),
        pct(&mut s.itl_us, 0.99)
    );
    let per_thread: Vec<String> = threads
        .iter()
        .map(|(k, v)| format!("{k} {:.2} cores", v / wall))
        .collect();
    println!("mock CPU by thread: {}", per_thread.join(", "));
    println!("mock's own summary: {summary}");
}
