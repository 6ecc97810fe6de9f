//! Accepting client connections and choosing the engine (docs/record.md, "Forwarding"): TLS
//! first with `--tls-cert/--tls-key` (ALPN `h2`, `http/1.1`); HTTP/1.1 clients of an HTTP/1.1
//! upstream go to `h1`, HTTP/2 clients (h2c preface, ALPN `h2`) and every client of an HTTP/2
//! upstream to hyper (`proxy`). Connections are dealt to single-threaded I/O runtimes; on
//! shutdown it stops accepting and drains for at most the drain timeout.

use super::common::{Drain, Proxy};
use super::timing::{WriteClock, WriteStamped};
use anyhow::Context as _;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// Builds the TLS acceptor from PEM files; errors name the flag and file.
pub fn tls_acceptor(cert: &Path, key: &Path) -> anyhow::Result<TlsAcceptor> {
    let certs = crate::sys::tls::load_certs(cert).context("--tls-cert")?;
    let key_pem = std::fs::read(key).with_context(|| format!("--tls-key {}", key.display()))?;
    let key_der = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .with_context(|| format!("--tls-key {}: not PEM", key.display()))?
        .with_context(|| format!("--tls-key {}: no private key found", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS server configuration")?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .context("--tls-cert/--tls-key do not form a usable certificate and key")?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(cfg)))
}

fn http_builder() -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(60))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(super::common::H2_HEADER_LIST)
        .max_concurrent_streams(Some(10_000));
    builder
}

/// An accepted connection handed to an I/O thread.
struct Conn {
    tcp: std::net::TcpStream,
    peer: SocketAddr,
    watcher: Watcher,
    /// Turns `Some` when the proxy drains; dropped when the connection (or a tunnel it turned
    /// into) ends, which the drain waits for.
    drain: Drain,
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads the first bytes of a plain connection: whether they are the HTTP/2 preface (h2c with
/// prior knowledge), and the bytes read.
async fn sniff(tcp: &mut tokio::net::TcpStream) -> std::io::Result<(bool, Vec<u8>)> {
    let mut buf = Vec::with_capacity(4096);
    loop {
        if tcp.read_buf(&mut buf).await? == 0 {
            return Ok((false, buf));
        }
        let k = buf.len().min(H2_PREFACE.len());
        if buf[..k] != H2_PREFACE[..k] {
            return Ok((false, buf));
        }
        if buf.len() >= H2_PREFACE.len() {
            return Ok((true, buf));
        }
    }
}

/// How a drain ended.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Drained {
    /// Every connection finished within the drain timeout.
    pub(crate) all: bool,
    /// The drain's deadline: the signal plus the drain timeout.
    pub(crate) deadline: tokio::time::Instant,
}

/// Serves until `shutdown` resolves, then drains for at most `drain`; says whether every
/// connection finished in time. Connections are dealt round-robin to one single-threaded
/// runtime per entry of `proxies`, so a connection and its upstream socket share a thread.
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    proxies: Vec<Arc<Proxy>>,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) -> std::io::Result<Drained> {
    let builder = http_builder();
    let stats = proxies.first().map(|p| p.stats.clone());
    let graceful = GracefulShutdown::new();
    let (drain_tx, drain_rx) = watch::channel(None);
    let mut workers = Vec::with_capacity(proxies.len());
    for (k, proxy) in proxies.into_iter().enumerate() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Conn>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = Arc::new(Thread {
            builder: builder.clone(),
            proxy,
            tls: tls.clone(),
        });
        let join = std::thread::Builder::new()
            .name(format!("retrace-io-{k}"))
            .spawn(move || {
                rt.block_on(async move {
                    tokio::spawn(reap_idle(thread.proxy.clone()));
                    while let Some(c) = rx.recv().await {
                        tokio::spawn(serve_conn(c, thread.clone()));
                    }
                });
                // Dropping the runtime drops connections still open after the drain; their taps
                // record them as cancelled.
                drop(rt);
            })?;
        workers.push((tx, join));
    }
    tokio::pin!(shutdown);
    let mut next = 0usize;
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => a,
        };
        let (tcp, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let tcp = match tcp.into_std() {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("connection from {peer}: {e}");
                continue;
            }
        };
        let conn = Conn {
            tcp,
            peer,
            watcher: graceful.watcher(),
            drain: drain_rx.clone(),
        };
        if workers[next % workers.len()].0.send(conn).is_err() {
            tracing::error!("an I/O thread has stopped; connection from {peer} dropped");
        }
        next = next.wrapping_add(1);
    }
    drop(listener);
    drop(drain_rx);
    // Tunnels are cut a tenth of the drain timeout (at most 100 ms) before its end.
    let cut_margin = (drain / 10).min(Duration::from_millis(100));
    let deadline = tokio::time::Instant::now() + drain;
    drain_tx.send_replace(Some(deadline - cut_margin));
    let drained = tokio::time::timeout_at(deadline, async {
        graceful.shutdown().await;
        drain_tx.closed().await;
    })
    .await
    .is_ok();
    if let (false, Some(s)) = (drained, stats) {
        // Counted before the I/O threads drop what is still open (each then ends its record).
        s.drain_cut
            .store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(
            "drain timeout ({drain:?}) reached with {} exchanges in flight: cut, recorded as drain_deadline",
            s.in_flight.load(std::sync::atomic::Ordering::Relaxed)
        );
    }
    let joins: Vec<_> = workers.into_iter().map(|(_tx, j)| j).collect();
    let _ = tokio::task::spawn_blocking(move || {
        for j in joins {
            let _ = j.join();
        }
    })
    .await;
    Ok(Drained {
        all: drained,
        deadline,
    })
}

/// Drops the closed idle upstream sockets of this I/O thread's pool, every second.
async fn reap_idle(proxy: Arc<Proxy>) {
    let Some(pool) = proxy.raw.as_ref() else {
        return;
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        pool.reap();
    }
}

/// What every connection of one I/O thread is served with.
struct Thread {
    builder: Builder<TokioExecutor>,
    proxy: Arc<Proxy>,
    tls: Option<TlsAcceptor>,
}

type ConnResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Serves one accepted connection. Plain HTTP/1.1, the path most connections take, runs inline;
/// TLS and hyper are boxed, so that each connection's task holds only what its own path needs
/// (a task's whole future is written when it is spawned, and kept while the connection is open).
async fn serve_conn(c: Conn, thread: Arc<Thread>) {
    let Conn {
        tcp,
        peer,
        watcher,
        drain,
    } = c;
    let tcp = match tokio::net::TcpStream::from_std(tcp) {
        Ok(tcp) => tcp,
        Err(e) => return tracing::warn!("connection from {peer}: {e}"),
    };
    let (builder, proxy) = (&thread.builder, thread.proxy.clone());
    let res = match thread.tls.clone() {
        None if proxy.raw.is_some() => serve_plain(tcp, watcher, builder, proxy, drain).await,
        None => Box::pin(serve_hyper(tcp, watcher, builder, proxy)).await,
        Some(acc) => Box::pin(serve_tls(tcp, acc, peer, watcher, builder, proxy, drain)).await,
    };
    if let Err(e) = res {
        tracing::debug!("connection from {peer}: {e}");
    }
}

/// HTTP/1.1 goes to the own loop; the HTTP/2 preface (h2c) to hyper.
async fn serve_plain(
    mut tcp: tokio::net::TcpStream,
    watcher: Watcher,
    builder: &Builder<TokioExecutor>,
    proxy: Arc<Proxy>,
    drain: Drain,
) -> ConnResult {
    let sniffed = tokio::time::timeout(super::h1::HEAD_TIMEOUT, sniff(&mut tcp)).await;
    let Ok(Ok((h2, pre))) = sniffed else {
        return Ok(());
    };
    if !h2 {
        super::h1::serve(tcp, pre, proxy, drain).await;
        return Ok(());
    }
    // The bytes read while sniffing are read again first.
    let mut pre = std::io::Cursor::new(pre);
    pre.get_mut().shrink_to_fit();
    let (r, w) = tokio::io::split(tcp);
    let io = tokio::io::join(pre.chain(r), w);
    Box::pin(serve_hyper(io, watcher, builder, proxy)).await
}

/// The TLS handshake, then ALPN picks the engine (the own loop unless `h2`, or if there is none).
async fn serve_tls(
    tcp: tokio::net::TcpStream,
    acc: TlsAcceptor,
    peer: SocketAddr,
    watcher: Watcher,
    builder: &Builder<TokioExecutor>,
    proxy: Arc<Proxy>,
    drain: Drain,
) -> ConnResult {
    let s = match tokio::time::timeout(Duration::from_secs(10), acc.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!("TLS handshake with {peer} failed: {e}");
            return Ok(());
        }
        Err(_) => {
            tracing::debug!("TLS handshake with {peer} timed out");
            return Ok(());
        }
    };
    if proxy.raw.is_some() && s.get_ref().1.alpn_protocol() != Some(b"h2") {
        super::h1::serve(s, Vec::new(), proxy, drain).await;
        return Ok(());
    }
    serve_hyper(s, watcher, builder, proxy).await
}

/// Serves one connection with hyper (HTTP/2, or HTTP/1.1 towards an HTTP/2 upstream) until it
/// closes or the graceful shutdown finishes it.
async fn serve_hyper<I>(
    io: I,
    watcher: Watcher,
    builder: &Builder<TokioExecutor>,
    proxy: Arc<Proxy>,
) -> ConnResult
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let clock = Arc::new(WriteClock::new(proxy.stats.clone()));
    let svc = {
        let clock = clock.clone();
        service_fn(move |req| super::h2::handle(proxy.clone(), req, clock.clone()))
    };
    let io = WriteStamped::new(TokioIo::new(io), clock);
    watcher.watch(builder.serve_connection(io, svc)).await
}
