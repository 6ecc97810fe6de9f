//! Benchmark of `retrace record`'s upgraded tunnels (WebSocket passthrough): round-trip latency
//! of small messages and bulk echo throughput, direct vs through the recorder, interleaved over rounds, plus the recorder I/O thread's CPU per MiB tunnelled.
//!
//! Everything runs in this process on loopback: an upstream that answers `101` to an upgrade
//! request and echoes every byte, the recorder (`record::run_with_admin`, one I/O thread, trace
//! into a temporary directory) and the client. Usage (release):
//!
//! ```text
//! cargo run --release --example bench_tunnel -- [ROUNDS] [ROUND_TRIPS] [BULK_MIB]
//! ```
//!
//! Defaults: 3 rounds, 5000 round trips of 64 bytes, 64 MiB echoed in 64 KiB writes. Every loop
//! is bounded in count and each phase in time (60 s). `TARGETS=retrace` (or `direct`, a
//! comma list) runs only those: under `valgrind --tool=callgrind` the difference between a
//! proxied run and a direct one is the proxy's instruction count, repeatable on a busy machine
//! (see tools/bench/bench_tunnel.sh). It does not measure the recording of ordinary requests (see
//! tools/bench/bench_record.md).

use retrace::record::{self, RecordConfig};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PHASE_LIMIT: Duration = Duration::from_secs(60);

async fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut tmp = vec![0u8; 64 << 10];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut tmp).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&tmp[..n]),
                    }
                }
                let head = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
                if s.write_all(head).await.is_err() {
                    return;
                }
                loop {
                    match s.read(&mut tmp).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if s.write_all(&tmp[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

/// Connects and, through a proxy, switches protocols.
async fn open(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(
        b"GET /ws HTTP/1.1\r\nHost: b\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).await.unwrap(), 1, "101 head");
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

/// Round-trip times (µs) of `n` sequential 64-byte messages.
async fn round_trips(addr: SocketAddr, n: usize) -> Vec<f64> {
    let mut s = open(addr).await;
    let msg = [7u8; 64];
    let mut back = [0u8; 64];
    let mut out = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        if start.elapsed() > PHASE_LIMIT {
            break;
        }
        let t = Instant::now();
        s.write_all(&msg).await.unwrap();
        s.read_exact(&mut back).await.unwrap();
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    out
}

/// Echoes `mib` MiB through the tunnel; MiB/s.
async fn bulk(addr: SocketAddr, mib: usize) -> f64 {
    let s = open(addr).await;
    let (mut r, mut w) = s.into_split();
    let total = mib << 20;
    let t = Instant::now();
    let writer = tokio::spawn(async move {
        let chunk = vec![1u8; 64 << 10];
        let mut sent = 0;
        while sent < total {
            w.write_all(&chunk).await.unwrap();
            sent += chunk.len();
        }
        w
    });
    let mut got = 0;
    let mut buf = vec![0u8; 64 << 10];
    while got < total && t.elapsed() < PHASE_LIMIT {
        let n = r.read(&mut buf).await.unwrap();
        assert!(n > 0, "tunnel closed early");
        got += n;
    }
    let _w = writer.await.unwrap();
    (got as f64 / (1 << 20) as f64) / t.elapsed().as_secs_f64()
}

/// CPU time (user + system) of this process's thread named `name`, seconds.
fn thread_cpu(name: &str) -> Option<f64> {
    let tick = 100.0; // USER_HZ on Linux
    for e in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = e.ok()?.path();
        if std::fs::read_to_string(dir.join("comm")).ok()?.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split(' ').collect();
        let utime: f64 = f.get(11)?.parse().ok()?;
        let stime: f64 = f.get(12)?.parse().ok()?;
        return Some((utime + stime) / tick);
    }
    None
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn median(mut v: Vec<f64>) -> f64 {
    pct(&mut v, 0.5)
}

#[derive(Default)]
struct Row {
    p50: Vec<f64>,
    p99: Vec<f64>,
    mibs: Vec<f64>,
    cpu_per_mib_us: Vec<f64>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("ROUNDS ROUND_TRIPS BULK_MIB are numbers"))
        .collect();
    let rounds = args.first().copied().unwrap_or(3).clamp(1, 20);
    let n = args.get(1).copied().unwrap_or(5000).clamp(10, 1_000_000);
    let mib = args.get(2).copied().unwrap_or(64).clamp(1, 4096);
    let up = upstream().await;
    // `true`: through retrace record.
    let targets: [(&str, bool); 2] = [("direct", false), ("retrace", true)];
    let only = std::env::var("TARGETS").unwrap_or_default();
    let wanted = |name: &str| {
        only.is_empty()
            || only
                .split(',')
                .any(|t| !t.is_empty() && name.ends_with(t.trim()))
    };
    let mut rows: Vec<Row> = (0..targets.len()).map(|_| Row::default()).collect();
    for round in 0..rounds {
        for (k, (name, engine)) in targets.iter().enumerate() {
            if !wanted(name) {
                continue;
            }
            let dir = tempfile::tempdir().unwrap();
            let mut proxy = None;
            let addr = match engine {
                false => up,
                true => {
                    let mut cfg =
                        RecordConfig::new(&format!("http://{up}"), dir.path().join("out")).unwrap();
                    cfg.io_threads = 1;
                    cfg.drain_timeout = Duration::from_secs(1);
                    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
                    let a = l.local_addr().unwrap();
                    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                    let task = tokio::spawn(record::run_with_admin(l, None, cfg, async move {
                        let _ = rx.await;
                    }));
                    proxy = Some((tx, task));
                    a
                }
            };
            let mut rt = round_trips(addr, n).await;
            let cpu0 = thread_cpu("retrace-io-0");
            let rate = bulk(addr, mib).await;
            let cpu1 = thread_cpu("retrace-io-0");
            let row = &mut rows[k];
            row.p50.push(pct(&mut rt, 0.5));
            row.p99.push(pct(&mut rt, 0.99));
            row.mibs.push(rate);
            if let (Some(a), Some(b), true) = (cpu0, cpu1, *engine) {
                row.cpu_per_mib_us.push((b - a) * 1e6 / mib as f64);
            }
            if let Some((tx, task)) = proxy {
                let _ = tx.send(());
                let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
            }
            eprintln!("round {round} {name}: done");
        }
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "tunnel benchmark: {rounds} rounds, {n} round trips of 64 B, {mib} MiB echoed; medians over rounds; loadavg {}",
        load.split(' ').take(3).collect::<Vec<_>>().join(" ")
    );
    println!(
        "{:<14} {:>10} {:>10} {:>12} {:>24}",
        "target", "RTT p50 µs", "RTT p99 µs", "echo MiB/s", "proxy CPU µs/MiB echoed"
    );
    for ((name, _), row) in targets.iter().zip(rows) {
        if row.mibs.is_empty() {
            continue;
        }
        let cpu = if row.cpu_per_mib_us.is_empty() {
            "-".to_string()
        } else {
            format!("{:.0}", median(row.cpu_per_mib_us))
        };
        println!(
            "{:<14} {:>10.1} {:>10.1} {:>12.0} {:>24}",
            name,
            median(row.p50),
            median(row.p99),
            median(row.mibs),
            cpu
        );
    }
}
