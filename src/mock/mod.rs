//! `retrace mock`: a simulated vLLM-compatible inference engine, and the embedded default target
//! of `retrace replay` (docs/mock.md). [`start`] serves the API ([`api`]) on a bound listener;
//! connections ([`conn`]) hand requests to the engine thread ([`engine`]), which runs the pure
//! scheduler ([`sched`], with the prefix cache [`cache`]) in real time and writes each streamed
//! event to its socket ([`stream`], text by [`format`]). This module holds the config and wires
//! the parts together.

pub(crate) mod api;
pub(crate) mod auth;
pub(crate) mod cache;
pub(crate) mod conn;
pub(crate) mod embed;
pub(crate) mod emit;
pub(crate) mod engine;
pub(crate) mod exposition;
pub(crate) mod faults;
pub(crate) mod format;
pub(crate) mod responses;
pub(crate) mod sched;
pub(crate) mod shape;
pub(crate) mod tokenize;

use anyhow::{bail, Context};
pub use auth::ApiKey;
pub use conn::ConnTimeouts;
pub(crate) use exposition::LatenessSummary;
pub use faults::FaultConfig;
pub use sched::{CostModel, Profile};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// Everything the mock can be told. Every knob has a default (`MockConfig::default()`).
#[derive(Debug, Clone)]
pub struct MockConfig {
    /// Served model name; requests naming another model get 404.
    pub model: String,
    /// `(ttft_ms, itl_ms)`: bypass the cost model, exact timings whatever the load.
    pub fixed_timing: Option<(f64, f64)>,
    /// Seed for output tokens, EOS positions and faults.
    pub seed: u64,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: u32,
    /// KV block size in tokens (prefix-cache granularity).
    pub block_size: u32,
    /// KV cache capacity in tokens (rounded down to whole blocks).
    pub kv_cache_tokens: u64,
    /// Context length: prompts of this many tokens or more get 400.
    pub max_model_len: u32,
    /// Tokens per SSE event after the first (speculative-decoding style).
    pub tokens_per_event: u32,
    /// Put vLLM's per-request `metrics` object on the usage chunk / in the body.
    pub enable_per_request_metrics: bool,
    /// HF `tokenizer.json`; `None` uses the built-in scheme.
    pub tokenizer: Option<PathBuf>,
    pub cost: CostModel,
    /// Per-token EOS probability after `min_tokens` when `ignore_eos` is false.
    pub eos_prob: f64,
    pub faults: FaultConfig,
    /// Threads serving HTTP (the engine has its own thread besides).
    pub io_threads: usize,
    /// Run the engine, writer and HTTP threads under SCHED_FIFO (needs CAP_SYS_NICE): keeps
    /// emission on time on a machine busy with other work.
    pub realtime: bool,
    /// Minimum gap between two hand-overs of due events, in microseconds: events due within it
    /// go out together (less CPU per event), each at most this much late on the engine's side.
    pub coalesce_us: u64,
    /// Dimension of `/v1/embeddings` vectors (at most 8,192; `dimensions` may ask fewer).
    pub embedding_dim: u32,
    /// How long a connection waits for a request to arrive whole, or idle, before it is closed
    /// (library only: the CLI keeps the defaults, 30 s and 60 s).
    pub timeouts: ConnTimeouts,
    /// `--api-key`: requests under `/v1` without `Authorization: Bearer KEY` get 401
    /// ([`auth`]).
    pub api_key: Option<ApiKey>,
}

impl Default for MockConfig {
    /// `retrace mock` with no flags: its defaults are these.
    fn default() -> Self {
        MockConfig {
            model: "mock-llama".into(),
            fixed_timing: None,
            seed: 0,
            max_num_seqs: 256,
            max_num_batched_tokens: Profile::DEFAULT.max_num_batched_tokens,
            block_size: 16,
            kv_cache_tokens: 1 << 20,
            max_model_len: 131072,
            tokens_per_event: 1,
            enable_per_request_metrics: false,
            tokenizer: None,
            cost: Profile::DEFAULT.cost,
            eos_prob: 0.002,
            faults: FaultConfig::default(),
            io_threads: 2,
            realtime: false,
            coalesce_us: 100,
            embedding_dim: 1024,
            timeouts: ConnTimeouts::default(),
            api_key: None,
        }
    }
}

impl MockConfig {
    /// Checks the knobs; errors name the flag.
    pub(crate) fn validate(&self) -> anyhow::Result<()> {
        if self.model.is_empty() {
            bail!("--model must not be empty");
        }
        if let Some((t, i)) = self.fixed_timing {
            if !(t.is_finite() && i.is_finite() && t >= 0.0 && i >= 0.0 && t < 3.6e6 && i < 3.6e6) {
                bail!(
                    "--fixed-timing: TTFT_MS,ITL_MS must be non-negative milliseconds, got {t},{i}"
                );
            }
        }
        let (c, f, n) = (&self.cost, &self.faults, f64::INFINITY);
        for (name, v, lo, hi) in [
            ("--max-num-seqs", self.max_num_seqs as f64, 1.0, n),
            (
                "--max-num-batched-tokens",
                self.max_num_batched_tokens.into(),
                1.0,
                n,
            ),
            ("--block-size", self.block_size.into(), 1.0, 65536.0),
            ("--max-model-len", self.max_model_len.into(), 2.0, n),
            ("--tokens-per-event", self.tokens_per_event.into(), 1.0, n),
            ("--io-threads", self.io_threads as f64, 1.0, 64.0),
            // It bounds the mock's own lateness.
            ("--coalesce-us", self.coalesce_us as f64, 0.0, 1000.0),
            ("--eos-prob", self.eos_prob, 0.0, 1.0),
            (
                "MockConfig::embedding_dim",
                self.embedding_dim.into(),
                1.0,
                embed::MAX_DIM.into(),
            ),
            ("--request-overhead-ms", c.request_overhead_ms, 0.0, 60e3),
            ("--step-overhead-ms", c.step_overhead_ms, 0.0, 60e3),
            ("--prefill-token-ms", c.prefill_token_ms, 0.0, 60e3),
            ("--seq-ms", c.seq_ms, 0.0, 60e3),
            ("--context-token-ms", c.context_token_ms, 0.0, 60e3),
            ("--fault-status-rate", f.status_rate, 0.0, 1.0),
            ("--fault-stall-first-rate", f.stall_first_rate, 0.0, 1.0),
            ("--fault-stall-mid-rate", f.stall_mid_rate, 0.0, 1.0),
            ("--fault-reset-rate", f.reset_rate, 0.0, 1.0),
            ("--fault-slow-headers-rate", f.slow_headers_rate, 0.0, 1.0),
            ("--fault-stall-ms", f.stall_ms, 0.0, 3.6e6),
            ("--fault-slow-headers-ms", f.slow_headers_ms, 0.0, 3.6e6),
        ] {
            if !(lo..=hi).contains(&v) && hi.is_infinite() {
                bail!("{name} must be at least {lo}, got {v}");
            } else if !(lo..=hi).contains(&v) {
                bail!("{name} must be within {lo}..={hi}, got {v}");
            }
        }
        let u = |v: u32| u64::from(v);
        let kv = self.kv_cache_tokens;
        if kv < u(self.max_model_len) + u(self.block_size) {
            bail!(
                "--kv-cache-tokens ({kv}) must hold at least one full-length sequence (--max-model-len {} + one block)",
                self.max_model_len
            );
        }
        if kv / u(self.block_size) > 1 << 26 {
            bail!("--kv-cache-tokens is too large for --block-size (at most 2^26 blocks)");
        }
        if self.timeouts.request.is_zero() || self.timeouts.idle.is_zero() {
            bail!("MockConfig::timeouts must not be zero");
        }
        if let Some(c) = f.status_codes.iter().find(|c| !(400..=599).contains(*c)) {
            bail!("--fault-status-codes: {c} is not an error status (400..599)");
        }
        Ok(())
    }

    fn sched_config(&self, vocab: u32) -> sched::SchedConfig {
        let ms = |v: f64| Duration::from_secs_f64(v / 1e3);
        sched::SchedConfig {
            fixed: self.fixed_timing.map(|(t, i)| (ms(t), ms(i))),
            cost: self.cost,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            block_size: self.block_size,
            kv_blocks: (self.kv_cache_tokens / u64::from(self.block_size)) as usize,
            tokens_per_event: self.tokens_per_event,
            seed: self.seed,
            eos_prob: self.eos_prob,
            vocab,
        }
    }

    /// The defaults with `profile`'s cost model and step budget.
    pub fn with_profile(profile: Profile) -> MockConfig {
        MockConfig {
            cost: profile.cost,
            max_num_batched_tokens: profile.max_num_batched_tokens,
            ..MockConfig::default()
        }
    }
}

/// A running mock. Dropping it without [`MockHandle::shutdown`] stops it abruptly.
pub struct MockHandle {
    pub addr: SocketAddr,
    stop: tokio::sync::watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
    stats: Arc<exposition::EngineCounters>,
    /// The mock's own runtime: its I/O threads are not shared with the caller's tasks, so a busy
    /// client in the same process (replay) does not delay the mock's emissions.
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for MockHandle {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl MockHandle {
    /// Graceful stop: no new connections, open streams end, connections close (bounded wait).
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }

    /// Emission lateness so far.
    pub fn lateness(&self) -> LatenessSummary {
        self.stats.lateness.summary()
    }

    /// The `/metrics` text, without HTTP.
    pub fn metrics_text(&self) -> String {
        self.stats.render()
    }
}

/// Starts the engine on an already-bound listener (tests bind 127.0.0.1:0). The mock runs on its
/// own runtime threads (`io_threads` of them) and its own engine thread.
pub async fn start(
    listener: tokio::net::TcpListener,
    cfg: MockConfig,
) -> anyhow::Result<MockHandle> {
    cfg.validate()?;
    let addr = listener
        .local_addr()
        .context("listener has no local address")?;
    // Loaded away from the runtime's threads.
    let tokenizer = Arc::new(match cfg.tokenizer.clone() {
        None => tokenize::Tokenizer::Builtin,
        Some(p) => tokio::task::spawn_blocking(move || tokenize::Tokenizer::from_file(&p))
            .await
            .context("tokenizer loading task failed")??,
    });
    let listener = listener
        .into_std()
        .context("cannot detach the listener from the caller's runtime")?;
    let stats = Arc::new(exposition::EngineCounters::new(&cfg.model));
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    // From here on, an error drops `h`, which stops the runtime.
    let mut h = MockHandle {
        addr,
        stop,
        task: None,
        rt: Some(runtime(&cfg, stats.clone())?),
        stats: stats.clone(),
    };
    let rt = h.rt.as_ref().expect("just set");
    // Turns the kernel's receive timestamps on while the mock runs (it does so a moment later,
    // before clients normally send); accepted sockets ask for them too (conn.rs).
    crate::sys::rxstamp::enable(std::os::fd::AsRawFd::as_raw_fd(&listener));
    let listener = {
        let _g = rt.enter();
        tokio::net::TcpListener::from_std(listener).context("cannot register the listener")?
    };
    let scfg = cfg.sched_config(tokenizer.vocab());
    let inbox = Arc::new(engine::Inbox::new(&scfg));
    let coalesce = Duration::from_micros(cfg.coalesce_us);
    let (etx, ethread) = engine::spawn(scfg, cfg.realtime, coalesce, stats.clone(), inbox.clone())
        .context("cannot start the engine thread")?;
    let shared = Arc::new(api::Shared {
        model: cfg.model.clone(),
        max_model_len: cfg.max_model_len,
        per_request_metrics: cfg.enable_per_request_metrics,
        seed: cfg.seed,
        eos_prob: cfg.eos_prob,
        embedding_dim: cfg.embedding_dim,
        faults: cfg.faults.clone(),
        tokenizer,
        stats,
        engine: etx.clone(),
        inbox,
        next_id: AtomicU64::new(0),
        started_unix: api::unix_now(),
    });
    let key = cfg.api_key.clone();
    let handler: conn::Handler = Arc::new(move |req, ctx| match auth::refuse(&req, key.as_ref()) {
        Some(refused) => Box::pin(std::future::ready(Ok(refused))),
        None => Box::pin(api::handle(req, shared.clone(), ctx)),
    });
    let task = rt.spawn(async move {
        let mut alive = accept_loop(listener, handler, cfg.timeouts, stop_rx).await;
        // Open streams end when the engine stops; then the connections close.
        let _ = etx.send(engine::Cmd::Shutdown);
        let _ = tokio::task::spawn_blocking(move || ethread.join()).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), alive.recv()).await;
    });
    h.task = Some(task);
    Ok(h)
}

/// The mock's own runtime (`io_threads` threads, SCHED_FIFO with `realtime`).
fn runtime(
    cfg: &MockConfig,
    stats: Arc<exposition::EngineCounters>,
) -> anyhow::Result<tokio::runtime::Runtime> {
    let realtime = cfg.realtime;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.io_threads.max(1))
        .thread_name("mock-io")
        .on_thread_start(move || stats.go_realtime(realtime))
        .enable_all()
        .build()
        .context("cannot start the mock's runtime")
}

/// Serves connections until `stop`; the returned channel closes when the last one has closed.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    handler: conn::Handler,
    timeouts: ConnTimeouts,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::sync::mpsc::Receiver<()> {
    // Every connection task holds a clone; when all are gone, `recv` returns None.
    let (alive_tx, alive_rx) = tokio::sync::mpsc::channel::<()>(1);
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    let (h, stop, alive) = (handler.clone(), stop.clone(), alive_tx.clone());
                    tokio::spawn(async move {
                        conn::serve(stream, h, timeouts, stop).await;
                        drop(alive);
                    });
                }
                Err(e) => {
                    // Out of descriptors and similar: keep serving the open connections.
                    tracing::warn!("mock: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            _ = stop.changed() => break,
        }
    }
    alive_rx
}

/// `retrace mock`: serves `cfg` on `listen` until SIGINT or SIGTERM, then prints the
/// emission-lateness summary.
pub(crate) fn run(listen: &str, cfg: MockConfig) -> anyhow::Result<std::process::ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let stop = crate::sys::signal::shutdown();
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("--listen {listen}: cannot bind"))?;
        let h = start(listener, cfg.clone()).await?;
        eprintln!(
            "retrace mock: serving model `{}` on http://{} ({})",
            cfg.model,
            h.addr,
            match cfg.fixed_timing {
                Some((t, i)) => format!("fixed timing: TTFT {t} ms, ITL {i} ms"),
                None => "cost model".to_string(),
            }
        );
        if cfg.realtime {
            // Give the threads a moment to start before reporting.
            tokio::time::sleep(Duration::from_millis(50)).await;
            if h.stats.realtime_failed.load(std::sync::atomic::Ordering::Relaxed) {
                eprintln!("retrace mock: warning: --realtime refused by the OS (needs CAP_SYS_NICE); running with normal priority");
            }
        }
        stop.await;
        let l = h.lateness();
        let d = h.stats.dispatch.summary();
        eprintln!(
            "retrace mock: {} events, emission lateness p50 {} us, p99 {} us, p99.9 {} us, max {} us (engine clock alone: p50 {} us, p99 {} us, max {} us)",
            l.count, l.p50_us, l.p99_us, l.p999_us, l.max_us, d.p50_us, d.p99_us, d.max_us
        );
        h.shutdown().await;
        Ok(std::process::ExitCode::SUCCESS)
    })
}
