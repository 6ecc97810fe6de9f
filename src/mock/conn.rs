//! One client connection: hyper serves its HTTP/1.1 requests, and a streamed completion takes the
//! socket over so that the engine can write the stream's events directly ([`super::emit`]).
//!
//! The take-over: the handler registers the stream ([`ConnCtx::take_over`]) and answers hyper with
//! an empty `connection: close` response, which the connection's I/O wrapper swallows; hyper
//! hands back the socket and the bytes it read ahead. This task then writes the real response
//! head and runs the stream; afterwards the socket goes back to a fresh hyper connection (the
//! read-ahead bytes replayed first) unless the client asked to close or spoke HTTP/1.0. Every
//! read is a `recvmsg` that notes when its bytes reached the socket ([`crate::sys::rxstamp`]), which
//! the handler takes as the request's arrival ([`ConnCtx::last_rx`]). This module does not
//! format bodies or decide routes (the request handler is given to [`serve`]).

use super::emit::{self, Hijack, StreamEnd};
use crate::sys::rxstamp;
use bytes::{Buf, Bytes};
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::wire::BoxError;
/// What the request handler answers.
pub(crate) type Reply = http::Response<http_body_util::Full<Bytes>>;
type HandlerFuture = Pin<Box<dyn std::future::Future<Output = Result<Reply, BoxError>> + Send>>;
/// The request handler (`super::api::handle` with its shared state).
pub(crate) type Handler =
    Arc<dyn Fn(http::Request<hyper::body::Incoming>, Arc<ConnCtx>) -> HandlerFuture + Send + Sync>;

/// How long a connection waits for its client (the CLI always uses [`ConnTimeouts::default`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnTimeouts {
    /// A request (head and body) must have arrived this long after its first byte was read.
    pub request: Duration,
    /// A connection with no request under way is closed after this long.
    pub idle: Duration,
}

impl Default for ConnTimeouts {
    fn default() -> Self {
        ConnTimeouts {
            request: Duration::from_secs(30),
            idle: Duration::from_secs(60),
        }
    }
}

/// What the connection is doing, for its timeouts and the request's arrival.
struct Activity {
    /// When the first byte of the request being read was read (`None`: no request being read).
    request_since: Option<Instant>,
    /// The handler is serving a request.
    handling: bool,
    /// The latest instant the connection finished something (a response, a blocked write).
    last: Instant,
    /// When the bytes of the latest read reached the socket ([`crate::sys::rxstamp`]).
    rx: Option<Instant>,
}

/// What the request handler knows about its connection.
pub(crate) struct ConnCtx {
    /// The socket (for the reset fault of a whole-body response).
    pub(crate) fd: RawFd,
    swallow: AtomicBool,
    /// hyper's last write attempt did not complete (it holds unsent bytes).
    blocked: AtomicBool,
    /// Signalled when a write of hyper's completes after one did not.
    unblocked: tokio::sync::Notify,
    hijack: Mutex<Option<Hijack>>,
    activity: Mutex<Activity>,
}

impl ConnCtx {
    /// A fresh context for hyper serving the connection; `ahead`: bytes were read ahead (at the
    /// instant given), the start of the next request.
    fn new(fd: RawFd, ahead: Option<Option<Instant>>) -> Arc<ConnCtx> {
        let now = Instant::now();
        Arc::new(ConnCtx {
            fd,
            swallow: AtomicBool::new(false),
            blocked: AtomicBool::new(false),
            unblocked: tokio::sync::Notify::new(),
            hijack: Mutex::new(None),
            activity: Mutex::new(Activity {
                request_since: ahead.map(|_| now),
                handling: false,
                last: now,
                rx: ahead.flatten(),
            }),
        })
    }

    /// Returns once hyper holds no unsent bytes of earlier responses (a pipelining client that
    /// does not read keeps it waiting, as it would keep hyper's own next response waiting).
    pub(crate) async fn flushed(&self) {
        while self.blocked.load(Relaxed) {
            self.unblocked.notified().await;
        }
    }

    /// Registers the stream; everything hyper writes from now on is discarded.
    pub(crate) fn take_over(&self, h: Hijack) {
        if let Ok(mut slot) = self.hijack.lock() {
            *slot = Some(h);
            self.swallow.store(true, Relaxed);
        }
    }

    /// When the bytes of the connection's latest read reached its socket (the kernel's receive
    /// timestamp, or the read's own instant): after a request's body has been read, the arrival
    /// of the read that completed it. `None` before any read.
    pub(crate) fn last_rx(&self) -> Option<Instant> {
        self.activity().rx
    }

    /// The request's body has been read: its time limit no longer runs.
    pub(crate) fn request_read(&self) {
        self.activity().request_since = None;
    }

    fn activity(&self) -> std::sync::MutexGuard<'_, Activity> {
        self.activity.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A read got bytes that reached the socket at `at`; outside a request they start one.
    fn on_read(&self, at: Instant) {
        let mut a = self.activity();
        a.rx = Some(at);
        if !a.handling && a.request_since.is_none() {
            a.request_since = Some(Instant::now());
        }
    }

    fn set_handling(&self, on: bool) {
        let mut a = self.activity();
        a.handling = on;
        if !on {
            a.request_since = None;
            a.last = Instant::now();
        }
    }

    /// When the connection is to be closed for waiting on its client too long (`None`: it is
    /// busy serving a request, writing, or streaming).
    fn deadline(&self, t: &ConnTimeouts) -> Option<Instant> {
        if self.swallow.load(Relaxed) || self.blocked.load(Relaxed) {
            return None;
        }
        let a = self.activity();
        match (a.request_since, a.handling) {
            (Some(since), _) => Some(since + t.request),
            (None, false) => Some(a.last + t.idle),
            (None, true) => None,
        }
    }
}

/// Marks the connection as serving a request while the handler's future lives.
struct Handling(Arc<ConnCtx>);

impl Drop for Handling {
    fn drop(&mut self) {
        self.0.set_handling(false);
    }
}

/// The socket as hyper sees it: bytes read ahead are replayed first, and writes are discarded
/// once a stream has taken over.
struct ConnIo {
    stream: TcpStream,
    prefix: Bytes,
    ctx: Arc<ConnCtx>,
}

impl AsyncRead for ConnIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        // One `recvmsg` per read, with the kernel's receive timestamp (`crate::sys::rxstamp`).
        let this = &mut *self;
        let fd = this.stream.as_raw_fd();
        loop {
            if let Err(e) = std::task::ready!(this.stream.poll_read_ready(cx)) {
                return Poll::Ready(Err(e));
            }
            // SAFETY: `recv` only writes into the unfilled part; exactly the `n` bytes it
            // reports are marked initialised and filled below.
            let dst = unsafe { buf.unfilled_mut() };
            match rxstamp::try_recv(&this.stream, fd, dst) {
                Ok((n, at)) => {
                    // SAFETY: the kernel wrote `n` bytes at the start of the unfilled part.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    if n > 0 {
                        this.ctx.on_read(at);
                    }
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl ConnIo {
    /// The socket, unless a stream has taken over (then hyper's writes are discarded).
    fn live(&mut self) -> Option<Pin<&mut TcpStream>> {
        let swallow = self.ctx.swallow.load(Relaxed);
        (!swallow).then(|| Pin::new(&mut self.stream))
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let Some(s) = self.live() else {
            return Poll::Ready(Ok(buf.len()));
        };
        let p = s.poll_write(cx, buf);
        // Whether hyper now holds unsent bytes (for `ConnCtx::flushed` and the timeouts).
        if self.ctx.blocked.swap(p.is_pending(), Relaxed) && p.is_ready() {
            self.ctx.unblocked.notify_one();
            self.ctx.activity().last = Instant::now();
        }
        p
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.live()
            .map_or(Poll::Ready(Ok(())), |s| s.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.live()
            .map_or(Poll::Ready(Ok(())), |s| s.poll_shutdown(cx))
    }
}

/// The request handler as a hyper service.
struct Svc {
    handler: Handler,
    ctx: Arc<ConnCtx>,
}

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for Svc {
    type Response = Reply;
    type Error = BoxError;
    type Future = HandlerFuture;

    fn call(&self, req: http::Request<hyper::body::Incoming>) -> HandlerFuture {
        self.ctx.set_handling(true);
        let handling = Handling(self.ctx.clone());
        let reply = (self.handler)(req, self.ctx.clone());
        Box::pin(async move {
            let _handling = handling;
            reply.await
        })
    }
}

type HttpParts = hyper::server::conn::http1::Parts<hyper_util::rt::TokioIo<ConnIo>, Svc>;

/// hyper serving `io` until it is done, without shutting the socket down (so that a stream can
/// take it over); a stop signal turns keep-alive off (graceful shutdown). `None`: the connection
/// failed, or waited on its client longer than `timeouts` allow.
async fn http(
    io: ConnIo,
    svc: Svc,
    timeouts: ConnTimeouts,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Option<HttpParts> {
    let ctx = io.ctx.clone();
    let conn = hyper::server::conn::http1::Builder::new();
    let mut conn = Some(conn.serve_connection(hyper_util::rt::TokioIo::new(io), svc));
    let mut stopping = false;
    let mut stopped = Box::pin(async move {
        let _ = stop.wait_for(|s| *s).await;
    });
    let mut timer = Box::pin(tokio::time::sleep(timeouts.idle));
    std::future::poll_fn(|cx| {
        let Some(c) = conn.as_mut() else {
            return Poll::Pending;
        };
        if !stopping && stopped.as_mut().poll(cx).is_ready() {
            stopping = true;
            Pin::new(&mut *c).graceful_shutdown();
        }
        match c.poll_without_shutdown(cx) {
            Poll::Ready(Err(_)) => return Poll::Ready(None),
            Poll::Ready(Ok(())) => return Poll::Ready(conn.take().map(|c| c.into_parts())),
            Poll::Pending => {}
        }
        // Every change of the connection's activity happens inside the poll above.
        let Some(due) = ctx.deadline(&timeouts).map(tokio::time::Instant::from_std) else {
            return Poll::Pending;
        };
        if timer.deadline() != due {
            timer.as_mut().reset(due);
        }
        timer.as_mut().poll(cx).map(|()| None)
    })
    .await
}

/// Serves one accepted connection until it closes, waits on its client longer than `timeouts`
/// allow, or the mock stops. Its reads carry the kernel's receive timestamps.
pub(crate) async fn serve(
    mut stream: TcpStream,
    handler: Handler,
    timeouts: ConnTimeouts,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    rxstamp::enable(stream.as_raw_fd());
    let mut prefix = Bytes::new();
    // When the bytes in `prefix` reached the socket (the latest read that got any of them).
    let mut prefix_rx: Option<Instant> = None;
    loop {
        let ahead = (!prefix.is_empty()).then_some(prefix_rx);
        let ctx = ConnCtx::new(stream.as_raw_fd(), ahead);
        let io = ConnIo {
            stream,
            prefix,
            ctx: ctx.clone(),
        };
        let svc = Svc {
            handler: handler.clone(),
            ctx: ctx.clone(),
        };
        let r = http(io, svc, timeouts, stop.clone()).await;
        let hijack = ctx.hijack.lock().ok().and_then(|mut s| s.take());
        let Some(parts) = r else {
            return; // dropping `hijack` abandons its stream
        };
        let mut io = parts.io.into_inner();
        let Some(h) = hijack else {
            // hyper ended the connection by itself (close, error, shutdown): close it properly.
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut io).await;
            return;
        };
        // Bytes hyper read ahead come before the ones still unread in the old prefix.
        let mut read_ahead = parts.read_buf.to_vec();
        read_ahead.extend_from_slice(&io.prefix);
        let mut ahead_rx = ctx.last_rx();
        stream = io.stream;
        let close_after = h.close_after;
        match emit::drive(h, &mut stream, &mut read_ahead, &mut ahead_rx).await {
            StreamEnd::Finished if !close_after && !*stop.borrow() => {
                prefix = Bytes::from(read_ahead);
                prefix_rx = ahead_rx;
            }
            StreamEnd::Reset => return, // dropping the socket sends the RST
            _ => {
                let _ = tokio::io::AsyncWriteExt::shutdown(&mut stream).await;
                return;
            }
        }
    }
}
