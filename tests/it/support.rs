//! Shared helpers for integration tests.
//!
//! Also a small OpenAI-compatible SSE server with fixed timing and fault modes.
//!
//! Serves `POST /v1/completions`, `POST /v1/chat/completions` and `GET /v1/models` on 127.0.0.1:0.
//! Each completion streams `max_tokens` content chunks, the first after `ttft`, then one every
//! `itl`, then a usage chunk (with vLLM's per-request `metrics` object when `server_metrics`) and
//! `data: [DONE]`. The request's `max_tokens` selects a fault, so one trace can mix them:
//! 2 → HTTP 500 with a JSON error body; 3 → connection reset after one chunk; 4 → a malformed
//! (non-JSON) SSE message after one chunk; 5 → an error object in the stream. Not a simulator:
//! no batching, no queueing; only what metric and failure tests need.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// Writes a Mooncake trace `dir/trace.jsonl`: (timestamp ms, input_length, output_length,
/// hash_ids) per row.
pub fn mooncake(dir: &Path, rows: &[(u64, u64, u64, &[u64])]) -> PathBuf {
    let mut s = String::new();
    for (ts, i, o, h) in rows {
        s.push_str(&format!(
            "{{\"timestamp\": {ts}, \"input_length\": {i}, \"output_length\": {o}, \"hash_ids\": {h:?}}}\n"
        ));
    }
    let p = dir.join("trace.jsonl");
    std::fs::write(&p, s).unwrap();
    p
}

/// The replay configuration of `retrace replay ARGS...`, through the real CLI parser.
pub fn replay_config(args: &[&str]) -> anyhow::Result<retrace::replay::Config> {
    let mut v = vec!["retrace", "replay"];
    v.extend_from_slice(args);
    match <retrace::cli::Cli as clap::Parser>::try_parse_from(v)?.command {
        retrace::cli::Command::Replay(a) => a.config(),
        _ => unreachable!("replay subcommand"),
    }
}

/// [`replay_config`] for arguments that must parse.
pub fn replay_cfg(args: &[&str]) -> retrace::replay::Config {
    replay_config(args).expect("valid replay arguments")
}

/// How long a `retrace` child process of a test may run before it counts as hung.
pub const CHILD_LIMIT: std::time::Duration = std::time::Duration::from_secs(180);

/// A child process that is killed when dropped, so a failed assert never leaks it. A child
/// started by [`OutputWithin`] leads its own process group, and the whole group is killed (a
/// browser's helpers would otherwise keep its pipes open).
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.0.id()) {
            if self.0.try_wait().ok().flatten().is_none() {
                // SAFETY: kill(2) with a negative pid signals that process group; it touches no
                // memory of ours. A group of which this child is not the leader does not exist
                // (ESRCH), and the direct kill below still applies.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Address space a child under [`under_memory_limit`] may map: 1 GiB.
pub const MEMORY_LIMIT: u64 = 1 << 30;

/// Runs `cmd` (when spawned) under an address-space limit of `bytes` (`setrlimit(RLIMIT_AS)`),
/// so that an allocation beyond it fails: the child aborts or reports, and never takes the
/// machine. glibc's per-thread malloc arenas are capped so that their reservations do not count
/// against it.
pub fn under_memory_limit(
    cmd: &mut std::process::Command,
    bytes: u64,
) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    cmd.env("MALLOC_ARENA_MAX", "2");
    // SAFETY: the closure runs in the child between fork and exec and only calls setrlimit(2),
    // which is async-signal-safe; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: bytes as libc::rlim_t,
                rlim_max: bytes as libc::rlim_t,
            };
            match libc::setrlimit(libc::RLIMIT_AS, &lim) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        })
    }
}

/// Says why a test skips where cargo shows it: on the process's own standard error, past the
/// test harness's capture (which takes only the print macros), so a passing run still shows it.
pub fn say_skipped(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// Waits for `child` to exit, at most `limit`: a child still running then is killed (with its
/// process group, if it leads one) and the test fails (it hung).
pub fn wait_within(
    child: &mut std::process::Child,
    limit: std::time::Duration,
) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().expect("wait for the child") {
            return s;
        }
        if std::time::Instant::now() >= deadline {
            // SAFETY: signals to the child this test started (and to its own group, if any).
            unsafe {
                libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
                libc::kill(child.id() as libc::pid_t, libc::SIGKILL);
            }
            let _ = child.wait();
            panic!("the child still ran after {limit:?} (hung)");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// [`std::process::Command::output`] with a time limit.
pub trait OutputWithin {
    /// Runs the command to its end and captures stdout and stderr, as `output` does; a child
    /// still running after `limit` is killed and the test fails (it hung).
    fn output_within(
        &mut self,
        limit: std::time::Duration,
    ) -> std::io::Result<std::process::Output>;
}

impl OutputWithin for std::process::Command {
    fn output_within(
        &mut self,
        limit: std::time::Duration,
    ) -> std::io::Result<std::process::Output> {
        Running::spawn(self)?.wait_within(limit)
    }
}

/// A child leading its own process group, its stdout and stderr drained on threads as it runs
/// (stderr readable so far: [`Running::stderr`]); killed, group and all, when dropped.
pub struct Running {
    child: KillOnDrop,
    out: std::thread::JoinHandle<Vec<u8>>,
    err: Arc<std::sync::Mutex<Vec<u8>>>,
    err_done: std::thread::JoinHandle<()>,
}

impl Running {
    /// Spawns `cmd` with no stdin and its stdout and stderr piped.
    pub fn spawn(cmd: &mut std::process::Command) -> std::io::Result<Running> {
        use std::io::Read;
        use std::os::unix::process::CommandExt;
        use std::process::Stdio;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()?;
        let mut child = KillOnDrop(child);
        let mut stdout = child.0.stdout.take().expect("piped stdout");
        let out = std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = stdout.read_to_end(&mut v);
            v
        });
        let mut stderr = child.0.stderr.take().expect("piped stderr");
        let err = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = err.clone();
        let err_done = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = stderr.read(&mut buf) {
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Ok(Running {
            child,
            out,
            err,
            err_done,
        })
    }

    /// Sends `sig` (e.g. `libc::SIGINT`) to the child.
    pub fn signal(&self, sig: libc::c_int) {
        send_signal(&self.child.0, sig);
    }

    /// Its stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.err.lock().unwrap()).into_owned()
    }

    /// Whether it has ended.
    pub fn ended(&mut self) -> bool {
        self.child.0.try_wait().ok().flatten().is_some()
    }

    /// Waits (polling, at most `limit`) until `cond` holds of its stderr so far (or of
    /// something else); panics with its stderr when it does not, or when the child ended first.
    pub fn wait_for(
        &mut self,
        what: &str,
        limit: std::time::Duration,
        mut cond: impl FnMut(&str) -> bool,
    ) {
        let deadline = std::time::Instant::now() + limit;
        while !cond(&self.stderr()) {
            assert!(!self.ended(), "ended before {what}: {}", self.stderr());
            assert!(
                std::time::Instant::now() < deadline,
                "no {what} within {limit:?}: {}",
                self.stderr()
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Waits for the child's end and its output; a child still running after `limit` is killed
    /// and the test fails (it hung).
    pub fn wait_within(
        mut self,
        limit: std::time::Duration,
    ) -> std::io::Result<std::process::Output> {
        let deadline = std::time::Instant::now() + limit;
        let status = loop {
            if let Some(s) = self.child.0.try_wait()? {
                break s;
            }
            if std::time::Instant::now() >= deadline {
                let err = self.stderr();
                drop(self);
                panic!("the child still ran after {limit:?} (hung); its stderr: {err}");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let _ = self.err_done.join();
        let stderr = std::mem::take(&mut *self.err.lock().unwrap());
        Ok(std::process::Output {
            status,
            stdout: self.out.join().unwrap_or_default(),
            stderr,
        })
    }
}

/// Sends `sig` to `child`, a child this test started and has not reaped.
pub fn send_signal(child: &std::process::Child, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).expect("a pid");
    // SAFETY: kill(2) on the pid of a child of this test that is not reaped yet (its `Child` is
    // alive and not waited for), so the pid is not another process's; it touches no memory.
    let r = unsafe { libc::kill(pid, sig) };
    assert_eq!(r, 0, "kill: {}", std::io::Error::last_os_error());
}

/// The fidelity verdict of a replay on this machine: faithful, unless this (loaded) machine sent
/// late, which the verdict must then say, and nothing else may be wrong. The machine's own send
/// lateness is a benchmark's business, not a test's.
pub fn assert_faithful_or_sent_late(f: &retrace::report::workload::Fidelity) {
    if f.sent_on_time {
        assert!(f.faithful, "{f:?}");
        return;
    }
    assert!(!f.faithful, "{f:?}");
    let planned = f.schedule_error_ms.as_ref().map_or(0.0, |d| d.p99);
    assert!(planned <= 1.0, "planned off the recording: {f:?}");
    assert!(
        f.paired > 0 && f.unpaired == 0 && f.left_out == 0,
        "late, and more than late: {f:?}"
    );
    assert!(f.isl_exact == 1.0 && f.osl_exact == 1.0, "{f:?}");
    eprintln!(
        "this machine sent late (p99 {:.1} ms behind the recording); the verdict says so",
        f.arrival_error_ms.p99
    );
}

/// Path of a file relative to the repository root.
/// Two results (merged shards and one process) hold the same request count and token totals.
pub fn assert_same_counts(merged: &serde_json::Value, whole: &serde_json::Value) {
    for k in [
        "num_prompts",
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
    ] {
        assert_eq!(merged[k], whole[k], "{k}");
    }
}

pub fn repo(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Parses a retrace command line (without the program name).
pub fn cli(args: &[&str]) -> retrace::cli::Cli {
    use clap::Parser;
    let mut v = vec!["retrace"];
    v.extend_from_slice(args);
    retrace::cli::Cli::parse_from(v)
}

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Frame;
use hyper::{Request, Response};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub ttft: Duration,
    pub itl: Duration,
    pub server_metrics: bool,
    pub model: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            ttft: Duration::from_millis(20),
            itl: Duration::from_millis(5),
            server_metrics: false,
            model: "test-model".into(),
        }
    }
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub requests: Arc<AtomicU64>,
    /// Prompt token-id arrays received, in arrival order.
    pub prompts: Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
    /// When each completion request's head reached the server (seconds since the Unix epoch),
    /// in arrival order: the server's own clock, however late a test's watcher wakes.
    pub arrivals: Arc<std::sync::Mutex<Vec<f64>>>,
    /// The most completion requests the server held open at once (head read to stream end).
    pub max_in_flight: Arc<AtomicU64>,
    /// Each request's `Authorization` value, in arrival order (`""` without one).
    pub authorizations: Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TestServer {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

fn full(status: u16, body: &str, ctype: &str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", ctype)
        .body(
            Full::new(Bytes::from(body.to_string()))
                .map_err(|never| match never {})
                .boxed(),
        )
        .expect("valid response")
}

async fn handle(
    req: Request<hyper::body::Incoming>,
    cfg: ServerConfig,
    prompts: Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
    arrivals: Arc<std::sync::Mutex<Vec<f64>>>,
    open: InFlight,
) -> Result<Response<Body>, Infallible> {
    let arrived = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let path = req.uri().path().to_string();
    if path == "/v1/models" {
        let body =
            serde_json::json!({"object": "list", "data": [{"id": cfg.model, "object": "model"}]});
        return Ok(full(200, &body.to_string(), "application/json"));
    }
    let chat = path == "/v1/chat/completions";
    if path != "/v1/completions" && !chat {
        return Ok(full(
            404,
            r#"{"error":{"message":"not found"}}"#,
            "application/json",
        ));
    }
    arrivals.lock().unwrap().push(arrived);
    let open = open.enter();
    let Ok(bytes) = req.into_body().collect().await else {
        return Ok(full(400, "bad body", "text/plain"));
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes.to_bytes()) else {
        return Ok(full(
            400,
            r#"{"error":{"message":"not json"}}"#,
            "application/json",
        ));
    };
    prompts
        .lock()
        .unwrap()
        .push(v.get("prompt").cloned().unwrap_or(v["messages"].clone()));
    let n = v["max_tokens"].as_u64().unwrap_or(16);
    // A token-id prompt counts its ids, as a real server's usage does; anything else 1.
    let prompt_tokens = v["prompt"].as_array().map_or(1, |a| a.len().max(1));
    if n == 2 {
        return Ok(full(
            500,
            r#"{"error":{"message":"injected failure","type":"InternalServerError","code":500}}"#,
            "application/json",
        ));
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(16);
    tokio::spawn(async move {
        let _open = open;
        let send = |s: String| {
            let tx = tx.clone();
            async move { tx.send(Ok(Frame::data(Bytes::from(s)))).await.is_ok() }
        };
        let start = tokio::time::Instant::now();
        let obj = if chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let choice = |k: u64| {
            if chat {
                serde_json::json!([{"index": 0, "delta": {"content": format!(" t{k}")}, "finish_reason": null}])
            } else {
                serde_json::json!([{"index": 0, "text": format!(" t{k}"), "finish_reason": null}])
            }
        };
        tokio::time::sleep_until(start + cfg.ttft).await;
        if chat {
            let role = serde_json::json!({"object": obj, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]});
            if !send(format!("data: {role}\n\n")).await {
                return;
            }
        }
        for k in 0..n {
            let at = start + cfg.ttft + cfg.itl * (k as u32 + u32::from(chat));
            tokio::time::sleep_until(at).await;
            let chunk = serde_json::json!({"object": obj, "choices": choice(k)});
            if !send(format!("data: {chunk}\n\n")).await {
                return;
            }
            if k == 0 && n == 3 {
                let _ = tx
                    .send(Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "injected reset",
                    )))
                    .await;
                return;
            }
            if k == 0 && n == 4 {
                send("data: {this is not json\n\n".into()).await;
                send("data: [DONE]\n\n".into()).await;
                return;
            }
            if k == 0 && n == 5 {
                send("data: {\"error\":{\"message\":\"injected stream error\"}}\n\n".into()).await;
                send("data: [DONE]\n\n".into()).await;
                return;
            }
        }
        let mut usage = serde_json::json!({"object": obj, "choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": n + prompt_tokens as u64}});
        if cfg.server_metrics {
            usage["metrics"] = serde_json::json!({"queue_time_ms": 2.0, "time_to_first_token_ms": cfg.ttft.as_secs_f64() * 1000.0 - 5.0});
        }
        send(format!("data: {usage}\n\n")).await;
        send("data: [DONE]\n\n".into()).await;
    });
    Ok(Response::builder()
        .status(200)
        .header("content-type", "text/event-stream; charset=utf-8")
        .body(FrameChan(rx).boxed())
        .expect("valid response"))
}

/// Counts the server's open completion requests and keeps their maximum.
#[derive(Clone, Default)]
struct InFlight {
    now: Arc<AtomicU64>,
    max: Arc<AtomicU64>,
}

/// One open request of [`InFlight`], closed when dropped.
struct Open(InFlight);

impl InFlight {
    fn enter(self) -> Open {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        Open(self)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body fed by a channel (frames as the server task produces them).
struct FrameChan(tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>);

impl hyper::body::Body for FrameChan {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.0.poll_recv(cx)
    }
}

/// Starts the server on 127.0.0.1:0.
pub async fn start(cfg: ServerConfig) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let requests = Arc::new(AtomicU64::new(0));
    let prompts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let arrivals = Arc::new(std::sync::Mutex::new(Vec::new()));
    let open = InFlight::default();
    let max_in_flight = open.max.clone();
    let (r2, p2, a2) = (requests.clone(), prompts.clone(), arrivals.clone());
    let authorizations = Arc::new(std::sync::Mutex::new(Vec::new()));
    let auth2 = authorizations.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                continue;
            };
            let _ = sock.set_nodelay(true);
            let (cfg, r, p, a) = (cfg.clone(), r2.clone(), p2.clone(), a2.clone());
            let open = open.clone();
            let auth = auth2.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    r.fetch_add(1, Ordering::Relaxed);
                    let key = req.headers().get(hyper::header::AUTHORIZATION);
                    let key = key.map_or(String::new(), |v| {
                        String::from_utf8_lossy(v.as_bytes()).into()
                    });
                    auth.lock().unwrap().push(key);
                    handle(req, cfg.clone(), p.clone(), a.clone(), open.clone())
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(sock), svc)
                    .await;
            });
        }
    });
    TestServer {
        addr,
        requests,
        prompts,
        arrivals,
        max_in_flight,
        authorizations,
        task,
    }
}

/// A response body fed by a channel of chunks, so a scripted upstream controls every chunk and
/// its timing (the record tests' upstreams).
pub struct ChanBody(pub tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChanBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// `retrace record` under test: listening on 127.0.0.1:0 with its admin endpoint on another
/// loopback port; it drains and stops when `stop` is sent (or dropped).
pub struct Recorder {
    pub addr: std::net::SocketAddr,
    pub admin: std::net::SocketAddr,
    pub stop: tokio::sync::oneshot::Sender<()>,
    pub task: tokio::task::JoinHandle<anyhow::Result<retrace::record::RecordStats>>,
}

/// Starts a recorder with `cfg` on fresh loopback ports (see [`Recorder`]).
pub async fn spawn_recorder(cfg: retrace::record::RecordConfig) -> Recorder {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, admin) = (l.local_addr().unwrap(), a.local_addr().unwrap());
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(retrace::record::run_with_admin(
        l,
        Some(a),
        cfg,
        async move {
            let _ = rx.await;
        },
    ));
    Recorder {
        addr,
        admin,
        stop,
        task,
    }
}

/// Stops a recorder started by a test (`stop` sent) and waits for its stats, at most 20 s.
pub async fn stop_recorder(
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<retrace::record::RecordStats>>,
) -> retrace::record::RecordStats {
    let _ = stop.send(());
    tokio::time::timeout(std::time::Duration::from_secs(20), task)
        .await
        .expect("proxy stops")
        .unwrap()
        .unwrap()
}

/// Hash ids of a record of 10^7 input tokens at 16 tokens per block: the most any reader allows
/// it (2 × blocks + 16).
pub const RECORD_IDS: u64 = 1_250_016;

/// Writes a native trace of 16-token blocks whose records carry their hash ids as runs, frame
/// by frame without expanding any: `frames[k]` lists frame k's records as (arrival delta from
/// the previous record of the frame in µs, runs `[start, len, ...]`), each of 10^7 input tokens.
/// A few bytes declare millions of ids, so a small file expands to any total.
pub fn native_of_runs(path: &Path, frames: &[Vec<(i64, Vec<u64>)>]) {
    #[derive(serde::Serialize)]
    struct FrameHead {
        frame: u64,
        n: u64,
        first: u64,
    }
    #[derive(serde::Serialize)]
    struct Record<'a> {
        t: i64,
        i: u64,
        o: u64,
        h: &'a [u64],
    }
    let header = retrace::trace::TraceHeader::imported(16, true, "runs");
    let opts = retrace::trace::native::WriteOptions::default();
    let w = retrace::trace::native::TraceWriter::new(Vec::new(), &header, opts).unwrap();
    let mut out = w.finish().unwrap();
    let mut first = 0u64;
    for (k, recs) in frames.iter().enumerate() {
        let mut content = Vec::new();
        let head = FrameHead {
            frame: k as u64 + 1,
            n: recs.len() as u64,
            first,
        };
        ciborium::into_writer(&head, &mut content).unwrap();
        for (t, h) in recs {
            let r = Record {
                t: *t,
                i: 10_000_000,
                o: 1,
                h,
            };
            ciborium::into_writer(&r, &mut content).unwrap();
        }
        out.extend(zstd::bulk::compress(&content, 3).unwrap());
        first += recs.len() as u64;
    }
    std::fs::write(path, out).unwrap();
}

/// `records` records of [`RECORD_IDS`] distinct ids each in one frame, 1 µs apart: the 264-byte
/// file that expands to 2 × 10^7 ids at 16 records.
pub fn records_of_many_ids(path: &Path, records: u64) {
    let recs = (0..records)
        .map(|k| (i64::from(k > 0), vec![k * RECORD_IDS, RECORD_IDS]))
        .collect();
    native_of_runs(path, &[recs]);
}

/// `frames` frames each at the frame bound (26 records of [`RECORD_IDS`] distinct ids: 32.5 Mi
/// ids of the 32 Mi allowed), their arrivals interleaved (frame f's records at f, f + frames,
/// ...), so that a merge by arrival has every frame open at once.
pub fn overlapping_frames_at_the_id_bound(path: &Path, frames: u64) {
    let per_frame = retrace::trace::native::MAX_FRAME_IDS / RECORD_IDS;
    let all: Vec<Vec<(i64, Vec<u64>)>> = (0..frames)
        .map(|f| {
            (0..per_frame)
                .map(|k| {
                    let t = if k == 0 { f as i64 } else { frames as i64 };
                    (t, vec![(f * per_frame + k) * RECORD_IDS, RECORD_IDS])
                })
                .collect()
        })
        .collect();
    native_of_runs(path, &all);
}

/// A loopback port that refuses connections and stays this test's while the returned socket
/// lives: bound, never listening. (A port bound and freed could be handed to the next bind on
/// port 0, such as the proxy's own listener, which would then answer on it.)
pub fn refusing_port() -> (socket2::Socket, u16) {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    s.bind(&any.into()).unwrap();
    let port = s.local_addr().unwrap().as_socket().unwrap().port();
    (s, port)
}
