//! Raw HTTP/1.1 upstream connections for retrace's own forwarding loop (`h1`), pooled per I/O thread.
//!
//! A [`RawPool`] holds idle keep-alive sockets (plain TCP or rustls) to the one upstream, most
//! recently used first, with no buffers or tasks attached: the client connection that borrows one
//! reads and writes it directly. [`RawPool::checkout`] skips sockets idle longer than the idle
//! timeout and sockets the upstream has closed meanwhile (a non-blocking read probe, which costs
//! no system call unless the reactor saw the socket become readable); [`RawPool::connect`] dials
//! through [`super::upstream::Connector`] (connect timeout, TCP_NODELAY, TLS). A connection goes
//! back with [`RawPool::checkin`] only after a response that ended cleanly with nothing left
//! unread. This module does not parse HTTP (see `h1wire`) or know about recording.

use super::upstream::{Connector, UpstreamIo};
use http::Uri;
use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tower_service::Service as _;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A plain or TLS socket to the upstream.
pub enum RawUp {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for RawUp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            RawUp::Plain(s) => Pin::new(s).poll_read(cx, buf),
            RawUp::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for RawUp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            RawUp::Plain(s) => Pin::new(s).poll_write(cx, buf),
            RawUp::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            RawUp::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            RawUp::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            RawUp::Plain(s) => s.is_write_vectored(),
            RawUp::Tls(s) => s.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            RawUp::Plain(s) => Pin::new(s).poll_flush(cx),
            RawUp::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            RawUp::Plain(s) => Pin::new(s).poll_shutdown(cx),
            RawUp::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

impl RawUp {
    /// Whether the upstream closed (or wrote unasked bytes on) this idle socket. Never blocks.
    fn is_closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        let mut buf = ReadBuf::new(&mut byte);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        // Ready means EOF, an error, or a byte nobody asked for: unusable either way.
        Pin::new(self).poll_read(&mut cx, &mut buf).is_ready()
    }
}

/// Idle upstream sockets of one I/O thread.
pub struct RawPool {
    connector: Connector,
    /// `scheme://authority` the connector dials.
    dst: Uri,
    idle: Mutex<VecDeque<(RawUp, Instant)>>,
    idle_timeout: Duration,
}

impl RawPool {
    pub fn new(connector: Connector, dst: Uri, idle_timeout: Duration) -> Self {
        RawPool {
            connector,
            dst,
            idle: Mutex::new(VecDeque::new()),
            idle_timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(RawUp, Instant)>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most recently used idle socket that is still open, if any.
    pub fn checkout(&self) -> Option<RawUp> {
        let mut idle = self.lock();
        let now = Instant::now();
        while idle
            .front()
            .is_some_and(|(_, since)| now.duration_since(*since) > self.idle_timeout)
        {
            idle.pop_front();
        }
        while let Some((mut up, _)) = idle.pop_back() {
            if !up.is_closed() {
                return Some(up);
            }
        }
        None
    }

    /// Gives back a socket whose last response ended cleanly.
    pub fn checkin(&self, up: RawUp) {
        self.lock().push_back((up, Instant::now()));
    }

    /// Dials a new socket (connect timeout and TLS as configured).
    pub async fn connect(&self) -> Result<RawUp, BoxError> {
        match self.connector.clone().call(self.dst.clone()).await? {
            UpstreamIo::Plain(s) => Ok(RawUp::Plain(s.into_inner())),
            UpstreamIo::Tls(s, _) => Ok(RawUp::Tls(Box::new(s.into_inner()))),
        }
    }
}
