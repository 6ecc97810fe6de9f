//! The forwarding delay on hyper's path (`h1` observes it directly): the response tap marks the
//! client connection pending when it hands a frame over, and [`WriteStamped`] observes
//! `now − pending_since` when a write to the client socket completes. With HTTP/2 a write
//! completes the connection's oldest pending chunk. Stamps are nanoseconds in relaxed atomics.

use super::counters::ProxyCounters;
use hyper::rt::{Read, ReadBufCursor, Write};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// Nanoseconds since the process-wide base instant (never 0, which means "none").
pub(crate) fn now_ns() -> u64 {
    (base().elapsed().as_nanos() as u64).max(1)
}

/// The client connection's oldest forwarded-but-not-yet-written chunk.
#[derive(Debug)]
pub(crate) struct WriteClock {
    pending_since_ns: AtomicU64,
    stats: Arc<ProxyCounters>,
}

impl WriteClock {
    pub(crate) fn new(stats: Arc<ProxyCounters>) -> Self {
        WriteClock {
            pending_since_ns: AtomicU64::new(0),
            stats,
        }
    }

    /// Marks a chunk read from upstream at `read_ns` as handed to this connection.
    pub(crate) fn pending(&self, read_ns: u64) {
        let _ = self
            .pending_since_ns
            .compare_exchange(0, read_ns, Relaxed, Relaxed);
    }

    /// A write to the client completed (`n` bytes went out).
    fn written(&self, n: usize) {
        if n == 0 {
            return;
        }
        let t = self.pending_since_ns.swap(0, Relaxed);
        if t != 0 {
            let d = now_ns().saturating_sub(t);
            self.stats.forward_delay.observe(Duration::from_nanos(d));
        }
    }
}

/// A client connection that observes the forwarding delay when its writes complete.
pub(crate) struct WriteStamped<T> {
    inner: T,
    clock: Arc<WriteClock>,
}

impl<T> WriteStamped<T> {
    pub(crate) fn new(inner: T, clock: Arc<WriteClock>) -> Self {
        WriteStamped { inner, clock }
    }
}

impl<T: Read + Unpin> Read for WriteStamped<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for WriteStamped<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            this.clock.written(n);
        }
        r
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            this.clock.written(n);
        }
        r
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_observes_the_oldest_pending_chunk_once() {
        let stats = Arc::new(ProxyCounters::default());
        let c = WriteClock::new(stats.clone());
        let t0 = now_ns();
        c.pending(t0);
        c.pending(t0 + 1_000_000_000); // younger: ignored while the older one is pending
        c.written(1);
        c.written(1); // nothing pending: no observation
        assert_eq!(stats.forward_delay.count(), 1);
        c.pending(now_ns());
        c.written(0); // nothing went out: still pending
        c.written(1);
        assert_eq!(stats.forward_delay.count(), 2);
    }
}
