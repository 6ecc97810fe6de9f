//! The floor of a streaming replay client: the least a client can do to send a trace's requests
//! on time and time every streamed event, with nothing else (no HTTP parsing beyond finding
//! events and the end of a response, no result statistics, no async runtime). `bench_replay.sh`
//! runs it as client `floor` beside `retrace replay` against the same fixed-timing mock, so the
//! replayer's CPU and ITL jitter can be judged against what any client pays on the same machine
//! in the same minute, not against zero (as `fwd_floor` is for the recording proxy).
//!
//! One thread over epoll: every request body is built and C connections are opened before the
//! clock starts; a timerfd (armed for each deadline, 1 ns resolution) releases each send
//! at the trace's offset; each readable socket gets one read, timed either by the clock after the
//! read (`--rx-stamp read`) or by the kernel's receive timestamp of its bytes (`--rx-stamp kernel`,
//! `retrace::sys::rxstamp`, as `retrace replay`'s default).
//!
//! It speaks only to `retrace mock` (or anything that writes each SSE event in its own HTTP chunk
//! and ends the body with the zero-length chunk): an event is a `data: {` whose JSON is not the
//! usage chunk (`"choices":[]`), and a response ends with `0\r\n\r\n`. TTFT and ITL follow vLLM's
//! rules (first content event minus send; then one gap per content event, zero for events that
//! share a read). Loopback only; bounded by the trace and `--timeout-s`.
//!
//! ```text
//! cargo build --release --example client_floor
//! target/release/examples/client_floor --target 127.0.0.1:PORT --trace steady.jsonl --out floor.json
//! ```
//! The trace is JSONL with `timestamp` (ms) and `output_length` per line (Mooncake's fields). The
//! result is a subset of `retrace replay --detailed`'s JSON: `completed`, `failed`, `duration`,
//! `ttfts`, `itls`, `start_times` (seconds), `client_cpu.run_s` (this process's user+system CPU
//! from the first send to the last end).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

const USAGE: &str = "usage: client_floor --target 127.0.0.1:PORT --trace FILE.jsonl --out FILE.json \
[--model mock-llama] [--input-tokens 100] [--max-concurrency C] [--rx-stamp read|kernel] [--timeout-s 120]";

#[derive(Debug)]
struct Config {
    target: SocketAddr,
    trace: String,
    out: String,
    model: String,
    input_tokens: usize,
    max_concurrency: usize,
    kernel_rx: bool,
    timeout: Duration,
}

/// Parses the command line (`args` without the program name); errors name the flag.
fn parse_args(args: &[String]) -> Result<Config, String> {
    let (mut target, mut trace, mut out) = (None, None, None);
    let mut model = "mock-llama".to_string();
    let mut input_tokens = 100usize;
    let mut max_concurrency = usize::MAX;
    let mut kernel_rx = false;
    let mut timeout_s = 120u64;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--target" => {
                let v = value()?;
                let sa: SocketAddr = v
                    .parse()
                    .map_err(|_| format!("--target: {v:?} is not IP:PORT"))?;
                if !sa.ip().is_loopback() {
                    return Err(format!("--target: {sa} is not a loopback address"));
                }
                target = Some(sa);
            }
            "--trace" => trace = Some(value()?),
            "--out" => out = Some(value()?),
            "--model" => model = value()?,
            "--input-tokens" => {
                let v = value()?;
                input_tokens = v
                    .parse()
                    .map_err(|_| format!("--input-tokens: {v:?} is not a whole number"))?;
            }
            "--max-concurrency" => {
                let v = value()?;
                max_concurrency =
                    v.parse().ok().filter(|c| *c > 0).ok_or_else(|| {
                        format!("--max-concurrency: {v:?} is not a whole number > 0")
                    })?;
            }
            "--rx-stamp" => {
                kernel_rx = match value()?.as_str() {
                    "read" => false,
                    "kernel" => true,
                    other => return Err(format!("--rx-stamp: {other:?} is not read or kernel")),
                }
            }
            "--timeout-s" => {
                let v = value()?;
                timeout_s = v
                    .parse()
                    .map_err(|_| format!("--timeout-s: {v:?} is not a whole number"))?;
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(Config {
        target: target.ok_or_else(|| format!("--target is required\n{USAGE}"))?,
        trace: trace.ok_or_else(|| format!("--trace is required\n{USAGE}"))?,
        out: out.ok_or_else(|| format!("--out is required\n{USAGE}"))?,
        model,
        input_tokens,
        max_concurrency,
        kernel_rx,
        timeout: Duration::from_secs(timeout_s),
    })
}

/// One trace row: when (offset from the first row) and how many tokens to ask for.
#[derive(Debug, PartialEq)]
struct Row {
    at: Duration,
    output_tokens: u64,
}

/// Reads `timestamp` (ms) and `output_length` from each non-empty JSONL line; errors name the line.
fn read_trace(path: &str, text: &str) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    let mut first = None;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{path}:{}: {e}", i + 1))?;
        let num = |k: &str| {
            v.get(k)
                .and_then(|x| x.as_f64())
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("{path}:{}: no non-negative number {k:?}", i + 1))
        };
        let ts = num("timestamp")?;
        let out = num("output_length")?;
        let t0 = *first.get_or_insert(ts);
        if ts < t0 {
            return Err(format!(
                "{path}:{}: timestamp {ts} is before the first row's",
                i + 1
            ));
        }
        rows.push(Row {
            at: Duration::from_secs_f64((ts - t0) / 1000.0),
            output_tokens: out as u64,
        });
    }
    if rows.is_empty() {
        return Err(format!("{path}: no requests"));
    }
    Ok(rows)
}

/// The whole request, bytes on the wire: a streamed completion of `input` token ids (distinct per
/// request, so no prefix is shared) with `max_tokens` and the usage chunk, as `retrace replay`
/// sends by default.
fn request_bytes(cfg: &Config, i: usize, row: &Row) -> Vec<u8> {
    let prompt: Vec<String> = (0..cfg.input_tokens)
        .map(|k| (1000 + (i * 7919 + k * 104_729) % 30_000).to_string())
        .collect();
    let body = format!(
        "{{\"model\":\"{}\",\"prompt\":[{}],\"max_tokens\":{},\"ignore_eos\":true,\"stream\":true,\"stream_options\":{{\"include_usage\":true}}}}",
        cfg.model,
        prompt.join(","),
        row.output_tokens
    );
    format!(
        "POST /v1/completions HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{}",
        cfg.target,
        body.len(),
        body
    )
    .into_bytes()
}

/// What one response's bytes said so far. An event counts when its closing blank line has
/// arrived (as a client that parses lines sees it); the bytes after the last whole event (a
/// cut event, or chunk framing) are scanned again with the next read's.
#[derive(Default, Debug)]
struct Scan {
    carry: Vec<u8>,
    /// Content events (not the usage chunk) seen, and whether the terminal chunk was seen.
    events: usize,
    done: bool,
    bad_status: bool,
    head_seen: bool,
}

const EVENT: &[u8] = b"data: ";
const USAGE_CHUNK: &[u8] = b"\"choices\":[]";
const END: &[u8] = b"\r\n0\r\n\r\n";

impl Scan {
    /// Feeds one read; returns how many content events it completed.
    fn feed(&mut self, data: &[u8]) -> usize {
        let mut carry = std::mem::take(&mut self.carry);
        let buf: &[u8] = if carry.is_empty() {
            data
        } else {
            carry.extend_from_slice(data);
            &carry
        };
        if !self.head_seen && buf.len() >= 12 {
            self.head_seen = true;
            self.bad_status = !buf.starts_with(b"HTTP/1.1 200");
        }
        let mut n = 0;
        let mut pos = 0;
        let mut cut = None;
        while let Some(p) = memchr::memmem::find(&buf[pos..], EVENT) {
            let at = pos + p;
            let Some(e) = memchr::memmem::find(&buf[at..], b"\n\n") else {
                cut = Some(at);
                break;
            };
            let ev = &buf[at..at + e];
            if ev.starts_with(b"data: {") && memchr::memmem::find(ev, USAGE_CHUNK).is_none() {
                n += 1;
            }
            pos = at + e + 2;
        }
        if buf.ends_with(END) {
            self.done = true;
        }
        // What follows the last whole event (a cut event, a cut marker, chunk framing) is read
        // again with the next read's bytes; bounded for bodies that are not SSE.
        let from = cut.unwrap_or(pos).max(buf.len().saturating_sub(64 * 1024));
        let rest = buf[from..].to_vec();
        carry.clear();
        carry.extend_from_slice(&rest);
        self.carry = carry;
        self.events += n;
        n
    }
}

/// One request's measurements.
#[derive(Default, Debug, Clone)]
struct Sample {
    sent: Option<Instant>,
    first: Option<Instant>,
    last: Option<Instant>,
    itls: Vec<f64>,
    failed: bool,
}

struct Conn {
    sock: TcpStream,
    /// Closed or broken: out of epoll, never reused.
    dead: bool,
    /// The request on this connection, if one is in flight.
    req: Option<usize>,
    scan: Scan,
}

/// One read, and when its bytes arrived: with `kernel`, the kernel's receive stamp through
/// `retrace::sys::rxstamp` (what `retrace replay --rx-stamp kernel` uses), else the read's own instant.
fn read_stamped(
    sock: &mut TcpStream,
    buf: &mut [u8],
    kernel: bool,
) -> std::io::Result<(usize, Instant)> {
    if !kernel {
        let n = sock.read(buf)?;
        return Ok((n, Instant::now()));
    }
    // SAFETY: viewing initialised bytes as MaybeUninit is sound; the kernel writes only
    // initialised bytes into them.
    let dst = unsafe { &mut *(buf as *mut [u8] as *mut [std::mem::MaybeUninit<u8>]) };
    retrace::sys::rxstamp::recv(sock.as_raw_fd(), dst)
}

/// Arms the timerfd to fire at `when` (relative to now; at once if it is due).
fn set_timer(tfd: i32, when: Instant) {
    let ns = when
        .saturating_duration_since(Instant::now())
        .as_nanos()
        .max(1);
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: (ns / 1_000_000_000) as _,
            tv_nsec: (ns % 1_000_000_000) as _,
        },
    };
    // SAFETY: timerfd_settime reads one itimerspec we own; tfd is our timerfd.
    unsafe { libc::timerfd_settime(tfd, 0, &spec, std::ptr::null_mut()) };
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes one rusage we own.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(r.ru_utime) + tv(r.ru_stime)
}

fn ctl(ep: i32, op: i32, fd: i32, events: u32, data: u64) -> std::io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: data };
    // SAFETY: epoll_ctl reads one epoll_event we own.
    if unsafe { libc::epoll_ctl(ep, op, fd, &mut ev) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn dial(cfg: &Config) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect(cfg.target)?;
    s.set_nodelay(true)?;
    if cfg.kernel_rx {
        retrace::sys::rxstamp::enable(s.as_raw_fd());
    }
    s.set_nonblocking(true)?;
    Ok(s)
}

const TIMER: u64 = u64::MAX;

/// Dials one more connection, watches it for reads (its index is its epoll data) and returns
/// that index.
fn open_conn(cfg: &Config, ep: i32, conns: &mut Vec<Conn>) -> std::io::Result<usize> {
    let sock = dial(cfg)?;
    ctl(
        ep,
        libc::EPOLL_CTL_ADD,
        sock.as_raw_fd(),
        libc::EPOLLIN as u32,
        conns.len() as u64,
    )?;
    conns.push(Conn {
        sock,
        req: None,
        dead: false,
        scan: Scan::default(),
    });
    Ok(conns.len() - 1)
}

/// Runs the trace; returns the samples, the run's wall time and its CPU seconds.
fn run(cfg: &Config, rows: &[Row]) -> std::io::Result<(Vec<Sample>, f64, f64)> {
    let wires: Vec<Vec<u8>> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| request_bytes(cfg, i, r))
        .collect();
    // As many connections as requests overlap at most, bounded by the request count: opened
    // before the clock starts; more are dialled during the run only if these are all busy.
    let span = rows.last().map(|r| r.at).unwrap_or_default();
    let per_s = rows.len() as f64 / span.as_secs_f64().max(1.0);
    let warm = ((per_s * 1.2).ceil() as usize + 16)
        .min(cfg.max_concurrency.saturating_add(16))
        .min(rows.len());
    // SAFETY: plain syscalls; the fds are checked and closed before returning.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    let tfd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC) };
    if ep < 0 || tfd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    ctl(ep, libc::EPOLL_CTL_ADD, tfd, libc::EPOLLIN as u32, TIMER)?;
    let mut conns: Vec<Conn> = Vec::new();
    let mut idle: Vec<usize> = Vec::new();
    for _ in 0..warm {
        idle.push(open_conn(cfg, ep, &mut conns)?);
    }
    idle.reverse();
    let mut samples = vec![Sample::default(); rows.len()];
    let mut buf = vec![0u8; 64 * 1024];
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
    let t0 = Instant::now() + Duration::from_millis(20);
    let cpu0 = cpu_seconds();
    let mut next = 0usize;
    let mut open = 0usize;
    set_timer(tfd, t0 + rows[0].at);
    let mut armed = 0usize;
    let give_up = t0 + span + cfg.timeout;
    while (next < rows.len() || open > 0) && Instant::now() < give_up {
        // SAFETY: epoll_wait writes at most events.len() entries into our buffer.
        let n = unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), events.len() as i32, 100) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        for ev in &events[..n as usize] {
            if ev.u64 == TIMER {
                let mut x = [0u8; 8];
                // SAFETY: reading the timerfd's 8-byte expiry count into our buffer.
                unsafe { libc::read(tfd, x.as_mut_ptr().cast(), 8) };
                continue;
            }
            let c = ev.u64 as usize;
            let conn = &mut conns[c];
            let (k, at) = match read_stamped(&mut conn.sock, &mut buf, cfg.kernel_rx) {
                Ok(x) => x,
                Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                Err(_) => (0, Instant::now()),
            };
            if k == 0 {
                // The server closed (or broke) the connection: its request, if any, failed.
                conn.dead = true;
                let _ = ctl(ep, libc::EPOLL_CTL_DEL, conn.sock.as_raw_fd(), 0, 0);
                if let Some(r) = conn.req.take() {
                    samples[r].failed = true;
                    open -= 1;
                }
                continue;
            }
            let Some(r) = conn.req else {
                continue; // bytes nobody asked for on an idle connection: ignored
            };
            let fresh = conn.scan.feed(&buf[..k]);
            let s = &mut samples[r];
            for _ in 0..fresh {
                match s.last {
                    None => s.first = Some(at),
                    Some(prev) => s
                        .itls
                        .push(at.saturating_duration_since(prev).as_secs_f64()),
                }
                s.last = Some(at);
            }
            if conn.scan.done {
                s.failed |= conn.scan.bad_status || s.first.is_none();
                conn.req = None;
                open -= 1;
                idle.push(c);
            }
        }
        // Sends that are due, as far as the concurrency limit allows; then the timer for the next.
        let now = Instant::now();
        while next < rows.len() && t0 + rows[next].at <= now && open < cfg.max_concurrency {
            while idle.last().is_some_and(|&c| conns[c].dead) {
                idle.pop();
            }
            let c = match idle.pop() {
                Some(c) => c,
                None => open_conn(cfg, ep, &mut conns)?,
            };
            let conn = &mut conns[c];
            samples[next].sent = Some(Instant::now());
            // The request is a few hundred bytes on an idle loopback socket: one write.
            match conn.sock.write(&wires[next]) {
                Ok(k) if k == wires[next].len() => {
                    conn.req = Some(next);
                    conn.scan = Scan::default();
                    open += 1;
                }
                _ => {
                    samples[next].failed = true;
                    conn.dead = true;
                    let _ = ctl(ep, libc::EPOLL_CTL_DEL, conn.sock.as_raw_fd(), 0, 0);
                }
            }
            next += 1;
        }
        if next < rows.len() && open < cfg.max_concurrency && next != armed {
            set_timer(tfd, t0 + rows[next].at);
            armed = next;
        }
    }
    let wall = Instant::now().saturating_duration_since(t0).as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    for s in samples.iter_mut() {
        if s.sent.is_some() && s.first.is_none() {
            s.failed = true; // unfinished at the deadline, or no content
        }
    }
    // SAFETY: closing fds we created.
    unsafe {
        libc::close(tfd);
        libc::close(ep);
    }
    let samples = samples
        .into_iter()
        .map(|mut s| {
            if s.failed {
                s.itls.clear();
            }
            s
        })
        .collect::<Vec<_>>();
    Ok((samples, wall, cpu))
}

fn result_json(samples: &[Sample], wall: f64, cpu: f64) -> serde_json::Value {
    let origin = samples.iter().filter_map(|s| s.sent).min();
    let ok: Vec<&Sample> = samples.iter().filter(|s| !s.failed).collect();
    let secs = |t: Instant| {
        origin
            .map(|o| t.saturating_duration_since(o).as_secs_f64())
            .unwrap_or(0.0)
    };
    serde_json::json!({
        "client": "client_floor",
        "completed": ok.len(),
        "failed": samples.len() - ok.len(),
        "duration": wall,
        "client_cpu": {"run_s": cpu},
        "ttfts": ok.iter().map(|s| match (s.sent, s.first) {
            (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
            _ => 0.0,
        }).collect::<Vec<_>>(),
        "itls": ok.iter().map(|s| s.itls.clone()).collect::<Vec<_>>(),
        "start_times": ok.iter().map(|s| s.sent.map(secs).unwrap_or(0.0)).collect::<Vec<_>>(),
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cfg = match parse_args(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("client_floor: {e}");
            std::process::exit(2);
        }
    };
    let rows = match std::fs::read_to_string(&cfg.trace)
        .map_err(|e| format!("{}: {e}", cfg.trace))
        .and_then(|t| read_trace(&cfg.trace, &t))
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("client_floor: {e}");
            std::process::exit(1);
        }
    };
    let (samples, wall, cpu) = match run(&cfg, &rows) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("client_floor: {}: {e}", cfg.target);
            std::process::exit(1);
        }
    };
    let out = result_json(&samples, wall, cpu);
    if let Err(e) = std::fs::write(&cfg.out, out.to_string()) {
        eprintln!("client_floor: {}: {e}", cfg.out);
        std::process::exit(1);
    }
    eprintln!(
        "client_floor: {} completed, {} failed, {:.2} s wall, {:.2} s CPU",
        out["completed"], out["failed"], wall, cpu
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_counts_content_events_once_across_split_reads() {
        let stream = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
            1a\r\ndata: {\"choices\":[{\"text\":\"a\"}]}\n\n\r\n\
            1a\r\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\n\r\n\
            20\r\ndata: {\"choices\":[],\"usage\":{}}\n\n\r\n\
            e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";
        for split in 1..stream.len() {
            let mut s = Scan::default();
            let (a, b) = stream.split_at(split);
            let n = s.feed(a) + s.feed(b);
            assert_eq!(n, 2, "split at {split}");
            assert!(s.done, "split at {split}");
            assert!(!s.bad_status);
        }
        let mut s = Scan::default();
        s.feed(b"HTTP/1.1 503 Service Unavailable\r\n\r\n");
        assert!(s.bad_status);
        assert!(!s.done);
    }

    #[test]
    fn trace_rows_are_offsets_from_the_first_and_errors_name_the_line() {
        let rows = read_trace(
            "t",
            "{\"timestamp\": 5, \"output_length\": 3}\n\n{\"timestamp\": 7.5, \"output_length\": 1}\n",
        )
        .unwrap();
        assert_eq!(
            rows,
            vec![
                Row {
                    at: Duration::ZERO,
                    output_tokens: 3
                },
                Row {
                    at: Duration::from_micros(2500),
                    output_tokens: 1
                }
            ]
        );
        let e = read_trace(
            "t",
            "{\"timestamp\": 1, \"output_length\": 1}\n{\"timestamp\": 0}",
        )
        .unwrap_err();
        assert!(e.starts_with("t:2:"), "{e}");
        assert!(read_trace("t", "").unwrap_err().contains("no requests"));
        let e = parse_args(&["--target".into(), "10.0.0.1:80".into()]).unwrap_err();
        assert!(e.contains("--target"), "{e}");
    }

    /// The whole client against the mock: every request completes with one TTFT at the mock's
    /// fixed first-token time and one gap per later token, for both ways of stamping reads and
    /// under a concurrency limit (requests wait for a free slot, then all complete).
    #[test]
    fn runs_a_trace_against_the_mock() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let mock = rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let cfg = retrace::mock::MockConfig {
                fixed_timing: Some((20.0, 2.0)),
                ..Default::default()
            };
            retrace::mock::start(l, cfg).await.unwrap()
        });
        let trace: String = (0..6)
            .map(|i| format!("{{\"timestamp\": {}, \"output_length\": 5}}\n", i * 3))
            .collect();
        let rows = read_trace("t", &trace).unwrap();
        for (kernel_rx, max_concurrency) in [(false, usize::MAX), (true, 2)] {
            let cfg = Config {
                target: mock.addr,
                trace: "t".into(),
                out: "-".into(),
                model: "mock-llama".into(),
                input_tokens: 8,
                max_concurrency,
                kernel_rx,
                timeout: Duration::from_secs(20),
            };
            let (samples, wall, cpu) = run(&cfg, &rows).unwrap();
            let v = result_json(&samples, wall, cpu);
            assert_eq!(v["completed"], 6, "{v}");
            assert_eq!(v["failed"], 0, "{v}");
            for (ttft, itls) in v["ttfts"]
                .as_array()
                .unwrap()
                .iter()
                .zip(v["itls"].as_array().unwrap())
            {
                let ttft = ttft.as_f64().unwrap();
                assert!((0.019..1.0).contains(&ttft), "{v}");
                assert_eq!(itls.as_array().unwrap().len(), 4, "{v}");
            }
        }
        drop(mock);
    }
}
