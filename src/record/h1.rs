//! retrace's own HTTP/1.1 engine, for HTTP/1.1 clients of an HTTP/1.1 upstream: one task per
//! client connection, nginx-style (docs/record.md, "Forwarding"). The task reads a request head,
//! rewrites it ([`crate::wire::h1`]), writes it to an upstream socket from this I/O thread's
//! [`RawPool`], then one poll loop moves bytes both ways: request body out, interim and final
//! response heads back, then each upstream read written to the client before the next read.
//! Body framing is followed to find each message's end; decoded payload goes to the capture.

use super::buf::Buf;
use super::common::{self, classify, describe, error_json, Drain, Proxy};
use super::extract::Captured;
use super::failure::ProxyFailure;
use super::rawpool::RawPool;
use super::shadow;
use super::tap::{lock, Pending};
use super::tunnel;
use crate::sys::netio::ClientStream;
use crate::wire::h1::{self, ChunkedDecoder, Framing, HeadError, RequestHead, ResponseOptions};
use std::future::{poll_fn, Future as _};
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::time::Sleep;

/// Client read buffer (grown only for a large request head, up to [`common::MAX_REQUEST_HEAD`]).
const CLIENT_BUF: usize = 4096;
/// Upstream read buffer: one read becomes one client write. It starts at a page (an SSE event
/// is a few hundred bytes) and grows to the most once a read fills it.
const UPSTREAM_BUF_FIRST: usize = 4096;
const UPSTREAM_BUF: usize = 8192;
/// A request head must be complete this long after the connection starts waiting for it.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(60);
/// An idle keep-alive client connection frees its buffers after this long without a request.
const IDLE_RELEASE: Duration = Duration::from_secs(1);

/// Where a body is in its framing.
enum BodyState {
    Done,
    Length(u64),
    Chunked(ChunkedDecoder),
    Close,
}

impl BodyState {
    fn new(f: Framing) -> Self {
        match f {
            Framing::None => BodyState::Done,
            Framing::Length(n) => BodyState::Length(n),
            Framing::Chunked => BodyState::Chunked(ChunkedDecoder::new()),
            Framing::Close => BodyState::Close,
        }
    }

    fn done(&self) -> bool {
        matches!(self, BodyState::Done)
    }

    /// How many of `have` bytes a `Length` body still takes (it is `Done` after its last).
    fn take_length(&mut self, have: usize) -> usize {
        let BodyState::Length(rem) = self else {
            return 0;
        };
        let k = have.min(usize::try_from(*rem).unwrap_or(usize::MAX));
        *rem -= k as u64;
        if *rem == 0 {
            *self = BodyState::Done;
        }
        k
    }
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum Phase {
    /// Waiting for the response head (interim heads are forwarded meanwhile).
    Head,
    Body,
    Done,
}

/// One step of an exchange's poll loop: whether it made progress, or how the exchange ended.
type Step = Result<bool, Outcome>;

/// How an exchange's poll loop ended.
enum Outcome {
    /// The response went out whole.
    Done,
    /// The client went away.
    Cancelled,
    /// The first write to a pooled upstream socket failed: nothing was sent.
    Retry,
    /// No response head: the client gets a JSON error (kind, message).
    BeforeHead(ProxyFailure, String),
    /// After the head: the client connection is closed without a clean end.
    Cut(ProxyFailure),
}

/// One request/response in flight.
struct Ex {
    arrival: Instant,
    req: BodyState,
    /// Framed request-body bytes at the front of the client buffer, not yet written upstream.
    req_ready: usize,
    /// Request-head bytes already written upstream (the head is in `out` until sent; 0: nothing
    /// went out yet).
    head_sent: usize,
    head_done: bool,
    /// The upstream answered before the request body ended: the rest is not forwarded.
    req_abandoned: bool,
    phase: Phase,
    resp: BodyState,
    /// Client-bound bytes in `out[cout..]` (heads, or a decoded body for HTTP/1.0 clients).
    cout: usize,
    /// Client-bound raw bytes at the front of the upstream buffer.
    raw_pend: usize,
    /// The upstream read whose bytes are waiting for the client (forwarding delay).
    pend_since: Option<Instant>,
    last_read: Instant,
    last_activity: tokio::time::Instant,
    headers_deadline: tokio::time::Instant,
    total_deadline: Option<tokio::time::Instant>,
    opts: ResponseOptions,
    keep_client: bool,
    up_reusable: bool,
    /// The upstream answered the request's protocol switch with 101: once the head went out,
    /// the connection becomes a tunnel.
    upgraded: bool,
    /// The response broke off with this failure: what came before it goes to the client, then
    /// the connection is cut.
    cut: Option<ProxyFailure>,
    pending: Pending,
    cap: Arc<Mutex<Captured>>,
}

struct Conn<'a, C> {
    client: C,
    p: &'a Proxy,
    pool: &'a RawPool,
    cbuf: Buf,
    ubuf: Buf,
    out: Vec<u8>,
    scratch: Vec<u8>,
    sleep: Pin<Box<Sleep>>,
    drain: Drain,
    /// The client may still be sending a request we did not read: close with a linger.
    linger: bool,
}

/// Serves one HTTP/1.1 client connection until it closes; `initial` holds bytes already read
/// from it (protocol detection). `drain` turns `Some` when the proxy shuts down: idle
/// connections close at once, busy ones after their exchange, upgraded tunnels at the instant
/// it names.
pub(crate) async fn serve<C>(client: C, initial: Vec<u8>, proxy: Arc<Proxy>, drain: Drain)
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let Some(pool) = proxy.raw.as_ref() else {
        return;
    };
    let mut c = Conn {
        client,
        p: &proxy,
        pool,
        cbuf: Buf::new(initial, CLIENT_BUF),
        ubuf: Buf::new(Vec::new(), UPSTREAM_BUF_FIRST),
        out: Vec::with_capacity(1024),
        scratch: Vec::new(),
        sleep: Box::pin(tokio::time::sleep(HEAD_TIMEOUT)),
        drain,
        linger: false,
    };
    loop {
        let head = match c.read_head().await {
            Ok(Some(h)) => h,
            Ok(None) => break,
            Err(e) => {
                Box::pin(c.reject(e)).await;
                return;
            }
        };
        if !c.exchange(head).await {
            break;
        }
    }
    if c.linger || c.cbuf.len() > 0 {
        Box::pin(c.linger_close()).await;
    } else {
        let _ = tokio::time::timeout(Duration::from_secs(1), c.client.shutdown()).await;
    }
}

impl<C: AsyncRead + AsyncWrite + Unpin> Conn<'_, C> {
    /// Waits for the next request head. `Ok(None)`: the client closed, the head timed out, or
    /// the proxy is draining and the connection is idle.
    async fn read_head(&mut self) -> Result<Option<RequestHead>, HeadError> {
        let now = tokio::time::Instant::now();
        let head_deadline = now + HEAD_TIMEOUT;
        // A connection idle for a while gives its buffers back (re-made by the next exchange).
        let holds = self.ubuf.v.capacity() > 0 || self.out.capacity() > 0;
        self.sleep.as_mut().reset(if holds {
            now + IDLE_RELEASE
        } else {
            head_deadline
        });
        loop {
            if self.cbuf.len() > 0 {
                let (host, via) = (self.p.host.as_bytes(), self.p.via.as_bytes());
                let base = &self.p.base_path;
                if let Some(h) =
                    h1::parse_request(self.cbuf.data(), host, base, via, &mut self.out)?
                {
                    return Ok(Some(h));
                }
            }
            let idle = self.cbuf.len() == 0;
            if idle && self.drain.borrow().is_some() {
                return Ok(None);
            }
            if !self.cbuf.make_room(common::MAX_REQUEST_HEAD) {
                return Err(HeadError::TooLarge);
            }
            let (cbuf, client) = (&mut self.cbuf, &mut self.client);
            tokio::select! {
                biased;
                r = poll_fn(|cx| cbuf.poll_read_from(client, cx)) => match r {
                    Ok(0) | Err(_) => return Ok(None),
                    Ok(_) => {}
                },
                _ = self.sleep.as_mut() => {
                    if tokio::time::Instant::now() >= head_deadline {
                        return Ok(None);
                    }
                    if self.cbuf.len() == 0 {
                        self.release_buffers();
                    }
                    self.sleep.as_mut().reset(head_deadline);
                }
                r = self.drain.changed(), if idle => {
                    if r.is_err() {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Frees the per-exchange buffers of an idle connection (the client buffer shrinks back to
    /// its first size): an idle keep-alive connection then costs its task and 4 KiB.
    fn release_buffers(&mut self) {
        self.ubuf = Buf::new(Vec::new(), 0);
        self.out = Vec::new();
        self.scratch = Vec::new();
        if self.cbuf.v.capacity() > CLIENT_BUF {
            self.cbuf = Buf::new(Vec::new(), CLIENT_BUF);
        }
    }

    /// Answers a refused request head and closes.
    async fn reject(&mut self, e: HeadError) {
        let (kind, reason) = common::refusal(e);
        let wait = Duration::from_secs(5);
        self.answer_error(e.status(), reason, kind, e.reason(), false, wait)
            .await;
        self.linger_close().await;
    }

    /// Closes our side, then reads and discards what the client still sends (for at most a
    /// second and 1 MiB) until it closes too: closing with unread bytes would send a reset that
    /// can destroy a response the client has not read yet (a refused head, an early error).
    async fn linger_close(&mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), self.client.shutdown()).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        let mut seen = 0usize;
        while seen < 1 << 20 {
            self.cbuf.clear();
            self.cbuf.make_room(CLIENT_BUF);
            match self.read_client_by(deadline).await {
                Some(n) => seen += n,
                None => break,
            }
        }
    }

    /// One read from the client into its buffer by `deadline`: `None` on EOF, error or timeout.
    async fn read_client_by(&mut self, deadline: tokio::time::Instant) -> Option<usize> {
        let (cbuf, client) = (&mut self.cbuf, &mut self.client);
        let read = poll_fn(|cx| cbuf.poll_read_from(client, cx));
        match tokio::time::timeout_at(deadline, read).await {
            Ok(Ok(n)) if n > 0 => Some(n),
            _ => None,
        }
    }

    /// Forwards one exchange; returns whether the client connection carries on.
    async fn exchange(&mut self, h: RequestHead) -> bool {
        let p = self.p;
        let arrival = Instant::now();
        let t_arrival = tokio::time::Instant::from_std(arrival);
        p.stats.requests.fetch_add(1, Relaxed);
        // Method and path are copied from the client buffer into the (reused) exchange's own.
        let data = self.cbuf.data();
        let mut ex = p.recorder.exchange(arrival, h.method_in(data), "");
        h.path_into(data, &mut ex.path);
        let (mut pending, cap) = Pending::new(ex, &p.recorder, &p.stats, p.capture_max);
        self.cbuf.consume(h.len);
        if self.ubuf.v.capacity() < UPSTREAM_BUF_FIRST {
            self.ubuf.v.reserve_exact(UPSTREAM_BUF_FIRST);
        }
        let req = BodyState::new(h.body);
        if req.done() {
            shadow::request_done(p.shadow.as_ref(), &mut pending, &cap);
        }
        let (headers_deadline, total_deadline) = p.deadlines(t_arrival);
        let mut ex = Ex {
            arrival,
            req,
            req_ready: 0,
            head_sent: 0,
            head_done: false,
            req_abandoned: false,
            phase: Phase::Head,
            resp: BodyState::Done,
            cout: 0,
            raw_pend: 0,
            pend_since: None,
            last_read: arrival,
            last_activity: t_arrival,
            headers_deadline,
            total_deadline,
            opts: ResponseOptions {
                head_request: h.is_head,
                close: !h.keep_alive,
                dechunk: h.http10,
                upgrade: h.upgrade,
            },
            upgraded: false,
            cut: None,
            keep_client: h.keep_alive,
            up_reusable: true,
            pending,
            cap,
        };
        self.arm_by(headers_deadline);
        let mut retried = false;
        let (outcome, up) = loop {
            // A retry dials a fresh socket rather than trying another pooled one.
            let pooled = if retried { None } else { self.pool.checkout() };
            let (mut up, reused) = match pooled {
                Some(u) => (u, true),
                None => {
                    let connect = Box::pin(self.pool.connect());
                    match tokio::time::timeout_at(headers_deadline, connect).await {
                        Ok(Ok(u)) => (u, false),
                        Ok(Err(e)) => {
                            let kind = classify(true, false, &*e);
                            break (Outcome::BeforeHead(kind, describe(&*e)), None);
                        }
                        Err(_) => {
                            let msg = common::NO_HEADERS.into();
                            break (Outcome::BeforeHead(ProxyFailure::TimeoutHeaders, msg), None);
                        }
                    }
                }
            };
            match poll_fn(|cx| self.poll_exchange(cx, &mut ex, &mut up)).await {
                // The pooled socket was closed under us before a byte went out.
                Outcome::Retry if reused && !retried => retried = true,
                o => break (o, Some(up)),
            }
        };
        self.finish(ex, outcome, up).await
    }

    /// Records the exchange, gives back or drops the upstream socket, answers errors before the
    /// head; returns whether the client connection carries on.
    async fn finish(&mut self, mut ex: Ex, outcome: Outcome, up: Option<ClientStream>) -> bool {
        let up = match up {
            Some(up) if ex.upgraded && matches!(outcome, Outcome::Done) => {
                return Box::pin(self.tunnel(ex, up)).await
            }
            up => up,
        };
        self.ubuf.clear();
        self.out.clear();
        let (kind, msg) = match outcome {
            Outcome::Done => {
                let req_done = ex.req.done() && ex.req_ready == 0 && !ex.req_abandoned;
                self.linger |= !req_done;
                if let (Some(up), true) = (up, ex.up_reusable && req_done) {
                    self.pool.checkin(up);
                }
                // Answered before the whole request body went upstream: the record says so.
                ex.pending
                    .end((!req_done).then_some(ProxyFailure::BodyUnsent), false);
                return ex.keep_client && req_done && self.drain.borrow().is_none();
            }
            Outcome::Cancelled => {
                drop(up);
                ex.pending.end(None, true);
                return false;
            }
            Outcome::Cut(kind) => {
                drop(up);
                ex.pending.end(Some(kind), false);
                return false;
            }
            Outcome::Retry => {
                let msg = "writing upstream: the upstream connection was closed";
                (ProxyFailure::UpstreamClosed, msg.into())
            }
            Outcome::BeforeHead(kind, msg) => (kind, msg),
        };
        drop(up);
        if kind.is_upstream_fault() {
            tracing::warn!("upstream request failed ({kind}): {msg}");
        }
        // The record still wants the prompt: read the rest of the body (capped, briefly).
        let body_read = Box::pin(self.read_for_record(&mut ex)).await;
        self.linger |= !body_read;
        ex.pending.end(Some(kind), false);
        let (status, reason) = kind.status();
        let keep = body_read && ex.keep_client && self.drain.borrow().is_none();
        let wait = Duration::from_secs(10);
        let ok = Box::pin(self.answer_error(status, reason, kind.as_str(), &msg, keep, wait)).await;
        keep && ok
    }

    /// Writes a JSON error response within `wait` (with `connection: close` unless `keep`);
    /// returns whether it went out.
    async fn answer_error(
        &mut self,
        status: u16,
        reason: &str,
        kind: &str,
        msg: &str,
        keep: bool,
        wait: Duration,
    ) -> bool {
        use std::io::Write as _;
        let body = error_json(status, kind, msg);
        self.out.clear();
        let _ = write!(
            self.out,
            "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
            body.len()
        );
        if !keep {
            self.out.extend_from_slice(b"connection: close\r\n");
        }
        self.out.extend_from_slice(b"\r\n");
        self.out.extend_from_slice(body.as_bytes());
        let w = tokio::time::timeout(wait, self.client.write_all(&self.out));
        let ok = matches!(w.await, Ok(Ok(())));
        self.out.clear();
        ok
    }

    /// Turns the connection into a tunnel after a 101 went to the client: what each side sent
    /// past the switch goes first, then bytes flow both ways until the tunnel ends; the upstream
    /// socket is never pooled again and the client connection ends with the tunnel.
    async fn tunnel(&mut self, ex: Ex, mut up: ClientStream) -> bool {
        self.out.clear();
        let to_client = std::mem::take(&mut self.ubuf);
        let to_upstream = std::mem::take(&mut self.cbuf);
        let how = tunnel::run(
            &mut self.client,
            &mut up,
            to_upstream,
            to_client,
            &mut self.drain,
            &self.p.stats,
        )
        .await;
        drop(up);
        tunnel::record(ex.pending, how);
        false
    }

    /// Reads what is left of a request body that will not be forwarded, noting it for the
    /// record, for at most [`common::UNSENT_BODY_WAIT`] and the capture cap. Returns whether the whole
    /// body was read (the connection can then carry another request).
    async fn read_for_record(&mut self, ex: &mut Ex) -> bool {
        if ex.req_ready > 0 {
            self.cbuf.consume(ex.req_ready);
            ex.req_ready = 0;
        }
        let deadline = tokio::time::Instant::now() + common::UNSENT_BODY_WAIT;
        let mut seen = 0usize;
        loop {
            if self.cbuf.len() > 0 {
                match self.frame_request(ex) {
                    Ok(k) => {
                        seen += k;
                        self.cbuf.consume(k);
                        ex.req_ready = 0;
                    }
                    Err(_) => return false,
                }
            }
            if ex.req.done() {
                return true;
            }
            if seen > self.p.capture_max
                || !self.cbuf.make_room(CLIENT_BUF)
                || self.read_client_by(deadline).await.is_none()
            {
                return false;
            }
        }
    }

    /// Frames request-body bytes at the front of the client buffer (all of them unframed),
    /// noting the payload; returns how many belong to the body.
    fn frame_request(&mut self, ex: &mut Ex) -> Result<usize, h1::ChunkError> {
        let data = self.cbuf.data();
        let max = self.p.capture_max;
        let (k, decoded) = match &mut ex.req {
            BodyState::Length(_) => {
                let k = ex.req.take_length(data.len());
                lock(&ex.cap).note(&data[..k], max);
                (k, k)
            }
            BodyState::Chunked(d) => {
                let mut c = lock(&ex.cap);
                let mut decoded = 0;
                let k = d.feed(data, |a, b| {
                    c.note(&data[a..b], max);
                    decoded += b - a;
                })?;
                drop(c);
                if d.is_done() {
                    ex.req = BodyState::Done;
                }
                (k, decoded)
            }
            BodyState::Done | BodyState::Close => (0, 0),
        };
        self.p
            .stats
            .request_bytes
            .fetch_add(decoded as u64, Relaxed);
        if ex.req.done() {
            shadow::request_done(self.p.shadow.as_ref(), &mut ex.pending, &ex.cap);
        }
        Ok(k)
    }

    /// Frames response bytes at the front of the upstream buffer (body phase), noting the
    /// payload; sets up what goes to the client. Invalid chunked framing ends the response: the
    /// bytes up to the last payload before it still go out, then the connection is cut
    /// ([`ProxyFailure::UpstreamFraming`]).
    fn frame_response(&mut self, ex: &mut Ex) {
        let data = self.ubuf.data();
        let at = ex.last_read.saturating_duration_since(ex.arrival);
        let max = self.p.capture_max;
        let chunked = matches!(ex.resp, BodyState::Chunked(_));
        let decoded: usize;
        let k = match &mut ex.resp {
            BodyState::Length(_) => {
                decoded = ex.resp.take_length(data.len());
                decoded
            }
            BodyState::Close => {
                decoded = data.len();
                data.len()
            }
            BodyState::Chunked(d) => {
                self.scratch.clear();
                let (scratch, mut valid) = (&mut self.scratch, 0);
                let r = d.feed(data, |a, b| {
                    scratch.extend_from_slice(&data[a..b]);
                    valid = b;
                });
                decoded = scratch.len();
                match r {
                    Ok(k) if d.is_done() => {
                        ex.resp = BodyState::Done;
                        k
                    }
                    Ok(k) => k,
                    Err(e) => {
                        tracing::debug!("response from upstream: {e}");
                        ex.cut = Some(ProxyFailure::UpstreamFraming);
                        valid
                    }
                }
            }
            BodyState::Done => {
                decoded = 0;
                0
            }
        };
        let payload: &[u8] = if chunked {
            &self.scratch
        } else {
            &data[..decoded]
        };
        if decoded > 0 {
            self.p
                .stats
                .response_bytes
                .fetch_add(decoded as u64, Relaxed);
            if let Some(e) = ex.pending.exchange() {
                e.note_response(at, payload, max);
            }
        }
        if chunked && ex.opts.dechunk {
            // HTTP/1.0 client: the payload goes out decoded, the framing is dropped.
            self.out.extend_from_slice(payload);
            self.ubuf.consume(k);
        } else {
            ex.raw_pend = k;
        }
        if k > 0 || decoded > 0 {
            ex.pend_since.get_or_insert(ex.last_read);
        }
        if ex.cut.is_some() {
            ex.phase = Phase::Done;
            ex.up_reusable = false;
            ex.keep_client = false;
        } else if ex.resp.done() {
            ex.phase = Phase::Done;
            if self.ubuf.len() > ex.raw_pend {
                // Bytes after the end of the response: the socket cannot be trusted again.
                ex.up_reusable = false;
            }
        }
    }

    /// Moves the exchange on until it ends or waits: each step below runs once per pass, and
    /// the pass repeats while any step made progress.
    fn poll_exchange(
        &mut self,
        cx: &mut Context<'_>,
        ex: &mut Ex,
        up: &mut ClientStream,
    ) -> Poll<Outcome> {
        loop {
            let progress = match self.poll_steps(cx, ex, up) {
                Ok(p) => p,
                Err(o) => return Poll::Ready(o),
            };
            if ex.phase == Phase::Done && !self.client_bound(ex) && ex.head_done {
                if let Some(f) = ex.cut {
                    return Poll::Ready(Outcome::Cut(f));
                }
                if !ex.req.done() || ex.req_ready > 0 {
                    // Answered before the request body ended: do not wait for the rest.
                    ex.abandon_request();
                }
                return Poll::Ready(Outcome::Done);
            }
            if !progress {
                return Poll::Pending;
            }
        }
    }

    /// One pass over both halves of the exchange, in order (every step runs).
    fn poll_steps(&mut self, cx: &mut Context<'_>, ex: &mut Ex, up: &mut ClientStream) -> Step {
        self.poll_timers(cx, ex)?;
        Ok(self.poll_request_body(cx, ex)?
            | self.poll_send_upstream(cx, ex, up)?
            | self.poll_send_client(cx, ex)?
            | self.poll_upstream(cx, ex, up)?
            | self.poll_client_gone(cx, ex)?)
    }

    /// Timers: response headers (and total) before the head; idle gap and total after.
    fn poll_timers(&mut self, cx: &mut Context<'_>, ex: &mut Ex) -> Result<(), Outcome> {
        while self.sleep.as_mut().poll(cx).is_ready() {
            let now = tokio::time::Instant::now();
            if ex.phase == Phase::Head {
                if now >= ex.headers_deadline {
                    let msg = common::NO_HEADERS.into();
                    return Err(Outcome::BeforeHead(ProxyFailure::TimeoutHeaders, msg));
                }
                self.sleep.as_mut().reset(ex.headers_deadline);
                continue;
            }
            if ex.total_deadline.is_some_and(|t| now >= t) {
                return Err(Outcome::Cut(ProxyFailure::TimeoutTotal));
            }
            if self.client_bound(ex) || ex.phase == Phase::Done {
                ex.last_activity = now;
            }
            let idle_due = ex.last_activity + self.p.idle_timeout;
            if now >= idle_due {
                return Err(Outcome::Cut(ProxyFailure::TimeoutIdle));
            }
            let next = ex.total_deadline.map_or(idle_due, |t| t.min(idle_due));
            self.sleep.as_mut().reset(next);
        }
        Ok(())
    }

    /// More request body from the client (framed before the write to the upstream, so a small
    /// request goes upstream in one write with its head).
    fn poll_request_body(&mut self, cx: &mut Context<'_>, ex: &mut Ex) -> Step {
        if ex.req_ready > 0 || ex.req.done() || ex.req_abandoned {
            return Ok(false);
        }
        if self.cbuf.len() == 0 {
            self.cbuf.make_room(CLIENT_BUF);
            return self.poll_client_read(cx);
        }
        match self.frame_request(ex) {
            Ok(k) => {
                ex.req_ready = k;
                Ok(true)
            }
            Err(e) if ex.phase == Phase::Head => Err(Outcome::BeforeHead(
                ProxyFailure::ClientBody,
                format!("request body: {e}"),
            )),
            Err(_) => Err(Outcome::Cut(ProxyFailure::ClientBody)),
        }
    }

    /// One read from the client: EOF or an error cancels the exchange.
    fn poll_client_read(&mut self, cx: &mut Context<'_>) -> Step {
        match self.cbuf.poll_read_from(&mut self.client, cx) {
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => Err(Outcome::Cancelled),
            Poll::Ready(Ok(_)) => Ok(true),
            Poll::Pending => Ok(false),
        }
    }

    /// Request head and framed body → upstream.
    fn poll_send_upstream(
        &mut self,
        cx: &mut Context<'_>,
        ex: &mut Ex,
        up: &mut ClientStream,
    ) -> Step {
        if ex.head_done && ex.req_ready == 0 {
            return Ok(false);
        }
        let head: &[u8] = if ex.head_done {
            &[]
        } else {
            &self.out[ex.head_sent..]
        };
        let body = &self.cbuf.data()[..ex.req_ready];
        let bufs = [IoSlice::new(head), IoSlice::new(body)];
        match Pin::new(up).poll_write_vectored(cx, &bufs) {
            // Nothing went out yet (the head is never empty).
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) if ex.head_sent == 0 => Err(Outcome::Retry),
            Poll::Ready(Ok(n)) if n > 0 => {
                let h = n.min(head.len());
                let b = n - h;
                if !ex.head_done {
                    ex.head_sent += h;
                    if ex.head_sent == self.out.len() {
                        ex.head_done = true;
                        self.out.clear();
                    }
                }
                if b > 0 {
                    self.cbuf.consume(b);
                    ex.req_ready -= b;
                }
                Ok(true)
            }
            Poll::Ready(r) => {
                // The upstream stopped reading, as servers do when they answer early (an
                // error) and close: forward no more of the request, deliver the answer if it
                // comes (it may be read yet, even after a reset), close the client after. No
                // answer is a 502 when the read fails below.
                if let Err(e) = r {
                    tracing::debug!("writing the request upstream: {e}");
                }
                ex.abandon_request();
                self.cbuf.consume(ex.req_ready);
                ex.req_ready = 0;
                if !ex.head_done {
                    ex.head_done = true;
                    self.out.clear();
                }
                Ok(true)
            }
            Poll::Pending => Ok(false),
        }
    }

    /// Response bytes → client.
    fn poll_send_client(&mut self, cx: &mut Context<'_>, ex: &mut Ex) -> Step {
        if !self.client_bound(ex) {
            return Ok(false);
        }
        let a = &self.out[ex.cout..];
        let b = &self.ubuf.data()[..ex.raw_pend];
        let bufs = [IoSlice::new(a), IoSlice::new(b)];
        match Pin::new(&mut self.client).poll_write_vectored(cx, &bufs) {
            Poll::Ready(Ok(n)) if n > 0 => {
                let h = n.min(a.len());
                ex.cout += h;
                let r = n - h;
                if r > 0 {
                    self.ubuf.consume(r);
                    ex.raw_pend -= r;
                }
                if ex.cout == self.out.len() && ex.raw_pend == 0 {
                    self.out.clear();
                    ex.cout = 0;
                    if let Some(t) = ex.pend_since.take() {
                        let now = Instant::now();
                        let delay = now.saturating_duration_since(t);
                        self.p.stats.forward_delay.observe(delay);
                        ex.last_activity = tokio::time::Instant::from_std(now);
                    }
                }
                Ok(true)
            }
            Poll::Ready(_) => Err(Outcome::Cancelled),
            Poll::Pending => Ok(false),
        }
    }

    /// Upstream → response head, body framing, reads.
    fn poll_upstream(&mut self, cx: &mut Context<'_>, ex: &mut Ex, up: &mut ClientStream) -> Step {
        if !ex.head_done || ex.phase == Phase::Done || self.client_bound(ex) {
            return Ok(false);
        }
        if self.ubuf.len() > 0 {
            match ex.phase {
                Phase::Head => {
                    if self.take_response_head(ex)? {
                        return Ok(true);
                    }
                }
                Phase::Body => {
                    self.frame_response(ex);
                    return Ok(true);
                }
                Phase::Done => return Ok(false),
            }
        }
        self.poll_upstream_read(cx, ex, up)
    }

    /// Parses a response head at the front of the upstream buffer (rewritten into `out`);
    /// returns whether one was complete.
    fn take_response_head(&mut self, ex: &mut Ex) -> Result<bool, Outcome> {
        let opts = ex.opts_now(&self.drain);
        let h = match h1::parse_response(self.ubuf.data(), opts, &mut self.out) {
            Ok(None) => return Ok(false),
            Ok(Some(h)) => h,
            Err(HeadError::TooLarge) => {
                let msg = common::HEAD_TOO_LARGE.into();
                return Err(Outcome::BeforeHead(ProxyFailure::UpstreamClosed, msg));
            }
            Err(e) => {
                let msg = format!("bad response head from upstream: {}", e.reason());
                return Err(Outcome::BeforeHead(ProxyFailure::UpstreamClosed, msg));
            }
        };
        // A 101 (only accepted when asked for) is final: the connection switches protocols
        // after it.
        let interim = (100..200).contains(&h.status) && h.status != 101;
        if let (false, Some(at), Some(e)) =
            (interim, h.content_type_at.clone(), ex.pending.exchange())
        {
            // Copied before the head leaves the buffer.
            let v = self.ubuf.data().get(at).unwrap_or_default();
            e.content_type.push_str(&String::from_utf8_lossy(v));
        }
        self.ubuf.consume(h.len);
        ex.cout = 0;
        if !interim {
            self.on_final_head(ex, h);
            // Body bytes that came with the head go out with it.
            if ex.phase == Phase::Body && self.ubuf.len() > 0 {
                self.frame_response(ex);
            }
        }
        // Interim heads (100 Continue, 103 Early Hints) are forwarded (not to HTTP/1.0
        // clients, RFC 9110 §15.2) and the next head is parsed after.
        if interim && ex.opts.dechunk {
            self.out.clear();
        }
        Ok(true)
    }

    /// Reads from the upstream into its buffer (the head may grow it up to the head limit).
    fn poll_upstream_read(
        &mut self,
        cx: &mut Context<'_>,
        ex: &mut Ex,
        up: &mut ClientStream,
    ) -> Step {
        let limit = if ex.phase == Phase::Head {
            h1::MAX_HEAD + 1
        } else {
            UPSTREAM_BUF
        };
        if !self.ubuf.make_room(limit) {
            let msg = common::HEAD_TOO_LARGE.into();
            return Err(Outcome::BeforeHead(ProxyFailure::UpstreamClosed, msg));
        }
        let spare = self.ubuf.v.capacity() - self.ubuf.v.len();
        match self.ubuf.poll_read_from(up, cx) {
            Poll::Ready(Ok(n)) if n > 0 => {
                if n == spare && self.ubuf.v.capacity() < UPSTREAM_BUF {
                    // The read filled the buffer (a bulk body): the next take the most.
                    self.ubuf.v.reserve_exact(UPSTREAM_BUF - self.ubuf.v.len());
                }
                ex.last_read = Instant::now();
                ex.last_activity = tokio::time::Instant::from_std(ex.last_read);
                Ok(true)
            }
            Poll::Ready(r) => {
                let eof = r.is_ok();
                let what = r.err().map_or("closed".to_string(), |e| e.to_string());
                match ex.phase {
                    Phase::Head => {
                        let msg =
                            format!("the upstream connection {what} before the response head");
                        Err(Outcome::BeforeHead(ProxyFailure::UpstreamClosed, msg))
                    }
                    _ if matches!(ex.resp, BodyState::Close) && eof => {
                        ex.resp = BodyState::Done;
                        ex.phase = Phase::Done;
                        ex.up_reusable = false;
                        ex.keep_client = false;
                        Ok(true)
                    }
                    _ => Err(Outcome::Cut(ProxyFailure::UpstreamReset)),
                }
            }
            Poll::Pending => Ok(false),
        }
    }

    /// The client's read side while the response streams: EOF or reset cancels; bytes of a
    /// pipelined next request are kept.
    fn poll_client_gone(&mut self, cx: &mut Context<'_>, ex: &mut Ex) -> Step {
        if (ex.req.done() || ex.req_abandoned)
            && ex.phase != Phase::Done
            && self.cbuf.v.len() < self.cbuf.v.capacity()
        {
            return self.poll_client_read(cx);
        }
        Ok(false)
    }

    /// The final response head arrived (already rewritten into `out`).
    fn on_final_head(&mut self, ex: &mut Ex, h: h1::ResponseHead) {
        let after = ex.arrival.elapsed();
        // Bytes after a 101 head are the new protocol's: they stay in the upstream buffer for
        // the tunnel (the head has no body, so the exchange is done once the head is out).
        ex.upgraded = h.status == 101;
        self.p.stats.headers_latency.observe(after);
        if let Some(e) = ex.pending.exchange() {
            e.status = h.status;
            e.headers_after = Some(after);
        }
        ex.up_reusable &= h.reusable;
        if ex.opts_now(&self.drain).close || h.body == Framing::Close {
            ex.keep_client = false;
        }
        if h.body == Framing::Chunked && ex.opts.dechunk {
            ex.keep_client = false;
        }
        ex.resp = BodyState::new(h.body);
        if ex.resp.done() {
            ex.phase = Phase::Done;
        } else {
            ex.phase = Phase::Body;
            let idle_due = tokio::time::Instant::now() + self.p.idle_timeout;
            let next = ex.total_deadline.map_or(idle_due, |t| t.min(idle_due));
            self.arm_by(next);
        }
    }

    /// Whether response bytes wait for the client (in `out`, or raw in the upstream buffer).
    fn client_bound(&self, ex: &Ex) -> bool {
        ex.cout < self.out.len() || ex.raw_pend > 0
    }

    /// Makes the timer fire no later than `deadline`. A timer already due earlier is left as
    /// it is (re-arming costs a timer-wheel update per request): when it fires, the exchange's
    /// timer loop compares the time with the real deadlines and re-arms for the next one.
    fn arm_by(&mut self, deadline: tokio::time::Instant) {
        if self.sleep.deadline() > deadline {
            self.sleep.as_mut().reset(deadline);
        }
    }
}

impl Ex {
    /// Forwards no more of the request body: neither connection can carry another exchange.
    fn abandon_request(&mut self) {
        self.req_abandoned = true;
        self.keep_client = false;
        self.up_reusable = false;
    }

    /// Response options, with `close` set once the proxy drains.
    fn opts_now(&self, drain: &Drain) -> ResponseOptions {
        let mut o = self.opts;
        o.close |= !self.keep_client || drain.borrow().is_some();
        o
    }
}
