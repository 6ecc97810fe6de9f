//! Body taps for hyper's path: `http_body::Body` wrappers that forward every frame untouched the
//! moment it arrives and only note its arrival offset, length and a copy of its bytes (capped;
//! invariant 1). [`ResponseTap`] also enforces the idle-gap and total timeouts. [`Pending`] is an
//! exchange in flight, handed to the writer queue exactly once however it ends.

use super::counters::ProxyCounters;
use super::extract::{Captured, Exchange};
use super::failure::ProxyFailure;
use super::timing::{now_ns, WriteClock};
use super::writer::Recorder;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

use crate::wire::BoxError;

/// An error the proxy raises on a response body (timeouts).
#[derive(Debug, thiserror::Error)]
#[error("retrace: {0}")]
pub(crate) struct TapError(pub &'static str);

/// Locks a mutex even if a panicking thread poisoned it (what it guards is plain data).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where a [`RequestTap`] dropped before the end of its body leaves the rest of it.
pub(crate) type Unsent = Arc<Mutex<Option<Incoming>>>;

/// The client's request body on its way upstream.
pub(crate) struct RequestTap {
    inner: Option<Incoming>,
    cap: Arc<Mutex<Captured>>,
    max: usize,
    stats: Arc<ProxyCounters>,
    unsent: Option<Unsent>,
    /// Where the complete body is offered to the shadows: (shadows, method, path).
    mirror: Option<Mirror>,
}

/// A request to offer to the shadows once its body is complete.
pub(crate) struct Mirror {
    pub(crate) shadow: Arc<super::shadow::Shadower>,
    pub(crate) method: String,
    pub(crate) path: String,
}

impl RequestTap {
    /// When the tap is dropped before its body ended (the client that sent it upstream gave
    /// up, e.g. no connection), the rest goes into `unsent` for the record to read. A body that
    /// is over already (an HTTP/2 request whose head ended its stream) is complete at once:
    /// hyper never polls it.
    pub(crate) fn new(
        inner: Incoming,
        cap: Arc<Mutex<Captured>>,
        max: usize,
        stats: Arc<ProxyCounters>,
        unsent: Option<Unsent>,
        mirror: Option<Mirror>,
    ) -> Self {
        let over = inner.is_end_stream();
        let mut tap = RequestTap {
            inner: Some(inner),
            cap,
            max,
            stats,
            unsent,
            mirror,
        };
        if over {
            let cap = tap.cap.clone();
            tap.complete(&mut lock(&cap));
        }
        tap
    }

    fn complete(&mut self, c: &mut Captured) {
        match self.mirror.take() {
            Some(m) => super::shadow::body_complete(Some(&m.shadow), &m.method, &m.path, c),
            None => c.complete = true,
        }
    }
}

impl Drop for RequestTap {
    fn drop(&mut self) {
        if let (Some(slot), Some(b)) = (&self.unsent, self.inner.take()) {
            if !b.is_end_stream() {
                *lock(slot) = Some(b);
            }
        }
    }
}

impl Body for RequestTap {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let r = Pin::new(&mut *inner).poll_frame(cx);
        let ended = inner.is_end_stream();
        match &r {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    this.stats.request_bytes.fetch_add(d.len() as u64, Relaxed);
                    let cap = this.cap.clone();
                    let mut c = lock(&cap);
                    c.note(d, this.max);
                    // hyper stops polling once a body with a known length says it has ended.
                    if ended {
                        this.complete(&mut c);
                    }
                }
            }
            Poll::Ready(None) => {
                let cap = this.cap.clone();
                this.complete(&mut lock(&cap));
            }
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint())
    }
}

struct TapState {
    ex: Box<Exchange>,
    req: Arc<Mutex<Captured>>,
    recorder: Recorder,
    stats: Arc<ProxyCounters>,
    max: usize,
}

/// An exchange in progress: finished exactly once, by [`Pending::end`], by the [`ResponseTap`]
/// it is moved into, or by its `Drop` (the client left first), which records it as cancelled.
pub(crate) struct Pending(Option<TapState>);

impl Pending {
    /// Starts recording `ex`: its (reused) capture buffer moves to the returned capture, which
    /// the request side notes into, and comes back when the exchange ends.
    pub(crate) fn new(
        mut ex: Box<Exchange>,
        recorder: &Recorder,
        stats: &Arc<ProxyCounters>,
        max: usize,
    ) -> (Self, Arc<Mutex<Captured>>) {
        stats.in_flight.fetch_add(1, Relaxed);
        let req = Arc::new(Mutex::new(std::mem::take(&mut ex.request)));
        let (recorder, stats) = (recorder.clone(), stats.clone());
        let st = TapState {
            ex,
            req: req.clone(),
            recorder,
            stats,
            max,
        };
        (Pending(Some(st)), req)
    }

    /// The exchange being recorded (to note status and header time).
    pub(crate) fn exchange(&mut self) -> Option<&mut Exchange> {
        self.0.as_mut().map(|s| &mut *s.ex)
    }

    /// Finishes with an error kind (counted) and whether the client went away.
    pub(crate) fn end(mut self, error: Option<ProxyFailure>, cancelled: bool) {
        self.finish(error, cancelled);
    }

    fn finish(&mut self, error: Option<ProxyFailure>, cancelled: bool) {
        if let Some(st) = self.0.take() {
            finish(st, error, cancelled);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(st) = self.0.take() {
            finish(st, None, true);
        }
    }
}

/// Notes the failure (counted) and whether the client went away, and hands the exchange over.
fn finish(mut st: TapState, error: Option<ProxyFailure>, cancelled: bool) {
    if let Some(f) = error {
        st.ex.error = Some(f);
        st.stats.upstream_error(f);
    }
    // A client gone once it had the whole stream, `[DONE]` included, did not cancel it: it may
    // close before the chunked body's last chunk comes (the openai SDK does, and real vLLM
    // writes that chunk apart).
    st.ex.cancelled = cancelled && !st.ex.sse_done();
    if st.ex.cancelled && st.stats.drain_cut.load(Relaxed) {
        // Dropped with its I/O thread at the drain deadline: not the client's doing.
        st.ex.cancelled = false;
        st.ex.error = Some(ProxyFailure::DrainDeadline);
    }
    let now = st.ex.arrival.elapsed();
    st.ex.end = Some(now);
    st.ex.request = std::mem::take(&mut *lock(&st.req));
    st.stats.in_flight.fetch_sub(1, Relaxed);
    // An upgraded tunnel lasts as long as its peers want: not a response duration.
    if st.ex.status != 101 {
        st.stats.duration.observe(now);
    }
    st.stats.response_status(st.ex.status);
    if st.ex.cancelled {
        st.stats.client_cancelled.fetch_add(1, Relaxed);
    }
    match st.ex.request.ticket.take() {
        Some(t) => t.park(st.ex, &st.recorder),
        None => st.recorder.submit(st.ex),
    }
}

/// The upstream response body on its way to the client.
pub(crate) struct ResponseTap {
    inner: Incoming,
    pending: Pending,
    idle_for: Duration,
    idle: Pin<Box<Sleep>>,
    last_data: Instant,
    total: Option<Pin<Box<Sleep>>>,
    /// The client connection's write clock (forwarding delay).
    client: Arc<WriteClock>,
}

impl ResponseTap {
    /// `total_deadline` is the absolute end of the optional total timeout; `client` the client
    /// connection's write clock.
    pub(crate) fn new(
        inner: Incoming,
        pending: Pending,
        idle_for: Duration,
        total_deadline: Option<Instant>,
        client: Arc<WriteClock>,
    ) -> Self {
        ResponseTap {
            inner,
            pending,
            idle_for,
            idle: Box::pin(tokio::time::sleep(idle_for)),
            last_data: Instant::now(),
            total: total_deadline.map(|d| Box::pin(tokio::time::sleep_until(d))),
            client,
        }
    }
}

impl Body for ResponseTap {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.pending.0.is_none() {
            // Already ended (a timeout fired): never poll the upstream again.
            return Poll::Ready(None);
        }
        if let Some(t) = this.total.as_mut() {
            if t.as_mut().poll(cx).is_ready() {
                this.pending.finish(Some(ProxyFailure::TimeoutTotal), false);
                return Poll::Ready(Some(Err(Box::new(TapError(
                    "total timeout reached; response cut",
                )))));
            }
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => {
                if let (Some(d), Some(st)) = (f.data_ref(), this.pending.0.as_mut()) {
                    let now = Instant::now();
                    st.stats.response_bytes.fetch_add(d.len() as u64, Relaxed);
                    let at = now.into_std().saturating_duration_since(st.ex.arrival);
                    let max = st.max;
                    st.ex.note_response(at, d, max);
                    // The idle timer is re-armed lazily when it fires (no timer-wheel work per chunk).
                    this.last_data = now;
                    this.client.pending(now_ns());
                }
                Poll::Ready(Some(Ok(f)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.pending
                    .finish(Some(ProxyFailure::UpstreamReset), false);
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Poll::Ready(None) => {
                this.pending.finish(None, false);
                Poll::Ready(None)
            }
            Poll::Pending => {
                while this.idle.as_mut().poll(cx).is_ready() {
                    let due = this.last_data + this.idle_for;
                    if Instant::now() < due {
                        this.idle.as_mut().reset(due);
                        continue;
                    }
                    this.pending.finish(Some(ProxyFailure::TimeoutIdle), false);
                    return Poll::Ready(Some(Err(Box::new(TapError(
                        "no data from upstream within the idle timeout; response cut",
                    )))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.pending.0.is_none() || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for ResponseTap {
    fn drop(&mut self) {
        // Dropped before the end: the client went away (or the server dropped the body of a
        // response that has none, e.g. HEAD or 204).
        let cancelled = !self.inner.is_end_stream();
        self.pending.finish(None, cancelled);
    }
}

/// The response body the proxy returns: a tapped upstream body or a small body of our own.
pub(crate) type ProxyBody = http_body_util::Either<ResponseTap, http_body_util::Full<Bytes>>;
