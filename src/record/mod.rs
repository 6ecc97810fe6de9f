//! `retrace record`: a transparent recording proxy in front of an OpenAI-compatible server
//! (module map in ARCHITECTURE.md, behaviour in docs/record.md). [`serve`] takes an already-bound
//! listener and a shutdown future (invariant 6); [`run`] is the command.

pub(crate) mod admin;
mod buf;
pub(crate) mod common;
pub mod counters;
pub mod extract;
pub(crate) mod failure;
pub(crate) mod h1;
pub(crate) mod h2;
pub(crate) mod pastcap;
pub mod prompt;
pub(crate) mod rawpool;
pub mod server;
pub(crate) mod servertok;
pub mod shadow;
pub(crate) mod tap;
pub(crate) mod timing;
pub(crate) mod tunnel;
pub mod upstream;
pub mod writer;

pub use extract::Bodies;

use anyhow::{bail, Context as _};
use http::uri::{Authority, Scheme};
use http::Uri;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::net::TcpListener;

/// Validated settings of one recording proxy.
#[derive(Debug, Clone)]
pub struct RecordConfig {
    /// Upstream base URL (`http://host:port` or `https://host/prefix`).
    pub(crate) upstream: Uri,
    pub(crate) out_dir: PathBuf,
    /// File name prefix.
    pub(crate) name: String,
    /// `(cert, key)` PEM files to terminate TLS.
    pub tls: Option<(PathBuf, PathBuf)>,
    pub upstream_ca: Option<PathBuf>,
    pub upstream_http2: bool,
    pub(crate) connect_timeout: Duration,
    pub headers_timeout: Duration,
    pub idle_timeout: Duration,
    pub total_timeout: Option<Duration>,
    pub drain_timeout: Duration,
    pub bodies: Bodies,
    /// Secret for HMAC-SHA256 block hashes (the bytes of `--hash-key-file`, trailing newline cut).
    pub hash_key: Option<Vec<u8>>,
    pub tokenizer: Option<PathBuf>,
    /// Count estimated input lengths with the upstream's `POST /tokenize` (`servertok`); off
    /// with `--no-upstream-tokenize`, and whenever `tokenizer` is set.
    pub upstream_tokenize: bool,
    /// Most `/tokenize` requests of the proxy's own per second.
    pub upstream_tokenize_rate: u32,
    pub block_size: u32,
    /// Writer queue length (records).
    pub(crate) queue: usize,
    /// Captured body bytes the writer queue may hold.
    pub queue_bytes: u64,
    /// Bytes captured per request body and per response body.
    pub capture_max: usize,
    pub rotate_bytes: u64,
    pub(crate) rotate_every: Duration,
    pub flush_every: Duration,
    /// Admin endpoint address (`None`: off).
    pub(crate) admin: Option<SocketAddr>,
    /// Single-threaded I/O runtimes serving connections (0: one per CPU).
    pub io_threads: usize,
    /// `--shadow`: copies of workload requests to candidate servers.
    pub shadow: Option<shadow::ShadowConfig>,
}

/// The defaults of [`RecordConfig`] (`retrace record`'s, but for the admin endpoint, which
/// [`RecordConfig::new`] leaves off).
pub(crate) mod defaults {
    use super::Bodies;
    use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
    use std::time::Duration;

    pub(crate) const NAME: &str = "retrace";
    pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
    pub(crate) const HEADERS_TIMEOUT: Duration = Duration::from_secs(15 * 60);
    pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(5 * 60);
    pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
    pub(crate) const BODIES: Bodies = Bodies::None;
    pub(crate) const UPSTREAM_TOKENIZE_RATE: u32 = 20;
    pub(crate) const BLOCK_SIZE: u32 = 512;
    pub(crate) const QUEUE: usize = 65536;
    pub(crate) const QUEUE_BYTES: u64 = 512 << 20;
    pub(crate) const CAPTURE_MAX: u64 = 16 << 20;
    pub(crate) const ROTATE_BYTES: u64 = 256 << 20;
    pub(crate) const ROTATE_EVERY: Duration = Duration::from_secs(3600);
    pub(crate) const FLUSH_EVERY: Duration = Duration::from_secs(1);
    /// The command line's admin endpoint.
    pub(crate) const ADMIN: SocketAddr =
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9464));
    pub(crate) const IO_THREADS: usize = 0;
}

impl RecordConfig {
    /// The [`defaults`] for an upstream and output directory, the admin endpoint off.
    pub fn new(upstream: &str, out_dir: impl Into<PathBuf>) -> anyhow::Result<Self> {
        Ok(RecordConfig {
            upstream: parse_upstream(upstream)?,
            out_dir: out_dir.into(),
            name: defaults::NAME.into(),
            tls: None,
            upstream_ca: None,
            upstream_http2: false,
            connect_timeout: defaults::CONNECT_TIMEOUT,
            headers_timeout: defaults::HEADERS_TIMEOUT,
            idle_timeout: defaults::IDLE_TIMEOUT,
            total_timeout: None,
            drain_timeout: defaults::DRAIN_TIMEOUT,
            bodies: defaults::BODIES,
            hash_key: None,
            tokenizer: None,
            upstream_tokenize: true,
            upstream_tokenize_rate: defaults::UPSTREAM_TOKENIZE_RATE,
            block_size: defaults::BLOCK_SIZE,
            queue: defaults::QUEUE,
            queue_bytes: defaults::QUEUE_BYTES,
            capture_max: defaults::CAPTURE_MAX as usize,
            rotate_bytes: defaults::ROTATE_BYTES,
            rotate_every: defaults::ROTATE_EVERY,
            flush_every: defaults::FLUSH_EVERY,
            admin: None,
            io_threads: defaults::IO_THREADS,
            shadow: None,
        })
    }
}

impl RecordConfig {
    /// The upstream URL.
    pub fn upstream_uri(&self) -> &Uri {
        &self.upstream
    }
}

fn parse_upstream(s: &str) -> anyhow::Result<Uri> {
    parse_url("--upstream", s)
}

/// An upstream or shadow URL (`flag` names it in errors): http or https, a host, no
/// credentials and no query (shown redacted).
pub(crate) fn parse_url(flag: &str, s: &str) -> anyhow::Result<Uri> {
    crate::sys::userinfo::refuse(flag, s).map_err(anyhow::Error::msg)?;
    crate::sys::userinfo::refuse_query(flag, s).map_err(anyhow::Error::msg)?;
    let u: Uri = s
        .parse()
        .with_context(|| format!("{flag} {s:?} is not a URL (expected http://host:port)"))?;
    match u.scheme_str() {
        Some("http") | Some("https") => {}
        _ => bail!("{flag} {s:?}: the scheme must be http or https"),
    }
    if u.authority().is_none() {
        bail!("{flag} {s:?}: no host");
    }
    if u.query().is_some() {
        bail!("{flag} {s:?}: an upstream URL takes no query");
    }
    Ok(u)
}

/// What a recording did, returned when it stops.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordStats {
    pub requests: u64,
    pub records_written: u64,
    pub records_dropped: u64,
    pub(crate) records_lost_io: u64,
    pub write_errors: u64,
    /// Closed trace files, in order.
    pub files: Vec<PathBuf>,
    /// Every in-flight exchange finished within the drain timeout.
    pub drained: bool,
}

/// Runs the proxy on `listener` until `shutdown` resolves; binds `cfg.admin` if set.
pub(crate) async fn serve(
    listener: TcpListener,
    cfg: RecordConfig,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<RecordStats> {
    let admin = match cfg.admin {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .with_context(|| format!("--admin {a}: cannot listen"))?,
        ),
        None => None,
    };
    run_with_admin(listener, admin, cfg, shutdown).await
}

/// [`serve`] with an already-bound admin listener (tests bind port 0).
pub async fn run_with_admin(
    listener: TcpListener,
    admin: Option<TcpListener>,
    cfg: RecordConfig,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<RecordStats> {
    let stats = Arc::new(counters::ProxyCounters::default());
    let https = cfg.upstream.scheme_str() == Some("https");
    let upstream_opts = upstream::UpstreamOptions {
        connect_timeout: cfg.connect_timeout,
        ca: cfg.upstream_ca.clone(),
        https,
        http2: cfg.upstream_http2,
        pool_idle: Duration::from_secs(90),
    };
    // Fail early on a bad CA file or output directory, before anything is served.
    let connector = upstream::connector(&upstream_opts)?;
    writer::check_dir(&cfg.out_dir).with_context(|| {
        format!(
            "--out {}: trace files cannot be written there",
            cfg.out_dir.display()
        )
    })?;
    writer::check_name(&cfg.out_dir, &cfg.name).map_err(|(len, e)| {
        anyhow::anyhow!(
            "--name {:?}: trace files of names up to {len} bytes cannot be created in {}: {e}",
            cfg.name,
            cfg.out_dir.display()
        )
    })?;
    let tls = cfg.tls.as_ref().map(|(c, k)| server::tls_acceptor(c, k));
    let tls = tls.transpose()?;
    let (header, extractor, t0) = trace_header_and_extractor(&cfg)?;
    let via = common::via_entry();
    let servertok = match server_tokenize(&cfg) {
        true => Some(servertok::ServerTokenizer::new(
            servertok::TokenizeTarget::new(
                &cfg.upstream,
                cfg.upstream_ca.as_deref(),
                cfg.connect_timeout,
                via.to_str().unwrap_or("1.1 retrace"),
            )?,
            cfg.upstream_tokenize_rate,
            stats.clone(),
        )),
        false => None,
    };
    let (recorder, writer) = writer::spawn(
        cfg.queue,
        cfg.queue_bytes,
        writer::FileOptions {
            dir: cfg.out_dir.clone(),
            name: cfg.name.clone(),
            rotate_bytes: cfg.rotate_bytes,
            rotate_every: cfg.rotate_every,
            flush_every: cfg.flush_every,
            space: None,
        },
        header,
        extractor,
        servertok,
        t0,
        stats.clone(),
    )
    .context("starting the trace writer thread")?;

    let shadow_rt = match &cfg.shadow {
        Some(sc) => {
            if let Ok(at) = listener.local_addr() {
                sc.refuse_self(at)?;
            }
            Some(shadow::runtime()?)
        }
        None => None,
    };
    let shadower = match (&cfg.shadow, &shadow_rt) {
        (Some(sc), Some(rt)) => Some(shadow::Shadower::new(
            sc,
            &upstream_opts,
            shadow::Limits {
                headers: cfg.headers_timeout,
                idle: cfg.idle_timeout,
                total: cfg.total_timeout.unwrap_or(shadow::COPY_TOTAL),
                capture_max: cfg.capture_max,
            },
            via.clone(),
            stats.clone(),
            rt.handle().clone(),
        )?),
        _ => None,
    };
    let up = Upstream {
        connector: &connector,
        opts: &upstream_opts,
        via: &via,
        shadow: shadower.as_ref(),
    };
    let proxies = proxies(&cfg, &up, &recorder, &stats)?;
    drop(recorder);

    let admin_addr = admin.as_ref().and_then(|l| l.local_addr().ok());
    let admin_task = admin.map(|l| tokio::spawn(admin::serve(l, stats.clone())));
    eprintln!("{}", start_line(&listener, admin_addr, &cfg));
    let drained = server::serve(listener, tls, proxies, shutdown, cfg.drain_timeout)
        .await
        .context("starting the I/O threads")?;
    let mut drained_all = drained.all;
    if let Some(sh) = shadower {
        drained_all &= sh.drain(drained.deadline).await;
        drop(sh);
    }
    if let Some(rt) = shadow_rt {
        // Copies still running after the cut end as `drain_deadline` when their tasks drop.
        let _ =
            tokio::task::spawn_blocking(move || rt.shutdown_timeout(Duration::from_secs(1))).await;
    }
    let deadline = drained.deadline.into_std();
    let files = tokio::task::spawn_blocking(move || writer.close(Some(deadline)))
        .await
        .unwrap_or_default();
    if let Some(t) = admin_task {
        t.abort();
        let _ = t.await;
    }
    Ok(RecordStats {
        requests: stats.requests.load(Relaxed),
        records_written: stats.records_written.load(Relaxed),
        records_dropped: stats.records_dropped.load(Relaxed),
        records_lost_io: stats.records_lost_io.load(Relaxed),
        write_errors: stats.write_errors.load(Relaxed),
        files,
        drained: drained_all,
    })
}

/// Whether estimated input lengths are counted with the upstream's `/tokenize`: unless
/// `--no-upstream-tokenize`, `--tokenizer` (the operator's own count) or `--upstream-http2` (the
/// requests are HTTP/1.1).
fn server_tokenize(cfg: &RecordConfig) -> bool {
    cfg.upstream_tokenize && cfg.tokenizer.is_none() && !cfg.upstream_http2
}

/// The trace files' header (block size, hashing, tokenization, bodies kept, where from), the
/// extractor that turns each exchange into a record the same way, and the recording's time
/// origin (taken with the header's wall-clock `t0_unix_us`).
fn trace_header_and_extractor(
    cfg: &RecordConfig,
) -> anyhow::Result<(crate::trace::TraceHeader, extract::Extractor, Instant)> {
    let tokenizer = cfg
        .tokenizer
        .as_deref()
        .map(prompt::TextTokenizer::from_file);
    let tokenizer = tokenizer
        .transpose()?
        .unwrap_or(prompt::TextTokenizer::Approx);
    let hasher = match &cfg.hash_key {
        Some(k) => crate::trace::hash::BlockHasher::hmac(k),
        None => crate::trace::hash::BlockHasher::xxh3(),
    };
    let t0 = Instant::now();
    let t0_unix_us = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    let mut meta = std::collections::BTreeMap::new();
    if server_tokenize(cfg) {
        // Per record, `InputCount` says which lengths the server counted and which stayed
        // estimates (the upstream off, a failed answer, the rate bound).
        meta.insert("tokenization".into(), "server".into());
        meta.insert("tokenization_fallback".into(), tokenizer.describe().into());
        meta.insert(
            "upstream_tokenize".into(),
            format!(
                "POST /tokenize of estimated input lengths, at most {}/s and {} in flight",
                cfg.upstream_tokenize_rate,
                servertok::IN_FLIGHT
            ),
        );
    } else {
        meta.insert("tokenization".into(), tokenizer.describe().into());
    }
    if let Some(id) = hasher.key_id() {
        meta.insert(crate::trace::fleet::KEY_ID.into(), id);
    }
    meta.insert(
        "bodies".into(),
        format!("{:?}", cfg.bodies).to_ascii_lowercase(),
    );
    meta.insert("record_order".into(), crate::trace::COMPLETION_ORDER.into());
    if let Some(sc) = &cfg.shadow {
        use crate::trace::shadow as ts;
        for (k, (role, u)) in sc.targets.iter().enumerate() {
            meta.insert(ts::meta_key(k), ts::meta_value(*role, &shadow::redact(u)));
        }
        if let Some(m) = &sc.model {
            meta.insert("shadow_model".into(), m.clone());
        }
        if sc.fraction < 1.0 {
            meta.insert("shadow_fraction".into(), sc.fraction.to_string());
        }
    }
    let header = crate::trace::TraceHeader {
        block_size: cfg.block_size,
        hash_scheme: hasher.scheme(),
        partial_tail_block: true,
        t0_unix_us: Some(t0_unix_us),
        writer: format!("retrace {}", env!("CARGO_PKG_VERSION")),
        source: format!("record --upstream {}", cfg.upstream),
        meta,
    };
    let extractor = extract::Extractor {
        hasher,
        block_size: cfg.block_size,
        tokenizer,
        bodies: cfg.bodies,
    };
    Ok((header, extractor, t0))
}

/// Where the proxies forward: the upstream's dialer and options, the `Via` entry, the shadows.
#[derive(Clone, Copy)]
struct Upstream<'a> {
    connector: &'a upstream::Connector,
    opts: &'a upstream::UpstreamOptions,
    via: &'a http::HeaderValue,
    shadow: Option<&'a Arc<shadow::Shadower>>,
}

/// One proxy per I/O thread, each with its own upstream pool (an upstream connection stays on
/// its thread).
fn proxies(
    cfg: &RecordConfig,
    up: &Upstream<'_>,
    recorder: &writer::Recorder,
    stats: &Arc<counters::ProxyCounters>,
) -> anyhow::Result<Vec<Arc<common::Proxy>>> {
    let Upstream {
        connector,
        opts: upstream_opts,
        via,
        shadow,
    } = *up;
    let scheme: Scheme = cfg.upstream.scheme().cloned().unwrap_or(Scheme::HTTP);
    let authority: Authority = cfg
        .upstream
        .authority()
        .cloned()
        .context("--upstream has no host")?;
    let base_path = cfg.upstream.path().trim_end_matches('/').to_string();
    let threads = if cfg.io_threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        cfg.io_threads
    };
    let host = http::HeaderValue::from_str(authority.as_str())
        .context("--upstream: the host is not a valid Host header")?;
    let dst = Uri::builder()
        .scheme(scheme.clone())
        .authority(authority.clone())
        .path_and_query("/")
        .build()
        .context("--upstream")?;
    let mut proxies = Vec::with_capacity(threads);
    for _ in 0..threads {
        // One pool per I/O thread: an upstream connection stays on its thread.
        let raw = (!cfg.upstream_http2).then(|| {
            rawpool::RawPool::new(connector.clone(), dst.clone(), upstream_opts.pool_idle)
        });
        proxies.push(Arc::new(common::Proxy {
            recorder: recorder.clone(),
            stats: stats.clone(),
            scheme: scheme.clone(),
            authority: authority.clone(),
            host: host.clone(),
            base_path: base_path.clone(),
            http2_upstream: cfg.upstream_http2,
            headers_timeout: cfg.headers_timeout,
            idle_timeout: cfg.idle_timeout,
            total_timeout: cfg.total_timeout,
            capture_max: cfg.capture_max,
            raw,
            client: upstream::build(upstream_opts)?,
            via: via.clone(),
            shadow: shadow.cloned(),
        }));
    }
    Ok(proxies)
}

/// What the proxy says when it starts: where it listens, forwards (credentials never shown) and
/// writes, and its admin endpoint.
fn start_line(l: &TcpListener, admin: Option<SocketAddr>, cfg: &RecordConfig) -> String {
    let at = l.local_addr().map_or("?".to_string(), |a| a.to_string());
    let upstream = crate::sys::userinfo::redact(&cfg.upstream.to_string());
    let out = cfg.out_dir.join(format!("{}-*.trace.zst", cfg.name));
    let admin = admin.map_or(String::new(), |a| format!("; /metrics and /healthz on {a}"));
    format!(
        "retrace record: listening on {at}, forwarding to {upstream}, writing {}{admin}",
        out.display()
    )
}

/// Binds `addr` with a deep accept backlog (4096, capped by the kernel's `somaxconn`), so a burst
/// of new client connections is queued rather than dropped (a dropped SYN costs the client a
/// one-second retransmit). Host names fall back to the default backlog.
async fn bind(addr: &str) -> std::io::Result<TcpListener> {
    let Ok(sa) = addr.parse::<SocketAddr>() else {
        return TcpListener::bind(addr).await;
    };
    let sock = if sa.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    sock.set_reuseaddr(true)?;
    sock.bind(sa)?;
    sock.listen(4096)
}

/// The `retrace record` command: binds `listen`, runs until SIGINT/SIGTERM, prints a summary.
pub(crate) fn run(listen: &str, cfg: RecordConfig) -> anyhow::Result<std::process::ExitCode> {
    // Each proxied HTTP/1.1 stream holds a client and an upstream socket.
    if let Some(n) = crate::sys::fdlimit::raise() {
        tracing::debug!("open-file limit: {n}");
    }
    // This runtime only accepts, serves the admin endpoint and closes the trace; connections are
    // served on the I/O threads.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let stats = rt.block_on(async {
        let stop = crate::sys::signal::shutdown();
        let listener = bind(listen)
            .await
            .with_context(|| format!("--listen {listen}: cannot listen"))?;
        serve(listener, cfg, async move {
            stop.await;
        })
        .await
    })?;
    eprintln!(
        "retrace record: {} requests, {} records written, {} dropped (queue full), {} lost (write errors: {}), files: {}",
        stats.requests,
        stats.records_written,
        stats.records_dropped,
        stats.records_lost_io,
        stats.write_errors,
        stats
            .files
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls() {
        assert!(parse_upstream("http://127.0.0.1:8000").is_ok());
        assert!(parse_upstream("https://h/v").is_ok());
        assert!(parse_upstream("ftp://h").is_err());
        assert!(parse_upstream("127.0.0.1:8000").is_err());
    }
}
