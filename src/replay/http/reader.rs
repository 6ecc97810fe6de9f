//! Reader threads for streamed response bodies: each runs its own `epoll` loop (through mio)
//! over the sockets handed to it, and reads and measures every event on that thread.
//!
//! Why: at 1,000 streams × 100 events/s, reading each body in its request's tokio task costs a
//! reactor wake-up, a task hand-over between the runtime's workers (futex) and a poll per event,
//! and on a small machine that CPU is taken from the server under test. Here a body is a [`Job`]: a socket plus a synchronous state machine. The
//! request's task parses the response head, then detaches the socket from the runtime and
//! submits the job; the reader thread registers it, reads it when it is readable, asks it for
//! its timeouts every [`TICK`], and when the job says it is over, removes the socket and calls
//! [`Job::done`], which hands the result back to the task (a oneshot channel).
//!
//! A job sits on one reader for its whole body (the reader with the fewest jobs when it was
//! submitted). Nothing here parses HTTP or knows about samples: that is the job's business.

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// While fewer bodies than this are being read in all, the first reader takes every new one:
/// one thread reads every socket, so one wake-up reads many of them (each wake-up of a further
/// thread costs two context switches). One reader keeps up with 256 streams of 100 events/s on
/// a quarter of a core. From this many on, a new body goes to the reader with the fewest.
const FILL: usize = 256;

/// How often every job is asked whether one of its timeouts passed (the precision of body
/// timeouts, which are seconds long).
pub(crate) const TICK: Duration = Duration::from_millis(20);

const WAKE: Token = Token(0);

/// A socket being read on a reader thread.
pub(crate) trait Job: Send {
    /// The socket (non-blocking); the reader registers it for readability, edge-triggered.
    fn fd(&self) -> RawFd;
    /// The socket became readable (or was closed or failed): read until the socket is drained
    /// or the job is over. Returns true when it is over.
    fn readable(&mut self) -> bool;
    /// Called at least every [`TICK`] with the current instant: true when a timeout ended it.
    fn tick(&mut self, now: Instant) -> bool;
    /// The reader could not take the socket (registration failed): the job is over.
    fn failed(&mut self, why: String);
    /// The job is over and its socket no longer registered: hand the result on.
    fn done(self: Box<Self>);
}

struct Shard {
    waker: Waker,
    incoming: Mutex<Vec<Box<dyn Job>>>,
    /// Jobs submitted to this reader and not yet done.
    load: AtomicUsize,
    stop: AtomicBool,
    /// The thread has ended (stopped, or a job panicked): it takes no more jobs.
    dead: AtomicBool,
}

/// Marks the shard dead when its thread ends, however it ends, and drops the jobs still queued
/// for it (their tasks see the channel closed instead of waiting forever).
struct Exit<'a>(&'a Shard);

impl Drop for Exit<'_> {
    fn drop(&mut self) {
        // Under the queue's lock, so that `submit` never queues a job after this.
        let mut q = self.0.incoming.lock().unwrap_or_else(|p| p.into_inner());
        self.0.dead.store(true, Ordering::Relaxed);
        q.clear();
    }
}

/// A set of reader threads; dropping it stops them (jobs still running are dropped, so their
/// tasks see the channel closed).
pub(crate) struct Readers {
    batch: Duration,
    /// [`FILL`] (tests set less).
    fill: usize,
    shards: Vec<Arc<Shard>>,
    threads: Vec<JoinHandle<()>>,
}

impl Readers {
    /// Starts `n` (≥ 1) reader threads. `batch`: after a round of reads, a thread waits until
    /// this long after the round began before it looks for readable sockets again, so that one
    /// wake-up reads many (only when every read carries the kernel's arrival stamp: two chunks
    /// of one stream that arrive within `batch` are read together and get the later stamp).
    pub(crate) fn start(n: usize, batch: Duration) -> std::io::Result<Readers> {
        let mut shards = Vec::new();
        let mut threads = Vec::new();
        for i in 0..n.max(1) {
            let poll = Poll::new()?;
            let shard = Arc::new(Shard {
                waker: Waker::new(poll.registry(), WAKE)?,
                incoming: Mutex::new(Vec::new()),
                load: AtomicUsize::new(0),
                stop: AtomicBool::new(false),
                dead: AtomicBool::new(false),
            });
            let s = shard.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("retrace-read-{i}"))
                    .spawn(move || run(poll, &s, batch))?,
            );
            shards.push(shard);
        }
        Ok(Readers {
            batch,
            fill: FILL,
            shards,
            threads,
        })
    }

    /// Number of reader threads.
    pub(crate) fn len(&self) -> usize {
        self.shards.len()
    }

    /// The batch window the threads keep between rounds of reads.
    pub(crate) fn batch(&self) -> Duration {
        self.batch
    }

    /// Hands `job` to the first reader while all readers hold fewer than [`FILL`] jobs together,
    /// else to the reader with the fewest. With no reader thread left (only after a bug made one
    /// panic) the job is dropped: its task sees the channel closed.
    pub(crate) fn submit(&self, job: Box<dyn Job>) {
        let Some(shard) = self.pick() else {
            return;
        };
        {
            let mut q = shard.incoming.lock().unwrap_or_else(|p| p.into_inner());
            if shard.dead.load(Ordering::Relaxed) {
                return;
            }
            shard.load.fetch_add(1, Ordering::Relaxed);
            q.push(job);
        }
        if let Err(e) = shard.waker.wake() {
            // Not expected (an eventfd write); the job is still picked up at the next event.
            tracing::warn!("waking a reader thread: {e}");
        }
    }
}

impl Readers {
    fn pick(&self) -> Option<&Arc<Shard>> {
        let live = || {
            self.shards
                .iter()
                .filter(|s| !s.dead.load(Ordering::Relaxed))
        };
        let load = |s: &&Arc<Shard>| s.load.load(Ordering::Relaxed);
        if live().map(|s| load(&s)).sum::<usize>() < self.fill {
            live().next()
        } else {
            live().min_by_key(load)
        }
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        for s in &self.shards {
            s.stop.store(true, Ordering::Relaxed);
            let _ = s.waker.wake();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One reader thread's loop.
fn run(mut poll: Poll, shard: &Shard, batch: Duration) {
    let _exit = Exit(shard);
    let mut events = Events::with_capacity(256);
    // Jobs by slot (token = slot + 1), and free slots.
    let mut jobs: Vec<Option<Box<dyn Job>>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut live = 0usize;
    let mut next_tick = Instant::now() + TICK;
    // When the latest round of reads began.
    let mut round = Instant::now();
    let finish = |poll: &Poll, job: Box<dyn Job>| {
        let fd = job.fd();
        let _ = poll.registry().deregister(&mut SourceFd(&fd));
        shard.load.fetch_sub(1, Ordering::Relaxed);
        job.done();
    };
    loop {
        if !batch.is_zero() && live > 0 {
            if let Some(left) = (round + batch).checked_duration_since(Instant::now()) {
                std::thread::sleep(left);
            }
        }
        let timeout = if live == 0 {
            None
        } else {
            Some(next_tick.saturating_duration_since(Instant::now()))
        };
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::error!("reader thread: epoll_wait: {e}");
                std::thread::sleep(TICK);
            }
            continue;
        }
        round = Instant::now();
        for ev in events.iter() {
            if ev.token() == WAKE {
                continue;
            }
            let slot = ev.token().0 - 1;
            let over = match jobs.get_mut(slot).and_then(|j| j.as_mut()) {
                Some(job) => job.readable(),
                None => false,
            };
            if over {
                if let Some(job) = jobs[slot].take() {
                    free.push(slot);
                    live -= 1;
                    finish(&poll, job);
                }
            }
        }
        if shard.stop.load(Ordering::Relaxed) {
            return;
        }
        // Never wait for the queue's lock: a submitting task preempted while holding it would
        // stall every read on this thread. A busy lock is retried at the next round (the
        // submitter wakes this thread after releasing it, so no job waits for the tick).
        let new = match shard.incoming.try_lock() {
            Ok(mut q) => std::mem::take(&mut *q),
            Err(std::sync::TryLockError::Poisoned(p)) => std::mem::take(&mut *p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => Vec::new(),
        };
        for mut job in new {
            let slot = free.pop().unwrap_or_else(|| {
                jobs.push(None);
                jobs.len() - 1
            });
            let fd = job.fd();
            match poll
                .registry()
                .register(&mut SourceFd(&fd), Token(slot + 1), Interest::READABLE)
            {
                Ok(()) => {
                    jobs[slot] = Some(job);
                    live += 1;
                }
                Err(e) => {
                    free.push(slot);
                    job.failed(format!("registering the socket with a reader thread: {e}"));
                    shard.load.fetch_sub(1, Ordering::Relaxed);
                    job.done();
                }
            }
        }
        let now = Instant::now();
        if now >= next_tick {
            next_tick = now + TICK;
            for (slot, entry) in jobs.iter_mut().enumerate() {
                if entry.as_mut().is_some_and(|j| j.tick(now)) {
                    if let Some(job) = entry.take() {
                        free.push(slot);
                        live -= 1;
                        finish(&poll, job);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::sync::mpsc;

    /// Reads a socket until EOF or `limit` bytes; reports what it read and why it ended.
    struct Echo {
        sock: std::net::TcpStream,
        got: Vec<u8>,
        /// How many bytes it has read so far (for the test to wait on).
        seen: Arc<AtomicUsize>,
        /// The size of each read.
        reads: Vec<usize>,
        deadline: Instant,
        end: Option<String>,
        tx: mpsc::Sender<Ended>,
    }

    /// What an [`Echo`] read, its reads' sizes and why it ended.
    type Ended = (Vec<u8>, Vec<usize>, String);

    impl Job for Echo {
        fn fd(&self) -> RawFd {
            self.sock.as_raw_fd()
        }
        fn readable(&mut self) -> bool {
            let mut buf = [0u8; 4];
            loop {
                match self.sock.read(&mut buf) {
                    Ok(0) => {
                        self.end = Some("eof".into());
                        return true;
                    }
                    Ok(n) => {
                        self.got.extend_from_slice(&buf[..n]);
                        self.reads.push(n);
                        self.seen.store(self.got.len(), Ordering::SeqCst);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
                    Err(e) => {
                        self.end = Some(e.to_string());
                        return true;
                    }
                }
            }
        }
        fn tick(&mut self, now: Instant) -> bool {
            if now >= self.deadline {
                self.end = Some("timeout".into());
                return true;
            }
            false
        }
        fn failed(&mut self, why: String) {
            self.end = Some(why);
        }
        fn done(self: Box<Self>) {
            let _ = self
                .tx
                .send((self.got, self.reads, self.end.unwrap_or_default()));
        }
    }

    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        c.set_nonblocking(true).unwrap();
        (c, s)
    }

    fn job(sock: std::net::TcpStream, within: Duration) -> (Box<Echo>, mpsc::Receiver<Ended>) {
        let (tx, rx) = mpsc::channel();
        let j = Box::new(Echo {
            sock,
            got: Vec::new(),
            seen: Arc::new(AtomicUsize::new(0)),
            reads: Vec::new(),
            deadline: Instant::now() + within,
            end: None,
            tx,
        });
        (j, rx)
    }

    /// Bytes written before and after the hand-over, in pieces longer than one read, all
    /// arrive; the server's close ends the job; below the fill in all the first reader takes
    /// every job, from it on the least loaded does.
    #[test]
    fn jobs_read_to_the_end_on_their_threads() {
        let mut readers = Readers::start(2, Duration::ZERO).unwrap();
        readers.fill = 6;
        let mut peers = Vec::new();
        let mut rxs = Vec::new();
        let loads = |r: &Readers| -> Vec<usize> {
            r.shards
                .iter()
                .map(|s| s.load.load(Ordering::Relaxed))
                .collect()
        };
        for i in 0..20u8 {
            let (c, mut s) = pair();
            s.write_all(&[i; 3]).unwrap(); // before the job is submitted
            let (j, rx) = job(c, Duration::from_secs(30));
            readers.submit(j);
            peers.push(s);
            rxs.push(rx);
            if i == 5 {
                assert_eq!(
                    loads(&readers),
                    vec![6, 0],
                    "below the fill one reader takes all"
                );
            }
        }
        assert_eq!(
            loads(&readers),
            vec![10, 10],
            "from the fill on, the least loaded reader takes each"
        );
        for (i, s) in peers.iter_mut().enumerate() {
            s.write_all(&[i as u8; 7]).unwrap();
        }
        drop(peers);
        for (i, rx) in rxs.into_iter().enumerate() {
            let (got, _, end) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(got, vec![i as u8; 10]);
            assert_eq!(end, "eof");
        }
        for s in &readers.shards {
            assert_eq!(s.load.load(Ordering::Relaxed), 0);
        }
    }

    /// A silent socket is ended by its own timeout, within a few ticks.
    #[test]
    fn a_silent_job_times_out() {
        let readers = Readers::start(1, Duration::ZERO).unwrap();
        let (c, _s) = pair();
        let t = Instant::now();
        let (j, rx) = job(c, Duration::from_millis(50));
        readers.submit(j);
        let (got, _, end) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(got.is_empty());
        assert_eq!(end, "timeout");
        assert!(t.elapsed() >= Duration::from_millis(50));
    }

    /// Waits (bounded) until `seen` reaches `n`.
    fn wait_for(seen: &AtomicUsize, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.load(Ordering::SeqCst) < n {
            assert!(Instant::now() < deadline, "the reader never read {n} bytes");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// With a batch window, bytes that arrive after a round of reads are read in a later round
    /// (not lost, not merged into the earlier read), and all of a job's bytes are read.
    #[test]
    fn a_batch_window_keeps_reads_apart_that_arrive_apart() {
        let readers = Readers::start(1, Duration::from_millis(20)).unwrap();
        let (c, mut s) = pair();
        let (j, rx) = job(c, Duration::from_secs(30));
        let seen = j.seen.clone();
        readers.submit(j);
        s.write_all(b"abc").unwrap();
        wait_for(&seen, 3);
        s.write_all(b"defgh").unwrap();
        wait_for(&seen, 8);
        drop(s);
        let (got, reads, end) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(got, b"abcdefgh");
        // Echo reads 4 bytes at a time.
        assert_eq!(reads, vec![3, 4, 1]);
        assert_eq!(end, "eof");
    }

    /// A job that panics (a bug) ends its thread, not the process: its own and every later
    /// job's receiver sees the end instead of waiting forever.
    #[test]
    fn a_panicking_job_ends_its_reader_without_hanging_anyone() {
        struct Boom(std::net::TcpStream, mpsc::Sender<()>);
        impl Job for Boom {
            fn fd(&self) -> RawFd {
                self.0.as_raw_fd()
            }
            fn readable(&mut self) -> bool {
                panic!("a bug in a job");
            }
            fn tick(&mut self, _: Instant) -> bool {
                false
            }
            fn failed(&mut self, _: String) {}
            fn done(self: Box<Self>) {
                let _ = self.1.send(());
            }
        }
        let readers = Readers::start(1, Duration::ZERO).unwrap();
        let (c, mut s) = pair();
        let (tx, rx) = mpsc::channel();
        readers.submit(Box::new(Boom(c, tx)));
        s.write_all(b"x").unwrap();
        assert_ends(&rx);
        let (c2, _s2) = pair();
        let (j, rx2) = job(c2, Duration::from_secs(30));
        readers.submit(j);
        assert_ends(&rx2);
    }

    /// The job was dropped without a result: its receiver sees the channel closed at once, not
    /// after a timeout (which a hang would also give).
    fn assert_ends<T: std::fmt::Debug>(rx: &mpsc::Receiver<T>) {
        let t = Instant::now();
        let r = rx.recv_timeout(Duration::from_secs(30));
        assert!(
            matches!(r, Err(mpsc::RecvTimeoutError::Disconnected)),
            "{r:?} after {:?}",
            t.elapsed()
        );
    }

    /// Dropping the readers drops the jobs still running: their receivers see the end.
    #[test]
    fn stopping_drops_running_jobs() {
        let readers = Readers::start(1, Duration::ZERO).unwrap();
        let (c, _s) = pair();
        let (j, rx) = job(c, Duration::from_secs(30));
        readers.submit(j);
        drop(readers);
        assert_ends(&rx);
    }
}
