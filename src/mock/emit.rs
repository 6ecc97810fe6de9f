//! The one streaming path: a streamed completion's events are formatted and handed to the socket
//! by the engine thread (or a writer thread) at each event's due instant, one `send` for all of a
//! stream's events due together, with no channel, task wake-up or HTTP framework in between.
//! The connection task ([`drive`]) writes the response head and whatever the engine could not
//! (the socket was full), and watches the client. The body is framed as hyper frames a body of
//! unknown length ([`BodyFraming`]). Lateness is recorded when an event's bytes go to the socket.
//! The engine touches the descriptor only under the stream's lock while the task owns the
//! socket, so a closed descriptor is never written. This module does not parse HTTP, schedule
//! events, or decide response shapes (see [`super::api`]).

use super::engine::{Cmd, Emit, Sink};
use super::exposition::EngineCounters;
use super::format::Fmt;
use super::tokenize::Tokenizer;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::AtomicU32;
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::Instant;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// How a streamed body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyFraming {
    /// HTTP/1.1 chunked transfer coding; the connection stays open afterwards.
    Chunked,
    /// HTTP/1.0: the body is the bytes until the connection closes.
    UntilClose,
}

/// Sets `SO_LINGER {on, 0}` so that closing the socket sends a TCP RST.
pub(crate) fn arm_reset(fd: RawFd) {
    // SAFETY: `fd` is the connection's socket, open while its request is being served.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let _ = socket2::SockRef::from(&fd).set_linger(Some(std::time::Duration::ZERO));
}

/// How the body ended (as far as the engine is concerned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Open,
    /// `[DONE]` and the last chunk are in `pending` (or already sent).
    Done,
    /// An injected connection reset: send what is pending, then RST.
    Reset,
    /// The engine stopped (shutdown) before the stream finished: end the body, close.
    EngineGone,
}

struct State {
    fmt: Fmt,
    /// One event's SSE text, reused.
    scratch: String,
    /// Framed bytes not yet handed to the socket, and the scheduled instants of their events.
    pending: Vec<u8>,
    pending_at: Vec<Instant>,
    /// Set while the engine may write to the socket itself (attached and not draining).
    fd: Option<RawFd>,
    /// The connection task owns writing (head not sent yet, or the socket was full).
    draining: bool,
    end: End,
    client_gone: bool,
}

/// One streamed response, shared by the engine (through [`StreamSink`]) and the connection task.
pub(crate) struct Stream {
    state: Mutex<State>,
    notify: tokio::sync::Notify,
    tok: Arc<Tokenizer>,
    stats: Arc<EngineCounters>,
    engine: mpsc::Sender<Cmd>,
    id: u64,
    may_reset: bool,
    queued: AtomicU32,
    framing: BodyFraming,
}

/// The engine's handle. Dropping the last one before the stream ended (engine shutdown) tells
/// the connection to end the body.
pub(crate) struct StreamSink(pub Arc<Stream>);

impl Drop for StreamSink {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        if st.end == End::Open {
            st.end = End::EngineGone;
        }
        drop(st);
        self.0.notify.notify_one();
    }
}

impl Sink for StreamSink {
    fn emit(&self, e: Emit, flush: bool) -> bool {
        self.0.emit(e, flush)
    }
    fn queued(&self) -> &AtomicU32 {
        &self.0.queued
    }
}

/// Appends `data` as one HTTP/1.1 chunk, framed as hyper frames it.
pub(super) fn chunk(out: &mut Vec<u8>, data: &[u8]) {
    // Upper-case hex size without a temporary String (this runs once per event).
    let mut hex = [0u8; 16];
    let mut i = hex.len();
    let mut n = data.len();
    loop {
        i -= 1;
        hex[i] = b"0123456789ABCDEF"[n & 15];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&hex[i..]);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

enum Wrote {
    All,
    Blocked,
    Gone,
}

/// Hands `buf[*off..]` to the socket without blocking; advances `off`.
fn send_now(fd: RawFd, buf: &[u8], off: &mut usize) -> Wrote {
    while *off < buf.len() {
        let rest = &buf[*off..];
        // SAFETY: `fd` is the connection's socket, kept open by its task while `fd` is set in the
        // stream state (checked under the lock held by the caller); the pointer and length
        // describe a live slice.
        let r = unsafe {
            libc::send(
                fd,
                rest.as_ptr() as *const libc::c_void,
                rest.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if r > 0 {
            *off += r as usize;
            continue;
        }
        let err = std::io::Error::last_os_error();
        match err.kind() {
            std::io::ErrorKind::Interrupted => continue,
            std::io::ErrorKind::WouldBlock => return Wrote::Blocked,
            _ if r == 0 => return Wrote::Blocked,
            _ => return Wrote::Gone,
        }
    }
    Wrote::All
}

impl Stream {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        fmt: Fmt,
        tok: Arc<Tokenizer>,
        stats: Arc<EngineCounters>,
        engine: mpsc::Sender<Cmd>,
        id: u64,
        may_reset: bool,
        framing: BodyFraming,
    ) -> Arc<Stream> {
        Arc::new(Stream {
            state: Mutex::new(State {
                fmt,
                scratch: String::with_capacity(512),
                pending: Vec::new(),
                pending_at: Vec::new(),
                fd: None,
                draining: true,
                end: End::Open,
                client_gone: false,
            }),
            notify: tokio::sync::Notify::new(),
            tok,
            stats,
            engine,
            id,
            may_reset,
            queued: AtomicU32::new(0),
            framing,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock would be a bug; the state stays usable either way.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, ats: &[Instant], now: Instant) {
        for &at in ats {
            self.stats
                .lateness
                .record(now.saturating_duration_since(at));
        }
    }

    /// Engine thread: format one event and hand it to the socket now (or queue it).
    fn emit(&self, e: Emit, flush: bool) -> bool {
        let mut guard = self.lock();
        let st = &mut *guard;
        if st.client_gone {
            return false;
        }
        if st.end != End::Open {
            return true;
        }
        if matches!(e, Emit::Reset { .. }) {
            st.end = End::Reset;
            drop(guard);
            self.notify.notify_one();
            return true;
        }
        let hold = self.append(st, e);
        let mut wake = st.end != End::Open;
        if let (Some(fd), false, false, true) = (st.fd, st.draining, hold, flush) {
            match self.send_pending(st, fd) {
                Wrote::All => {}
                Wrote::Blocked => wake = true,
                Wrote::Gone => {
                    drop(guard);
                    self.notify.notify_one();
                    // On a writer thread nobody else tells the engine (it ignores a repeat).
                    let _ = self.engine.send(Cmd::Cancel(self.id));
                    return false;
                }
            }
        }
        drop(guard);
        if wake {
            self.notify.notify_one();
        }
        true
    }

    /// Formats and frames a token or end event into `pending`; true when it should wait for the
    /// event that follows it at the same instant (the end of the stream after its last token:
    /// both go out in one write).
    fn append(&self, st: &mut State, e: Emit) -> bool {
        let at = e.at();
        st.scratch.clear();
        let mut hold = false;
        match e {
            Emit::Tokens {
                choice,
                ids,
                finish,
                ..
            } => {
                st.fmt
                    .tokens(&mut st.scratch, &self.tok, choice, &ids, finish);
                // Not with a reset fault pending: its last tokens must reach the client early.
                hold = finish.is_some() && st.fmt.all_finished() && !self.may_reset;
            }
            Emit::Done { usage, .. } => {
                st.fmt.done(&mut st.scratch, &usage);
                st.end = End::Done;
            }
            Emit::Reset { .. } => {}
        }
        let data = st.scratch.as_bytes();
        match self.framing {
            BodyFraming::Chunked => chunk(&mut st.pending, data),
            BodyFraming::UntilClose => st.pending.extend_from_slice(data),
        }
        if st.end == End::Done && self.framing == BodyFraming::Chunked {
            st.pending.extend_from_slice(b"0\r\n\r\n");
        }
        st.pending_at.push(at);
        hold
    }

    /// Hands `pending` to the socket now; what is left when it is full goes to the connection
    /// task (`draining`).
    fn send_pending(&self, st: &mut State, fd: RawFd) -> Wrote {
        let now = Instant::now();
        let mut off = 0;
        let w = send_now(fd, &st.pending, &mut off);
        match w {
            Wrote::All => {
                self.record(&st.pending_at, now);
                st.pending.clear();
                st.pending_at.clear();
            }
            Wrote::Blocked => {
                st.pending.drain(..off);
                st.draining = true;
            }
            Wrote::Gone => st.client_gone = true,
        }
        w
    }

    /// The request will not be served (the client left before the stream started, or the
    /// connection failed): the engine stops producing for it.
    pub(crate) fn abandon(&self) {
        let mut st = self.lock();
        st.fd = None;
        let was_open = !st.client_gone && st.end == End::Open;
        st.client_gone = true;
        drop(st);
        if was_open {
            let _ = self.engine.send(Cmd::Cancel(self.id));
        }
    }
}

/// How a taken-over stream ended, for the connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StreamEnd {
    /// Body complete: the connection can serve its next request.
    Finished,
    /// Close the connection (client gone, or the engine stopped).
    Close,
    /// Close with a TCP reset (`SO_LINGER 0` is already set).
    Reset,
}

/// A stream that takes its connection over. Dropped, driven to its end or never driven (the
/// connection failed, the mock was dropped abruptly), it detaches the engine from the socket and
/// abandons a stream that had not ended.
pub(crate) struct Hijack {
    pub(crate) stream: Arc<Stream>,
    /// The response head to write (status line and headers).
    pub(crate) head: Vec<u8>,
    /// Close after the stream (the client asked for `connection: close`, or spoke HTTP/1.0).
    pub(crate) close_after: bool,
}

impl Drop for Hijack {
    fn drop(&mut self) {
        self.stream.abandon();
    }
}

/// Connection task: writes the head and the events due so far, lets the engine write directly,
/// drains when the socket is full, watches for the client going away (bytes it sends meanwhile,
/// e.g. a pipelined request, are appended to `read_ahead`, at most 1 MiB, and `read_ahead_rx` is
/// set to when the latest of them reached the socket, see [`crate::sys::rxstamp`]), and says how the
/// stream ended. The socket stays owned by the caller, and the engine no longer touches it once
/// this returns.
pub(crate) async fn drive(
    mut h: Hijack,
    stream: &mut TcpStream,
    read_ahead: &mut Vec<u8>,
    read_ahead_rx: &mut Option<Instant>,
) -> StreamEnd {
    let fd = stream.as_raw_fd();
    let mut head = Some(std::mem::take(&mut h.head));
    let s = &*h.stream;
    s.lock().fd = Some(fd);
    loop {
        let write = {
            let mut st = s.lock();
            if st.client_gone {
                return StreamEnd::Close;
            }
            if head.is_some() || (st.draining && !st.pending.is_empty()) {
                let mut buf = head.take().unwrap_or_default();
                buf.extend_from_slice(&st.pending);
                st.pending.clear();
                Some((buf, std::mem::take(&mut st.pending_at)))
            } else {
                // Everything handed over: the engine writes the next events itself.
                st.draining = false;
                match st.end {
                    End::Open => None,
                    End::Done => return StreamEnd::Finished,
                    End::Reset => {
                        arm_reset(fd);
                        return StreamEnd::Reset;
                    }
                    End::EngineGone => break,
                }
            }
        };
        if let Some((buf, ats)) = write {
            if stream.write_all(&buf).await.is_err() {
                return StreamEnd::Close; // dropping `h` abandons the request
            }
            s.record(&ats, Instant::now());
            continue;
        }
        let reading = read_ahead.len() < 1 << 20;
        tokio::select! {
            _ = s.notify.notified() => {}
            r = stream.readable(), if reading => {
                if r.is_err() || !read_more(stream, read_ahead, read_ahead_rx) {
                    return StreamEnd::Close;
                }
            }
        }
    }
    // The engine stopped before the stream finished: end the body, then close.
    if s.framing == BodyFraming::Chunked {
        let _ = stream.write_all(b"0\r\n\r\n").await;
    }
    StreamEnd::Close
}

/// Appends what the client sent meanwhile to `buf` (and when it arrived to `rx`); false when
/// the client closed its side or the socket failed.
fn read_more(stream: &TcpStream, buf: &mut Vec<u8>, rx: &mut Option<Instant>) -> bool {
    let mut tmp = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    match crate::sys::rxstamp::try_recv(stream, stream.as_raw_fd(), &mut tmp) {
        Ok((0, _)) => false,
        Ok((n, at)) => {
            // SAFETY: the kernel wrote the first `n` bytes.
            buf.extend(tmp[..n].iter().map(|b| unsafe { b.assume_init() }));
            *rx = Some(at);
            true
        }
        Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_framed_as_hyper_frames_them() {
        // Upper-case hex sizes (242 is F2), as hyper writes them.
        for n in [1usize, 9, 10, 15, 16, 242, 255, 256, 4096, 65_535, 1 << 20] {
            let mut v = Vec::new();
            let data = vec![b'y'; n];
            chunk(&mut v, &data);
            let mut want = format!("{n:X}\r\n").into_bytes();
            want.extend_from_slice(&data);
            want.extend_from_slice(b"\r\n");
            assert_eq!(v, want, "size {n}");
        }
    }
}
