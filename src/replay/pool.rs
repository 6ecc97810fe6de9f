//! The replayer's HTTP/1.1 connection pool: keep-alive connections to one target, opened ahead.
//!
//! Each in-flight stream needs its own HTTP/1.1 connection. Opening hundreds at the instant a burst
//! is due overflows the server's accept queue (SYNs dropped, a 1 s retransmit added to TTFT: seen
//! against the mock at 500 simultaneous streams), and charges connection setup to the first
//! requests. So the pool can be warmed before the clock starts ([`Pool::warm`], a bounded number of
//! connects at a time), hands out idle connections LIFO, opens a new one when none is idle, and
//! takes a connection back only after its response was read to the end. A request that fails on a
//! reused connection before any response byte (the server closed it while idle) is retried once on
//! a fresh connection, as browsers and hyper's own pool do. `https://` targets get rustls
//! (ALPN `http/1.1`, trust roots from `--target-ca` or the system bundle, see [`crate::tls`]); the
//! TLS handshake is part of the connect, so warming takes it off the clock too. It holds two kinds of
//! connection: hyper's ([`Conn`], `--http-client hyper`, and `GET /v1/models` / scrapes) and the own
//! client's ([`RawConn`], [`super::h1client`]); [`Pool::warm`] opens the kind the run uses. No
//! scheduling here.

use super::h1client::RawConn;
use crate::netio::ClientStream;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderValue, HOST};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

type Sender = SendRequest<Full<Bytes>>;

/// One keep-alive connection: hyper's request sender, and its socket's last read/write instants
/// when diagnostic stamps are on ([`crate::stamps`]).
pub struct Conn {
    sender: Sender,
    pub stamps: Option<Arc<IoStamps>>,
}

/// A connection's socket activity, on `CLOCK_MONOTONIC` (diagnostic stamps only).
#[derive(Debug, Default)]
pub struct IoStamps {
    /// The local port (the server sees it as the peer port).
    pub port: u16,
    /// End of the last write, and the last read that returned bytes.
    pub last_write_ns: AtomicU64,
    pub last_read_ns: AtomicU64,
}

/// The socket as hyper sees it, noting read/write instants when stamps are on.
struct StampIo<T> {
    inner: T,
    stamps: Option<Arc<IoStamps>>,
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for StampIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let p = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let (Some(s), Poll::Ready(Ok(()))) = (&self.stamps, &p) {
            s.last_read_ns.store(crate::stamps::now_ns(), Relaxed);
        }
        p
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for StampIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let p = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let (Some(s), Poll::Ready(Ok(_))) = (&self.stamps, &p) {
            s.last_write_ns.store(crate::stamps::now_ns(), Relaxed);
        }
        p
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let p = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let (Some(s), Poll::Ready(Ok(_))) = (&self.stamps, &p) {
            s.last_write_ns.store(crate::stamps::now_ns(), Relaxed);
        }
        p
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Why a request could not get a response head.
#[derive(Debug)]
pub enum SendError {
    /// The TCP connect or HTTP handshake failed.
    Connect(String),
    /// The connection broke before a response head.
    Reset(String),
}

/// Which HTTP/1.1 client sends the measured requests (`--http-client`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HttpClient {
    /// retrace's own loop ([`super::h1client`]): the request task owns its socket.
    #[default]
    Own,
    /// hyper 1's client connections (a connection task per connection).
    Hyper,
}

/// A pool of connections to one address.
pub struct Pool {
    addr: SocketAddr,
    /// TLS connector and server name for `https://` targets.
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    )>,
    host: HeaderValue,
    idle: Mutex<Vec<Conn>>,
    /// Which client [`Pool::warm`] opens connections for.
    client: HttpClient,
    /// Own-client reads are stamped with the kernel's receive time (`--rx-stamp kernel`).
    kernel_rx: bool,
    /// Idle connections of the own client ([`super::h1client`]), LIFO.
    raw_idle: Mutex<Vec<RawConn>>,
    /// Reader threads for the own client's plain response bodies (`--reader-threads`).
    readers: Option<super::reader::Readers>,
}

impl Pool {
    /// A pool for `target` (its `host:port` resolved once); `ca` is `--target-ca`.
    pub async fn new(target: &super::client::Target, ca: Option<&Path>) -> Result<Pool, String> {
        let authority = target.authority.as_str();
        let tls = if target.tls {
            let cfg = crate::tls::client_config(ca, "--target-ca", &[b"http/1.1"])
                .map_err(|e| format!("{e:#}"))?;
            let name = rustls::pki_types::ServerName::try_from(target.host.clone())
                .map_err(|e| format!("{:?} is not a TLS server name: {e}", target.host))?;
            Some((tokio_rustls::TlsConnector::from(cfg), name))
        } else {
            None
        };
        let addr = tokio::net::lookup_host(authority)
            .await
            .map_err(|e| format!("cannot resolve {authority}: {e}"))?
            .next()
            .ok_or_else(|| format!("{authority} resolves to no address"))?;
        let host = HeaderValue::from_str(authority)
            .map_err(|_| format!("{authority:?} is not a valid Host header"))?;
        Ok(Pool {
            addr,
            tls,
            host,
            idle: Mutex::new(Vec::new()),
            client: HttpClient::default(),
            kernel_rx: false,
            raw_idle: Mutex::new(Vec::new()),
            readers: None,
        })
    }

    /// Sets which client the measured requests use (and [`Pool::warm`] warms).
    pub fn with_client(mut self, client: HttpClient) -> Pool {
        self.client = client;
        self
    }

    /// Stamp the own client's reads with the kernel's receive time (plain TCP targets).
    pub fn with_kernel_rx(mut self, on: bool) -> Pool {
        self.kernel_rx = on;
        self
    }

    /// Reads the own client's plain response bodies on `n` reader threads ([`super::reader`]);
    /// 0: on the requests' tasks. Only the own client over plain TCP uses them.
    /// `batch` ([`super::reader::Readers::start`]) applies only with `--rx-stamp kernel` (were
    /// the kernel to refuse one socket its stamps, that socket's reads would count from the
    /// read, up to `batch` late; Linux TCP sockets always accept them).
    pub fn with_readers(mut self, n: usize, batch: std::time::Duration) -> std::io::Result<Pool> {
        let batch = if self.kernel_rx {
            batch
        } else {
            std::time::Duration::ZERO
        };
        self.readers = if n > 0 && self.client == HttpClient::Own && self.tls.is_none() {
            Some(super::reader::Readers::start(n, batch)?)
        } else {
            None
        };
        Ok(self)
    }

    /// The reader threads, if bodies are read on them.
    pub fn readers(&self) -> Option<&super::reader::Readers> {
        self.readers.as_ref()
    }

    /// What the measured responses' arrival instants are: `"kernel"` (own client, plain TCP,
    /// `--rx-stamp kernel`; a read the kernel did not stamp falls back to its own instant) or
    /// `"read"`.
    pub fn rx_stamp(&self) -> &'static str {
        if self.kernel_rx && self.tls.is_none() && self.client == HttpClient::Own {
            "kernel"
        } else {
            "read"
        }
    }

    /// The client the measured requests use.
    pub fn client(&self) -> HttpClient {
        self.client
    }

    /// Plain `http://` (no TLS wrapping of connections).
    pub fn is_plain(&self) -> bool {
        self.tls.is_none()
    }

    /// The `Host` header value (`host:port`).
    pub fn host(&self) -> &[u8] {
        self.host.as_bytes()
    }

    /// A TCP connection to the target (`TCP_NODELAY`), with its stage stamps when
    /// `RETRACE_STAMPS` is on; both clients' connections start here.
    async fn dial(&self) -> Result<(tokio::net::TcpStream, Option<Arc<IoStamps>>), String> {
        let stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|e| format!("connect {}: {e}", self.addr))?;
        let _ = stream.set_nodelay(true);
        let stamps = crate::stamps::enabled().then(|| {
            use std::os::fd::AsRawFd;
            Arc::new(IoStamps {
                port: crate::stamps::port_of(stream.as_raw_fd(), true),
                ..Default::default()
            })
        });
        Ok((stream, stamps))
    }

    /// Opens a connection for the own client: TCP (`TCP_NODELAY`), then TLS for `https://`.
    pub async fn connect_raw(&self) -> Result<RawConn, String> {
        let (stream, stamps) = self.dial().await?;
        let io = match &self.tls {
            Some((connector, name)) => ClientStream::Tls(Box::new(
                connector
                    .connect(name.clone(), stream)
                    .await
                    .map_err(|e| format!("TLS handshake with {}: {e}", self.addr))?,
            )),
            None => ClientStream::Plain(stream),
        };
        Ok(RawConn::new(io, stamps, self.kernel_rx))
    }

    /// The most recently used idle own-client connection that the server has not visibly closed.
    pub fn take_raw(&self) -> Option<RawConn> {
        let mut idle = self.raw_idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(mut c) = idle.pop() {
            if c.looks_open() {
                return Some(c);
            }
        }
        None
    }

    /// Returns an own-client connection whose last response was read exactly to its end.
    pub fn checkin_raw(&self, conn: RawConn) {
        self.raw_idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(conn);
    }

    async fn connect(&self) -> Result<Conn, String> {
        let (stream, stamps) = self.dial().await?;
        if let Some((connector, name)) = &self.tls {
            let stream = connector
                .connect(name.clone(), stream)
                .await
                .map_err(|e| format!("TLS handshake with {}: {e}", self.addr))?;
            return self.handshake(TokioIo::new(stream), stamps).await;
        }
        self.handshake(TokioIo::new(stream), stamps).await
    }

    async fn handshake<T>(&self, io: T, stamps: Option<Arc<IoStamps>>) -> Result<Conn, String>
    where
        T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let io = StampIo {
            inner: io,
            stamps: stamps.clone(),
        };
        let (sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| format!("handshake {}: {e}", self.addr))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn { sender, stamps })
    }

    fn take_idle(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(c) = idle.pop() {
            if c.sender.is_ready() && !c.sender.is_closed() {
                return Some(c);
            }
        }
        None
    }

    /// Returns a connection whose last response was read to the end.
    pub fn checkin(&self, conn: Conn) {
        if !conn.sender.is_closed() {
            self.idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(conn);
        }
    }

    /// Idle connections now.
    pub fn idle_len(&self) -> usize {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).len()
            + self
                .raw_idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .len()
    }

    /// Opens up to `n` connections, at most `parallel` connects at a time; returns how many opened.
    pub async fn warm(&self, n: usize, parallel: usize) -> usize {
        let mut opened = 0;
        let mut left = n;
        while left > 0 {
            let k = left.min(parallel.max(1));
            let mut ok = 0;
            if self.client == HttpClient::Own {
                let batch = futures_join_all((0..k).map(|_| self.connect_raw())).await;
                for s in batch.into_iter().flatten() {
                    self.checkin_raw(s);
                    ok += 1;
                }
            } else {
                let batch = futures_join_all((0..k).map(|_| self.connect())).await;
                for s in batch.into_iter().flatten() {
                    self.checkin(s);
                    ok += 1;
                }
            }
            opened += ok;
            if ok == 0 {
                break;
            }
            left -= k;
        }
        opened
    }

    /// Sends a request built by `make` (called again for a retry), returning the response head
    /// and the connection to check in once the body is read.
    pub async fn send(
        &self,
        make: impl Fn() -> Result<Request<Full<Bytes>>, String>,
    ) -> Result<(Response<Incoming>, Conn), SendError> {
        for attempt in 0..2 {
            let (mut conn, reused) = match self.take_idle() {
                Some(s) if attempt == 0 => (s, true),
                _ => (self.connect().await.map_err(SendError::Connect)?, false),
            };
            let mut req = make().map_err(SendError::Connect)?;
            req.headers_mut().insert(HOST, self.host.clone());
            if conn.sender.ready().await.is_err() {
                if reused {
                    continue;
                }
                return Err(SendError::Reset(
                    "connection closed before the request".into(),
                ));
            }
            match conn.sender.send_request(req).await {
                Ok(resp) => return Ok((resp, conn)),
                Err(e)
                    if reused
                        && (e.is_canceled() || e.is_closed() || e.is_incomplete_message()) =>
                {
                    continue;
                }
                Err(e) => return Err(SendError::Reset(e.to_string())),
            }
        }
        Err(SendError::Reset(
            "connection closed twice before a response".into(),
        ))
    }
}

/// Awaits all futures concurrently (a tiny join_all without the futures crate).
async fn futures_join_all<F: std::future::Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut set = Vec::new();
    for f in futs {
        set.push(Box::pin(f));
    }
    let mut out: Vec<Option<F::Output>> = (0..set.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in set.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}
