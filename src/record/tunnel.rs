//! The tunnel after a `101 Switching Protocols` (docs/record.md, "Protocol switches"): bytes
//! copied both ways untouched, each direction writing what it read before reading again, an end
//! of stream passed on as a half-close. It ends when both sides have closed, either fails, or the
//! drain cuts it; no idle or total timeout. [`record`] turns its end into the exchange's record.

use super::buf::Buf;
use super::counters::ProxyCounters;
use super::failure::ProxyFailure;
use super::tap::Pending;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::time::Instant;

/// Bytes each direction reads at once. The buffer exists only while bytes are on their way: a
/// direction waiting for its reader frees it, so an idle tunnel holds no buffers.
const TUNNEL_BUF: usize = 16 << 10;

/// How a tunnel ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum How {
    /// Both sides closed their sending side.
    Closed,
    /// Reading from or writing to the client failed (a reset, usually).
    ClientFailed,
    /// Reading from or writing to the upstream failed.
    UpstreamFailed,
    /// The proxy drained and cut the tunnel.
    Drained,
}

/// Which socket of a direction failed.
enum Failed {
    Reader,
    Writer,
}

/// One direction: bytes read from one socket, written to the other.
struct Dir {
    /// Bytes read and not yet written.
    buf: Buf,
    eof: bool,
    shut: bool,
    need_flush: bool,
}

impl Dir {
    /// `pending` holds bytes already read (before the switch) that go out first.
    fn new(pending: Buf) -> Self {
        Dir {
            buf: pending,
            eof: false,
            shut: false,
            need_flush: false,
        }
    }

    /// Moves bytes until `r` ends and `w` is shut down (`Ready(Ok)`), or a socket fails.
    fn poll<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        r: &mut R,
        w: &mut W,
        counter: &AtomicU64,
    ) -> Poll<Result<(), Failed>>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        loop {
            if self.buf.len() > 0 {
                match Pin::new(&mut *w).poll_write(cx, self.buf.data()) {
                    Poll::Ready(Ok(n)) if n > 0 => {
                        self.buf.consume(n);
                        counter.fetch_add(n as u64, Relaxed);
                        self.need_flush = true;
                        continue;
                    }
                    Poll::Ready(_) => return Poll::Ready(Err(Failed::Writer)),
                    Poll::Pending => return Poll::Pending,
                }
            }
            if !self.eof {
                // The buffer is empty here.
                if self.buf.v.capacity() < TUNNEL_BUF {
                    self.buf = Buf::new(Vec::new(), TUNNEL_BUF);
                }
                match self.buf.poll_read_from(r, cx) {
                    Poll::Ready(Ok(n)) => {
                        self.eof = n == 0;
                        continue;
                    }
                    Poll::Ready(Err(_)) => return Poll::Ready(Err(Failed::Reader)),
                    Poll::Pending => {
                        // Idle: give the buffer back (an open, quiet WebSocket costs none).
                        self.buf = Buf::default();
                        // Nothing more to send for now: make sure what was written goes out
                        // (a TLS stream may hold it).
                        if self.need_flush {
                            match Pin::new(&mut *w).poll_flush(cx) {
                                Poll::Ready(Ok(())) => self.need_flush = false,
                                Poll::Ready(Err(_)) => return Poll::Ready(Err(Failed::Writer)),
                                Poll::Pending => {}
                            }
                        }
                        return Poll::Pending;
                    }
                }
            }
            if !self.shut {
                // The reader ended: pass the half-close on (flushing first).
                match Pin::new(&mut *w).poll_shutdown(cx) {
                    Poll::Ready(Ok(())) => self.shut = true,
                    Poll::Ready(Err(_)) => return Poll::Ready(Err(Failed::Writer)),
                    Poll::Pending => return Poll::Pending,
                }
            }
            return Poll::Ready(Ok(()));
        }
    }
}

/// Counts a tunnel in `tunnels_open` while it lives (also when its task is dropped).
struct OpenGauge<'a>(&'a ProxyCounters);

impl<'a> OpenGauge<'a> {
    fn new(stats: &'a ProxyCounters) -> Self {
        stats.tunnels_open.fetch_add(1, Relaxed);
        OpenGauge(stats)
    }
}

impl Drop for OpenGauge<'_> {
    fn drop(&mut self) {
        self.0.tunnels_open.fetch_sub(1, Relaxed);
    }
}

/// Copies bytes between `client` and `upstream` until the tunnel ends. `to_upstream` and
/// `to_client` are bytes read before the switch that belong to the tunnel (a client that did
/// not wait for the 101, a frame the upstream sent with it). `drain` carries the instant a
/// draining proxy cuts tunnels (`None` while serving).
pub(crate) async fn run<C, U>(
    client: &mut C,
    upstream: &mut U,
    to_upstream: Buf,
    to_client: Buf,
    drain: &mut watch::Receiver<Option<Instant>>,
    stats: &ProxyCounters,
) -> How
where
    C: AsyncRead + AsyncWrite + Unpin + ?Sized,
    U: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    stats.upgrades.fetch_add(1, Relaxed);
    let _open = OpenGauge::new(stats);
    let mut up = Dir::new(to_upstream);
    let mut down = Dir::new(to_client);
    let mut up_done = false;
    let mut down_done = false;
    let copy = poll_fn(|cx| {
        if !up_done {
            match up.poll(cx, client, upstream, &stats.tunnel_bytes_to_upstream) {
                Poll::Ready(Ok(())) => up_done = true,
                Poll::Ready(Err(Failed::Reader)) => return Poll::Ready(How::ClientFailed),
                Poll::Ready(Err(Failed::Writer)) => return Poll::Ready(How::UpstreamFailed),
                Poll::Pending => {}
            }
        }
        if !down_done {
            match down.poll(cx, upstream, client, &stats.tunnel_bytes_to_client) {
                Poll::Ready(Ok(())) => down_done = true,
                Poll::Ready(Err(Failed::Reader)) => return Poll::Ready(How::UpstreamFailed),
                Poll::Ready(Err(Failed::Writer)) => return Poll::Ready(How::ClientFailed),
                Poll::Pending => {}
            }
        }
        if up_done && down_done {
            Poll::Ready(How::Closed)
        } else {
            Poll::Pending
        }
    });
    let mut copy = std::pin::pin!(copy);
    let mut watching = true;
    loop {
        let cut_at = *drain.borrow_and_update();
        if let Some(t) = cut_at {
            tokio::select! {
                how = &mut copy => return how,
                _ = tokio::time::sleep_until(t) => return How::Drained,
            }
        }
        tokio::select! {
            how = &mut copy => return how,
            r = drain.changed(), if watching => watching = r.is_ok(),
        }
    }
}

/// Finishes an upgraded exchange's record: its end is the tunnel's end; a failed upstream is
/// `upstream_reset`, a failed client a cancellation, a drain cut [`ProxyFailure::DrainDeadline`] (not counted as
/// an upstream error). Status and header time were noted when the 101 arrived.
pub(crate) fn record(pending: Pending, how: How) {
    match how {
        How::Closed => pending.end(None, false),
        How::ClientFailed => pending.end(None, true),
        How::UpstreamFailed => pending.end(Some(ProxyFailure::UpstreamReset), false),
        How::Drained => pending.end(Some(ProxyFailure::DrainDeadline), false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const T: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn bytes_flow_both_ways_and_half_close_is_passed_on() {
        let stats = ProxyCounters::default();
        let (mut client, mut proxy_c) = tokio::io::duplex(64);
        let (mut proxy_u, mut upstream) = tokio::io::duplex(64);
        let mut no_drain = watch::channel(None).1;
        let run = run(
            &mut proxy_c,
            &mut proxy_u,
            Buf::new(b"early".to_vec(), 0),
            Buf::new(b"hello".to_vec(), 0),
            &mut no_drain,
            &stats,
        );
        let peers = async {
            let mut b = [0u8; 5];
            client.read_exact(&mut b).await.unwrap();
            assert_eq!(&b, b"hello");
            upstream.read_exact(&mut b).await.unwrap();
            assert_eq!(&b, b"early");
            // More than one buffer's worth through small pipes, both ways at once.
            let big: Vec<u8> = (0..100_000u32).map(|k| k as u8).collect();
            let (mut cr, mut cw) = tokio::io::split(client);
            let (mut ur, mut uw) = tokio::io::split(upstream);
            let send = async {
                cw.write_all(&big).await.unwrap();
                // The client is done sending: the upstream sees an end of stream...
                cw.shutdown().await.unwrap();
            };
            let echo = async {
                let mut got = Vec::new();
                ur.read_to_end(&mut got).await.unwrap();
                assert_eq!(got.len(), big.len());
                // ...and can still answer afterwards.
                uw.write_all(&got[..1000]).await.unwrap();
                uw.shutdown().await.unwrap();
            };
            let recv = async {
                let mut got = Vec::new();
                cr.read_to_end(&mut got).await.unwrap();
                got
            };
            let ((), (), got) = tokio::join!(send, echo, recv);
            assert_eq!(got, big[..1000]);
        };
        let (how, ()) = tokio::time::timeout(T, async { tokio::join!(run, peers) })
            .await
            .expect("the tunnel ends when both sides closed");
        assert_eq!(how, How::Closed);
        assert_eq!(stats.upgrades.load(Relaxed), 1);
        assert_eq!(stats.tunnels_open.load(Relaxed), 0);
        assert_eq!(stats.tunnel_bytes_to_upstream.load(Relaxed), 100_005);
        assert_eq!(stats.tunnel_bytes_to_client.load(Relaxed), 1005);
    }

    #[tokio::test]
    async fn a_vanished_upstream_fails_the_tunnel_and_a_drain_cuts_it() {
        let stats = ProxyCounters::default();
        let (_client, mut proxy_c) = tokio::io::duplex(64);
        let (mut proxy_u, upstream) = tokio::io::duplex(64);
        drop(upstream);
        // Writing the early bytes to a dropped pipe fails.
        let mut no_drain = watch::channel(None).1;
        let early = Buf::new(b"x".to_vec(), 0);
        let tunnel = run(
            &mut proxy_c,
            &mut proxy_u,
            early,
            Buf::default(),
            &mut no_drain,
            &stats,
        );
        let how = tokio::time::timeout(T, tunnel).await.unwrap();
        assert_eq!(how, How::UpstreamFailed);
        assert_eq!(stats.tunnel_bytes_to_upstream.load(Relaxed), 0);

        let (mut client, mut proxy_c) = tokio::io::duplex(64);
        let (mut proxy_u, mut upstream) = tokio::io::duplex(64);
        let (tx, mut rx) = watch::channel(None);
        let run = run(
            &mut proxy_c,
            &mut proxy_u,
            Buf::default(),
            Buf::default(),
            &mut rx,
            &stats,
        );
        let peers = async {
            client.write_all(b"ping").await.unwrap();
            let mut b = [0u8; 4];
            upstream.read_exact(&mut b).await.unwrap();
            // Draining: the tunnel still works until the cut.
            tx.send_replace(Some(Instant::now() + Duration::from_millis(200)));
            upstream.write_all(b"pong").await.unwrap();
            client.read_exact(&mut b).await.unwrap();
            assert_eq!(&b, b"pong");
            (client, upstream)
        };
        let (how, _keep) = tokio::time::timeout(T, async { tokio::join!(run, peers) })
            .await
            .expect("a drain cuts the tunnel");
        assert_eq!(how, How::Drained);
        assert_eq!(stats.tunnel_bytes_to_upstream.load(Relaxed), 4);
        assert_eq!(stats.tunnel_bytes_to_client.load(Relaxed), 4);
        assert_eq!(stats.tunnels_open.load(Relaxed), 0);
    }
}
