//! The simulated engine's emission side: a thread that runs the scheduler ([`super::sched`])
//! in real time and hands each token event to its response at its due instant, applying the
//! request's stall and reset faults on the way, and keeps the engine's counters ([`super::prom`]).
//!
//! Events wait for their deadline: the thread sleeps (1 ns timer slack) until the next one,
//! then hands every due event to its response's [`Sink`]: a stream's sink formats the event and
//! writes it to the socket ([`super::stream`]), on this thread when at most `DIRECT_MAX` events
//! are due in this wake-up, else on `WRITERS` writer threads in parallel (a response stays on one writer while it has events queued there, so its
//! events keep their order). Hand-overs are at least `coalesce` apart, so a burst of close
//! deadlines costs one wake-up and no event is more than `coalesce` late on the engine's side.
//! A request reaches the scheduler `request_overhead_ms` after it arrived (front-end latency,
//! cost-model mode). The response measures lateness when it hands the bytes to the socket. This
//! module does not format JSON or touch sockets.

use super::cache::IdMap;
use super::faults::FaultPlan;
use super::prom::Stats;
use super::sched::{Event, SchedConfig, Scheduler};
pub use super::sched::{Finish, SeqIn};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Engine knobs (derived from `MockConfig`).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub sched: SchedConfig,
    /// Run the engine thread under SCHED_FIFO (see [`crate::thread_timing::realtime`]).
    pub realtime: bool,
    /// Minimum gap between two hand-overs (batches events due close together).
    pub coalesce: Duration,
}

/// Threads that call the sinks for large bursts (write streams to their sockets): they spread
/// the socket work over cores (and over CPU shares on a busy machine); each response always goes
/// through the same one.
const WRITERS: usize = 2;

/// The engine's own timings of one request (vLLM's per-request `metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timing {
    pub queue_ms: f64,
    pub ttft_ms: f64,
    pub generation_ms: f64,
    pub mean_itl_ms: f64,
    pub tokens_per_second: f64,
}

/// What the engine sends to a response, each at an exact instant.
#[derive(Debug)]
pub enum Emit {
    Tokens {
        at: Instant,
        choice: u32,
        ids: Vec<u32>,
        finish: Option<Finish>,
    },
    /// All choices finished; follows the last `Tokens`.
    Done {
        at: Instant,
        prompt_tokens: u64,
        completion_tokens: u64,
        timing: Timing,
    },
    /// Fault: reset the connection now.
    Reset { at: Instant },
}

impl Emit {
    pub fn at(&self) -> Instant {
        match self {
            Emit::Tokens { at, .. } | Emit::Done { at, .. } | Emit::Reset { at } => *at,
        }
    }
}

/// A request handed to the engine.
pub struct Submit {
    pub id: u64,
    pub arrival: Instant,
    pub seqs: Vec<SeqIn>,
    pub faults: FaultPlan,
    pub sink: Arc<dyn Sink>,
}

/// A response that takes each event at its due instant, on the engine thread or a writer thread
/// (a stream, `super::stream`, formats it and hands its bytes to the socket at once).
pub trait Sink: Send + Sync {
    /// Takes one event; false when the client is gone (the engine then aborts the request; a
    /// sink called on a writer thread also sends `Cmd::Cancel` itself). `flush: false` when
    /// another event of the same response follows in the same batch: the bytes are queued and
    /// go out with that one, in one write.
    fn emit(&self, e: Emit, flush: bool) -> bool;
    /// The request's id ([`Submit::id`]): shards responses over the writer threads (so that one
    /// response's events stay in order) and names the request to abort when the client is gone.
    fn key(&self) -> u64;
    /// Events of this response handed to a writer thread and not yet taken by it: the engine
    /// writes an event itself only when this is 0, so a response's events stay in order.
    fn queued(&self) -> &std::sync::atomic::AtomicU32;
}

/// At most this many due events per hand-over are written by the engine thread itself; a larger
/// burst (the engine fell behind, or a cost-model step ended for many sequences) goes to the
/// writer threads, which write in parallel.
const DIRECT_MAX: usize = 32;

/// Sink events (with the sink's key) in hand-over order.
type SinkBatch = Vec<(u64, Arc<dyn Sink>, Emit)>;

/// Scratch for [`flush_marks`].
#[derive(Default)]
struct Marks {
    last: IdMap<usize>,
    flush: Vec<bool>,
}

/// `m.flush[i]`: event `i` is its response's last one in `batch` (its write carries the others).
fn flush_marks(batch: &SinkBatch, m: &mut Marks) {
    m.flush.clear();
    m.last.clear();
    for (i, (k, _, _)) in batch.iter().enumerate() {
        m.last.insert(*k, i);
    }
    for (i, (k, _, _)) in batch.iter().enumerate() {
        m.flush.push(m.last.get(k) == Some(&i));
    }
}

/// A writer thread: takes everything queued for it (a backlog merges, so that each response's
/// overdue events go out in one write) and hands it to the sinks.
fn writer_loop(rx: mpsc::Receiver<SinkBatch>) {
    let mut m = Marks::default();
    while let Ok(mut batch) = rx.recv() {
        while let Ok(more) = rx.try_recv() {
            batch.extend(more);
        }
        flush_marks(&batch, &mut m);
        for (i, (_, sink, e)) in batch.into_iter().enumerate() {
            sink.emit(e, m.flush[i]);
            sink.queued().fetch_sub(1, Relaxed);
        }
    }
}

#[derive(Debug)]
pub enum Cmd {
    Cancel(u64),
    Shutdown,
    /// Look at the [`Inbox`] now.
    Wake,
}

/// The engine thread has ended (the mock is shutting down).
#[derive(Debug, thiserror::Error)]
#[error("the engine has stopped")]
pub struct EngineGone;

/// New requests handed to the engine without waking its thread when it will look anyway before
/// the request's first event can be due: a burst of C arrivals costs the engine thread one
/// wake-up instead of C (each a futex wake and a context switch competing with the HTTP threads
/// for the CPU). The engine publishes when it next looks (`Inbox::wake_at`); a request whose
/// first event may be due sooner (`arrival + lead`) wakes it. `lead` is the fixed TTFT, or the
/// front-end latency in cost-model mode (0: every request arriving while the engine sleeps
/// wakes it).
pub struct Inbox {
    queue: Mutex<Vec<Submit>>,
    /// ns after `base` at which the engine will next drain the queue; 0 while it is awake,
    /// `u64::MAX` while it waits for a command.
    wake_at: AtomicU64,
    base: Instant,
    lead: Duration,
}

impl Inbox {
    pub fn new(lead: Duration) -> Inbox {
        Inbox {
            queue: Mutex::new(Vec::new()),
            wake_at: AtomicU64::new(0),
            base: Instant::now(),
            lead,
        }
    }

    /// The earliest instant a request's first event could be due, for a request arriving at
    /// `arrival`.
    pub fn lead(cfg: &SchedConfig) -> Duration {
        match cfg.fixed {
            Some((ttft, _)) => ttft,
            None => Duration::from_secs_f64(cfg.cost.request_overhead_ms.max(0.0) / 1e3),
        }
    }

    /// Hands `s` to the engine; wakes its thread only when it would look too late.
    /// Err: the engine thread is gone (shutting down).
    pub fn submit(&self, engine: &mpsc::Sender<Cmd>, s: Submit) -> Result<(), EngineGone> {
        let due = (s.arrival + self.lead)
            .saturating_duration_since(self.base)
            .as_nanos() as u64;
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).push(s);
        // After the push (the mutex orders it against the engine's last look at the queue).
        if self.wake_at.load(SeqCst) > due {
            return engine.send(Cmd::Wake).map_err(|_| EngineGone);
        }
        Ok(())
    }

    fn take(&self) -> Vec<Submit> {
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Publishes the engine's next look (`None`: only a command wakes it); false when requests
    /// are already waiting (the engine must not sleep).
    fn publish(&self, next: Option<Instant>) -> bool {
        let ns = next.map_or(u64::MAX, |t| {
            t.saturating_duration_since(self.base).as_nanos() as u64
        });
        self.wake_at.store(ns.max(1), SeqCst);
        let empty = self
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty();
        if !empty {
            self.wake_at.store(0, SeqCst);
        }
        empty
    }

    fn awake(&self) {
        self.wake_at.store(0, SeqCst);
    }
}

struct Req {
    sink: Arc<dyn Sink>,
    arrival: Instant,
    faults: FaultPlan,
    seqs_left: usize,
    seq_keys: Vec<u64>,
    prompt_tokens: u64,
    produced: u64,
    scheduled: Option<Instant>,
    first: Option<Instant>,
    last: Option<Instant>,
    /// Stalls so far: each later event comes this much after the scheduler's instant.
    offset: Duration,
    mid_done: bool,
    any_stop: bool,
    /// A reset is scheduled; nothing else is sent.
    reset_pending: bool,
}

/// Where one hand-over of a request's tokens stands ([`Req::advance`]).
struct Advance {
    /// When they go out (the scheduler's instant plus the stalls so far).
    at: Instant,
    /// When the request's previous tokens went out.
    prev: Option<Instant>,
    /// A stall holds them back (they wait in [`Delayed`]).
    held: bool,
    /// The reset fault follows them.
    reset: bool,
    /// The request's last tokens.
    last: bool,
}

impl Req {
    /// Accounts for `n` tokens scheduled at `at` (`finish` on a choice's last ones) and applies
    /// the request's stall and reset faults.
    fn advance(&mut self, n: u64, finish: Option<Finish>, at: Instant) -> Advance {
        let held = !self.offset.is_zero();
        let at = at + self.offset;
        let prev = self.last.replace(at);
        self.first.get_or_insert(at);
        self.produced += n;
        self.any_stop |= finish == Some(Finish::Stop);
        let due = |after: u32| self.produced >= u64::from(after);
        if let Some((_, ms)) = self
            .faults
            .stall_mid
            .filter(|&(a, _)| !self.mid_done && due(a))
        {
            self.mid_done = true;
            self.offset += Duration::from_secs_f64(ms / 1e3);
        }
        if finish.is_some() {
            self.seqs_left = self.seqs_left.saturating_sub(1);
        }
        Advance {
            at,
            prev,
            held,
            reset: self
                .faults
                .reset_after
                .is_some_and(|a| self.produced >= u64::from(a)),
            last: self.seqs_left == 0 && finish.is_some(),
        }
    }
}

/// Events held back by a stall (or an injected reset), by (due, order): with their request and
/// sink, so that they are delivered even after the engine has finished the request.
type Delayed = std::collections::BTreeMap<(Instant, u64), (u64, Arc<dyn Sink>, Emit)>;

/// Stream events due in this wake-up and the writer threads they may go to.
struct Writers {
    now: SinkBatch,
    marks: Marks,
    out: Vec<SinkBatch>,
    txs: Vec<mpsc::Sender<SinkBatch>>,
}

impl Writers {
    /// Starts the writer threads.
    fn spawn(realtime: bool, stats: &Arc<Stats>) -> std::io::Result<(Writers, Vec<Thread>)> {
        let (mut txs, mut threads) = (Vec::new(), Vec::new());
        for i in 0..WRITERS {
            let (tx, rx) = mpsc::channel::<SinkBatch>();
            let st = stats.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("mock-writer-{i}"))
                    .spawn(move || {
                        timing_thread(realtime, &st);
                        writer_loop(rx);
                    })?,
            );
            txs.push(tx);
        }
        let out = (0..WRITERS).map(|_| Vec::new()).collect();
        let marks = Marks::default();
        Ok((
            Writers {
                now: Vec::new(),
                marks,
                out,
                txs,
            },
            threads,
        ))
    }
}

type Thread = std::thread::JoinHandle<()>;

struct Engine {
    cfg: EngineConfig,
    sched: Scheduler,
    stats: Arc<Stats>,
    reqs: IdMap<Req>,
    delayed: Delayed,
    delayed_n: u64,
    /// The scheduler's events (scratch).
    events: Vec<Event>,
    writers: Writers,
}

/// Starts the engine thread (and its writer threads), which takes requests from `inbox`
/// ([`Inbox::submit`]) and commands from the returned channel.
pub fn spawn(
    cfg: EngineConfig,
    stats: Arc<Stats>,
    inbox: Arc<Inbox>,
) -> std::io::Result<(mpsc::Sender<Cmd>, Thread)> {
    let (tx, rx) = mpsc::channel();
    let (writers, threads) = Writers::spawn(cfg.realtime, &stats)?;
    let handle = std::thread::Builder::new()
        .name("mock-engine".into())
        .spawn(move || {
            timing_thread(cfg.realtime, &stats);
            let mut e = Engine {
                sched: Scheduler::new(cfg.sched.clone()),
                cfg,
                stats,
                reqs: IdMap::default(),
                delayed: Delayed::new(),
                delayed_n: 0,
                events: Vec::new(),
                writers,
            };
            e.run(&rx, &inbox);
            // Requests queued after the last look are dropped with the engine (their responses
            // end as on shutdown); later submits find no engine to wake and fail.
            inbox.wake_at.store(u64::MAX, SeqCst);
            drop(inbox.take());
            // Writers end once their queue is empty and closed; every queued write is done
            // before the engine thread (which shutdown waits for) ends.
            drop(e);
            for w in threads {
                let _ = w.join();
            }
        })?;
    Ok((tx, handle))
}

/// Timed waits wake within microseconds instead of the default 50 µs slack, and a short EEVDF
/// slice gets the thread onto a busy CPU sooner when a deadline comes; `realtime`: SCHED_FIFO.
fn timing_thread(realtime: bool, stats: &Stats) {
    crate::thread_timing::precise(true);
    if realtime && !crate::thread_timing::realtime() {
        stats.realtime_failed.store(true, Relaxed);
    }
}

/// Delay between the last token before an injected reset and the reset itself: the tokens
/// before it reach the client (a TCP reset makes the peer discard data it has not read yet).
const RESET_GRACE: Duration = Duration::from_millis(20);

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Engine {
    fn run(&mut self, rx: &mpsc::Receiver<Cmd>, inbox: &Inbox) {
        loop {
            inbox.awake();
            for s in inbox.take() {
                self.submit(s);
            }
            loop {
                match rx.try_recv() {
                    Ok(Cmd::Shutdown) | Err(mpsc::TryRecvError::Disconnected) => return,
                    Ok(c) => self.handle(c),
                    Err(mpsc::TryRecvError::Empty) => break,
                }
            }
            let now = Instant::now();
            self.progress(now);
            self.write_sinks();
            // The next hand-over happens no sooner than `coalesce` after this one, so events due
            // within that window go out together (one wake-up for several) and each is at most
            // `coalesce` late; an isolated event is still handed over on time.
            let wake = self.next_wake().map(|t| t.max(now + self.cfg.coalesce));
            if !inbox.publish(wake) {
                continue; // requests arrived meanwhile
            }
            let Ok(cmd) = self.wait(rx, wake) else {
                return;
            };
            inbox.awake();
            match cmd {
                Some(Cmd::Shutdown) => return,
                Some(c) => self.handle(c),
                None => {}
            }
        }
    }

    /// Sleeps until `wake`, or until a command comes.
    fn wait(
        &self,
        rx: &mpsc::Receiver<Cmd>,
        wake: Option<Instant>,
    ) -> Result<Option<Cmd>, mpsc::RecvError> {
        let Some(t) = wake else {
            return rx.recv().map(Some);
        };
        let now = Instant::now();
        if t <= now {
            return Ok(None);
        }
        match rx.recv_timeout(t - now) {
            Ok(c) => Ok(Some(c)),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(mpsc::RecvError),
        }
    }

    fn next_wake(&self) -> Option<Instant> {
        let d = self.delayed.first_key_value().map(|(k, _)| k.0);
        [d, self.sched.next_due()].into_iter().flatten().min()
    }

    fn handle(&mut self, c: Cmd) {
        match c {
            Cmd::Cancel(id) => self.abort(id),
            Cmd::Shutdown | Cmd::Wake => {}
        }
    }

    fn submit(&mut self, s: Submit) {
        let mut arrival = s.arrival;
        if !self.sched.fixed() {
            // The engine sees the request after the front end's latency.
            arrival += Duration::from_secs_f64(self.cfg.sched.cost.request_overhead_ms / 1e3);
        }
        let req = Req {
            sink: s.sink,
            arrival,
            seqs_left: s.seqs.len(),
            seq_keys: Vec::new(),
            prompt_tokens: s.seqs.iter().map(|q| q.prompt.len() as u64).sum(),
            produced: 0,
            scheduled: None,
            first: None,
            last: None,
            offset: Duration::from_secs_f64(s.faults.stall_first_ms.unwrap_or(0.0) / 1e3),
            faults: s.faults,
            mid_done: false,
            any_stop: false,
            reset_pending: false,
        };
        self.reqs.insert(s.id, req);
        let keys = self.sched.add(s.id, arrival, s.seqs, &mut self.events);
        if let Some(r) = self.reqs.get_mut(&s.id) {
            r.seq_keys = keys;
        }
        self.take_events();
        self.update_gauges();
    }

    fn update_gauges(&self) {
        let (running, waiting) = if self.sched.fixed() {
            (self.reqs.len(), 0)
        } else {
            self.sched.counts()
        };
        self.stats.running.store(running as u64, Relaxed);
        self.stats.waiting.store(waiting as u64, Relaxed);
        self.stats.set_kv_usage(self.sched.kv_usage());
    }

    /// Everything due at or before `now`, in time order.
    fn progress(&mut self, now: Instant) {
        loop {
            let s = self.sched.next_due().filter(|&t| t <= now);
            let d = self
                .delayed
                .first_key_value()
                .map(|(k, _)| k.0)
                .filter(|&t| t <= now);
            match (s, d) {
                (Some(s), Some(d)) if d < s => self.pop_delayed(),
                (Some(_), _) => {
                    self.sched.run_next(&mut self.events);
                    self.take_events();
                }
                (None, Some(_)) => self.pop_delayed(),
                (None, None) => break,
            }
        }
        self.update_gauges();
    }

    /// Acts on what the scheduler decided.
    fn take_events(&mut self) {
        let mut events = std::mem::take(&mut self.events);
        for e in events.drain(..) {
            match e {
                Event::Admitted {
                    req,
                    at,
                    prompt_tokens,
                    hit_tokens,
                } => self.admitted(req, at, prompt_tokens, hit_tokens),
                Event::Tokens {
                    req,
                    choice,
                    ids,
                    finish,
                    at,
                } => self.deliver(req, choice, ids, finish, at),
                Event::Rejected { req } => self.abort(req),
            }
        }
        self.events = events;
    }

    fn admitted(&mut self, rid: u64, at: Instant, prompt_tokens: u32, hit_tokens: u32) {
        let s = &self.stats;
        s.prefix_queries
            .fetch_add(u64::from(prompt_tokens), Relaxed);
        s.prefix_hits.fetch_add(u64::from(hit_tokens), Relaxed);
        s.prompt_tokens.fetch_add(u64::from(prompt_tokens), Relaxed);
        if let Some(r) = self.reqs.get_mut(&rid).filter(|r| r.scheduled.is_none()) {
            r.scheduled = Some(at);
            s.queue
                .observe(at.saturating_duration_since(r.arrival).as_secs_f64());
        }
    }

    /// Hands an event to its sink now (into this wake-up's batch), recording how late the
    /// engine clock is in doing so.
    fn hand_over(&mut self, sink: Arc<dyn Sink>, e: Emit) {
        let late = Instant::now().saturating_duration_since(e.at());
        self.stats.record_dispatch(late.as_nanos());
        self.writers.now.push((sink.key(), sink, e));
    }

    /// Hands `e` over now, or when it is due if a stall holds it back.
    fn emit(&mut self, req: u64, sink: Arc<dyn Sink>, e: Emit, held: bool) {
        if !held {
            return self.hand_over(sink, e);
        }
        self.delayed_n += 1;
        self.delayed
            .insert((e.at(), self.delayed_n), (req, sink, e));
    }

    fn pop_delayed(&mut self) {
        let Some((_, (req, sink, e))) = self.delayed.pop_first() else {
            return;
        };
        let reset = matches!(e, Emit::Reset { .. });
        self.hand_over(sink, e);
        if reset {
            self.drop_req(req);
        }
    }

    /// Writes this wake-up's stream events: a small batch on this thread (no hand-over at all),
    /// a large one spread over the writer threads. A response with events still queued at a
    /// writer keeps going through that writer.
    fn write_sinks(&mut self) {
        let w = &mut self.writers;
        if w.now.is_empty() {
            return;
        }
        let n = w.txs.len();
        let local = w.now.len() <= DIRECT_MAX;
        let mut gone = Vec::new();
        // All of one response's events in this batch go the same way (its `queued` count
        // changes only below, and only for responses sent to a writer).
        flush_marks(&w.now, &mut w.marks);
        for (i, (key, sink, e)) in w.now.drain(..).enumerate() {
            if local && sink.queued().load(Relaxed) == 0 {
                if !sink.emit(e, w.marks.flush[i]) {
                    gone.push(key);
                }
            } else {
                sink.queued().fetch_add(1, Relaxed);
                w.out[(key % n as u64) as usize].push((key, sink, e));
            }
        }
        for (tx, b) in w.txs.iter().zip(w.out.iter_mut()) {
            if !b.is_empty() {
                let _ = tx.send(std::mem::take(b));
            }
        }
        for rid in gone {
            self.abort(rid);
        }
    }

    /// Tokens of one choice, scheduled at `at`: applies the request's stalls and reset fault,
    /// hands them over, and finishes the request after its last choice.
    fn deliver(
        &mut self,
        rid: u64,
        choice: u32,
        ids: Vec<u32>,
        finish: Option<Finish>,
        at: Instant,
    ) {
        let Some(req) = self.reqs.get_mut(&rid).filter(|r| !r.reset_pending) else {
            return;
        };
        let n = ids.len() as u64;
        let a = req.advance(n, finish, at);
        let (arrival, sink) = (req.arrival, req.sink.clone());
        self.stats.generation_tokens.fetch_add(n, Relaxed);
        match a.prev {
            None => self.stats.ttft.observe((a.at - arrival).as_secs_f64()),
            Some(prev) => self.stats.itl.observe((a.at - prev).as_secs_f64()),
        }
        let tokens = Emit::Tokens {
            at: a.at,
            choice,
            ids,
            finish,
        };
        self.emit(rid, sink.clone(), tokens, a.held);
        if a.reset {
            req_reset(self, rid, sink, a.at);
        } else if a.last {
            let done = self.reqs.get(&rid).map(|r| done_emit(r, a.at));
            if let Some(done) = done {
                self.emit(rid, sink, done, a.held);
            }
            self.complete_req(rid);
        }
    }

    fn complete_req(&mut self, rid: u64) {
        if let Some(r) = self.reqs.get(&rid) {
            if let Some(l) = r.last {
                self.stats.e2e.observe((l - r.arrival).as_secs_f64());
            }
            let n = if r.any_stop {
                &self.stats.success_stop
            } else {
                &self.stats.success_length
            };
            n.fetch_add(1, Relaxed);
        }
        self.drop_req(rid);
    }

    /// Client went away or asked to cancel.
    fn abort(&mut self, rid: u64) {
        if self.reqs.contains_key(&rid) {
            self.stats.aborted.fetch_add(1, Relaxed);
            self.drop_req(rid);
        }
    }

    /// Frees a request's sequences but keeps the request until its pending reset is delivered.
    fn detach_req(&mut self, rid: u64) {
        let keys = match self.reqs.get_mut(&rid) {
            Some(r) => std::mem::take(&mut r.seq_keys),
            None => return,
        };
        keys.into_iter().for_each(|k| self.sched.remove(k));
        self.update_gauges();
    }

    /// Forgets a request and frees its sequences' blocks.
    fn drop_req(&mut self, rid: u64) {
        if let Some(r) = self.reqs.remove(&rid) {
            r.seq_keys.into_iter().for_each(|k| self.sched.remove(k));
        }
        self.update_gauges();
    }
}

/// The injected reset of request `rid`, whose last tokens went out at `at`: the RST follows
/// [`RESET_GRACE`] later; the request's sequences are freed now.
fn req_reset(e: &mut Engine, rid: u64, sink: Arc<dyn Sink>, at: Instant) {
    let at = at + RESET_GRACE;
    e.emit(rid, sink, Emit::Reset { at }, true);
    if let Some(r) = e.reqs.get_mut(&rid) {
        r.reset_pending = true;
    }
    e.stats.aborted.fetch_add(1, Relaxed);
    e.detach_req(rid);
}

/// The request's `Done` at `at`, with the engine's own timings of it.
fn done_emit(r: &Req, at: Instant) -> Emit {
    let scheduled = r.scheduled.unwrap_or(r.arrival);
    let first = r.first.unwrap_or(at);
    let last = r.last.unwrap_or(at);
    let ttft_ms = ms(first.saturating_duration_since(scheduled));
    let generation_ms = ms(last - first);
    let mean_itl_ms = if r.produced > 1 {
        generation_ms / (r.produced - 1) as f64
    } else {
        0.0
    };
    let total = ttft_ms + generation_ms;
    Emit::Done {
        at,
        prompt_tokens: r.prompt_tokens,
        completion_tokens: r.produced,
        timing: Timing {
            queue_ms: ms(scheduled - r.arrival),
            ttft_ms,
            generation_ms,
            mean_itl_ms,
            tokens_per_second: if total > 0.0 {
                r.produced as f64 / (total / 1e3)
            } else {
                0.0
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::sched::CostModel;

    /// A sink that forwards every event to a channel.
    struct ChanSink(
        tokio::sync::mpsc::UnboundedSender<Emit>,
        std::sync::atomic::AtomicU32,
    );
    impl Sink for ChanSink {
        fn emit(&self, e: Emit, _: bool) -> bool {
            self.0.send(e).is_ok()
        }
        fn key(&self) -> u64 {
            0
        }
        fn queued(&self) -> &std::sync::atomic::AtomicU32 {
            &self.1
        }
    }

    fn chan() -> (Arc<dyn Sink>, tokio::sync::mpsc::UnboundedReceiver<Emit>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (Arc::new(ChanSink(tx, Default::default())), rx)
    }

    type Events = tokio::sync::mpsc::UnboundedReceiver<Emit>;

    /// Submits request `id` (one sequence of `prompt`, exactly `max_tokens` tokens, or none)
    /// arrived at `arrival`; the events it gets come on the returned channel.
    fn submit(
        inbox: &Inbox,
        tx: &mpsc::Sender<Cmd>,
        id: u64,
        arrival: Instant,
        seq: Option<(Vec<u32>, u32)>,
    ) -> Result<Events, EngineGone> {
        let (sink, rx) = chan();
        let seqs = seq.into_iter().map(|(prompt, max_tokens)| SeqIn {
            prompt,
            max_tokens,
            min_tokens: 0,
            ignore_eos: true,
        });
        let faults = FaultPlan::default();
        let seqs = seqs.collect();
        inbox.submit(
            tx,
            Submit {
                id,
                arrival,
                seqs,
                faults,
                sink,
            },
        )?;
        Ok(rx)
    }

    fn engine_cfg(sched: SchedConfig) -> EngineConfig {
        EngineConfig {
            sched,
            realtime: false,
            coalesce: Duration::from_micros(50),
        }
    }

    /// Random workloads on a tiny engine: every request completes with exactly its tokens, its
    /// events arrive in time order and end with `Done`, and the cache stays within capacity.
    #[test]
    fn random_workloads_complete_exactly() {
        use proptest::prelude::*;
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases: 64,
            ..Default::default()
        });
        let strat = (
            1u32..=8,
            1u32..=32,
            1usize..=4,
            1u32..=64,
            proptest::collection::vec((1u32..=120, 1u32..=12, 0u32..3), 1..12),
        );
        runner
            .run(&strat, |(bs, budget, max_seqs, tpe, reqs)| {
                let max_len = 140u32;
                let cfg = engine_cfg(SchedConfig {
                    fixed: None,
                    cost: CostModel {
                        request_overhead_ms: 0.0,
                        step_overhead_ms: 0.02,
                        prefill_token_ms: 0.0,
                        seq_ms: 0.0,
                        context_token_ms: 0.0,
                    },
                    max_num_seqs: max_seqs,
                    max_num_batched_tokens: budget,
                    block_size: bs,
                    kv_blocks: (max_len.div_ceil(bs) + 1) as usize,
                    tokens_per_event: tpe % 3 + 1,
                    seed: 1,
                    eos_prob: 0.0,
                    vocab: 1000,
                });
                let stats = Arc::new(Stats::new("m"));
                let inbox = Arc::new(Inbox::new(Duration::ZERO));
                let (tx, th) = spawn(cfg, stats.clone(), inbox.clone()).unwrap();
                let mut rxs = Vec::new();
                for (i, (plen, max_tokens, family)) in reqs.iter().enumerate() {
                    // prompts of one family share a prefix
                    let prompt: Vec<u32> = (0..*plen).map(|t| t + family * 10_000).collect();
                    let seq = (prompt, (*max_tokens).min(max_len - plen));
                    let now = Instant::now();
                    rxs.push(submit(&inbox, &tx, i as u64, now, Some(seq)).unwrap());
                }
                for (i, mut rx) in rxs.into_iter().enumerate() {
                    let want = reqs[i].1.min(max_len - reqs[i].0) as u64;
                    let mut got = 0u64;
                    let mut last: Option<Instant> = None;
                    loop {
                        let e = rx.blocking_recv().expect("request must finish");
                        if let Some(l) = last {
                            prop_assert!(e.at() >= l, "events in time order");
                        }
                        last = Some(e.at());
                        match e {
                            Emit::Tokens { ids, .. } => got += ids.len() as u64,
                            Emit::Done {
                                completion_tokens,
                                timing,
                                ..
                            } => {
                                prop_assert_eq!(completion_tokens, got);
                                prop_assert!(timing.queue_ms >= 0.0 && timing.ttft_ms > 0.0);
                                break;
                            }
                            Emit::Reset { .. } => prop_assert!(false, "no reset asked"),
                        }
                    }
                    prop_assert_eq!(got, want);
                }
                prop_assert!(stats.prefix_hits.load(Relaxed) <= stats.prefix_queries.load(Relaxed));
                tx.send(Cmd::Shutdown).unwrap();
                th.join().unwrap();
                // every block released once the engine is done
                prop_assert_eq!(f64::from_bits(stats.kv_usage_bits.load(Relaxed)), 0.0);
                Ok(())
            })
            .unwrap();
    }

    /// Requests handed over through the inbox while the engine sleeps (a burst, then stragglers
    /// while streams run) all complete, none before `arrival + ttft`, and in fixed mode the
    /// engine is woken only when needed (it keeps on time without a wake-up per request).
    #[test]
    fn inbox_requests_are_served_on_time() {
        let cfg = engine_cfg(SchedConfig {
            fixed: Some((Duration::from_millis(30), Duration::from_millis(5))),
            cost: CostModel::default(),
            max_num_seqs: 1000,
            max_num_batched_tokens: 2048,
            block_size: 16,
            kv_blocks: 10_000,
            tokens_per_event: 1,
            seed: 1,
            eos_prob: 0.0,
            vocab: 1000,
        });
        let inbox = Arc::new(Inbox::new(Inbox::lead(&cfg.sched)));
        assert_eq!(inbox.lead, Duration::from_millis(30));
        let stats = Arc::new(Stats::new("m"));
        let (tx, th) = spawn(cfg, stats, inbox.clone()).unwrap();
        let mut rxs = Vec::new();
        for i in 0..60u64 {
            if i >= 40 {
                std::thread::sleep(Duration::from_millis(3)); // stragglers while streams run
            }
            let arrival = Instant::now();
            let seq = (vec![1, 2, 3, i as u32], 4);
            rxs.push((arrival, submit(&inbox, &tx, i, arrival, Some(seq)).unwrap()));
        }
        for (arrival, mut rx) in rxs {
            let mut tokens = 0;
            let mut first = None;
            loop {
                match rx.blocking_recv().expect("request must finish") {
                    Emit::Tokens { at, ids, .. } => {
                        first.get_or_insert(at);
                        tokens += ids.len();
                    }
                    Emit::Done { .. } => break,
                    Emit::Reset { .. } => panic!("no reset asked"),
                }
            }
            assert_eq!(tokens, 4);
            let first = first.unwrap();
            assert_eq!(
                first,
                arrival + Duration::from_millis(30),
                "scheduled from arrival"
            );
        }
        tx.send(Cmd::Shutdown).unwrap();
        th.join().unwrap();
        // after the engine ended, a submit fails instead of waiting forever
        assert!(submit(&inbox, &tx, 99, Instant::now(), None).is_err());
    }

    #[test]
    fn each_response_flushes_on_its_last_event_in_a_batch() {
        let (sink, _rx) = chan();
        let ev = || Emit::Reset { at: Instant::now() };
        for n in [5usize, 200] {
            // keys 0..n, then key 1 and key 3 again
            let mut keys: Vec<u64> = (0..n as u64).collect();
            keys.extend([1, 3]);
            let batch: SinkBatch = keys.iter().map(|&k| (k, sink.clone(), ev())).collect();
            let mut m = Marks::default();
            flush_marks(&batch, &mut m);
            for (i, &k) in keys.iter().enumerate() {
                let last = keys.iter().rposition(|&x| x == k) == Some(i);
                assert_eq!(m.flush[i], last, "n {n}, index {i}, key {k}");
            }
            assert_eq!(m.flush.iter().filter(|&&f| f).count(), n);
        }
    }
}
