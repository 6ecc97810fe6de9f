//! The simulated engine's emission side: a thread that runs the scheduler ([`super::sched`]) in
//! real time, applies each request's stall and reset faults, hands every token event to its
//! response's [`Sink`] at its due instant and keeps the engine's counters ([`super::exposition`]).
//! The design (deadline wait, coalescing, writer threads, the inbox) is in docs/mock.md,
//! "Timing design". This module does not format JSON or touch sockets.

use super::cache::IdMap;
use super::exposition::EngineCounters;
use super::faults::FaultPlan;
use super::sched::{EngineEvent, SchedConfig, Scheduler};
pub(crate) use super::sched::{Finish, SeqIn};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Threads that call the sinks for large bursts, spreading the socket work over cores; each
/// response always goes through the same one.
const WRITERS: usize = 2;

/// At most this many due events per hand-over are written by the engine thread itself; a larger
/// burst goes to the writer threads.
const DIRECT_MAX: usize = 32;

/// Delay between the last token before an injected reset and the reset itself: the tokens
/// before it reach the client (a TCP reset makes the peer discard data it has not read yet).
const RESET_GRACE: Duration = Duration::from_millis(20);

/// A finished request's token counts and the engine's own timings of it (vLLM's per-request
/// `metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct TokenUsage {
    pub(crate) prompt_tokens: u64,
    pub(crate) completion_tokens: u64,
    pub(crate) queue_ms: f64,
    pub(crate) ttft_ms: f64,
    pub(crate) generation_ms: f64,
    pub(crate) mean_itl_ms: f64,
    pub(crate) tokens_per_second: f64,
}

/// What the engine sends to a response, each at an exact instant.
#[derive(Debug)]
pub(crate) enum Emit {
    Tokens {
        at: Instant,
        choice: u32,
        ids: Vec<u32>,
        finish: Option<Finish>,
    },
    /// All choices finished; follows the last `Tokens`.
    Done { at: Instant, usage: TokenUsage },
    /// Fault: reset the connection now.
    Reset { at: Instant },
}

impl Emit {
    pub(crate) fn at(&self) -> Instant {
        match self {
            Emit::Tokens { at, .. } | Emit::Done { at, .. } | Emit::Reset { at } => *at,
        }
    }
}

/// A request handed to the engine.
pub(crate) struct Submit {
    pub(crate) id: u64,
    pub(crate) arrival: Instant,
    pub(crate) seqs: Vec<SeqIn>,
    /// Prompt tokens `usage` reports: each prompt once, whatever `n`, as vLLM counts them.
    pub(crate) prompt_tokens: u64,
    pub(crate) faults: FaultPlan,
    pub(crate) sink: Arc<dyn Sink>,
}

/// A response that takes each event at its due instant, on the engine thread or a writer thread
/// (a stream, `super::emit`, formats it and hands its bytes to the socket at once).
pub(crate) trait Sink: Send + Sync {
    /// Takes one event; false when the client is gone (the engine then aborts the request; a
    /// sink called on a writer thread also sends `Cmd::Cancel` itself). `flush: false` when
    /// another event of the same response follows in the same batch: the bytes are queued and
    /// go out with that one, in one write.
    fn emit(&self, e: Emit, flush: bool) -> bool;
    /// Events of this response handed to a writer thread and not yet taken by it: the engine
    /// writes an event itself only when this is 0, so a response's events stay in order.
    fn queued(&self) -> &std::sync::atomic::AtomicU32;
}

/// Sink events (with their request's id) in hand-over order.
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
pub(crate) enum Cmd {
    Cancel(u64),
    /// `POST /reset_prefix_cache`: whether the cache was emptied.
    ResetPrefixCache(tokio::sync::oneshot::Sender<bool>),
    Shutdown,
    /// Look at the [`Inbox`] now.
    Wake,
}

/// The engine thread has ended (the mock is shutting down).
#[derive(Debug, thiserror::Error)]
#[error("the engine has stopped")]
pub(crate) struct EngineGone;

/// New requests handed to the engine without waking its thread when it will look anyway before
/// the request's first event can be due (`arrival + lead`; `lead` is the fixed TTFT, or the
/// front-end latency in cost-model mode): a burst of arrivals costs one wake-up.
pub(crate) struct Inbox {
    queue: Mutex<Vec<Submit>>,
    /// ns after `base` at which the engine will next drain the queue; 0 while it is awake,
    /// `u64::MAX` while it waits for a command.
    wake_at: AtomicU64,
    base: Instant,
    lead: Duration,
}

impl Inbox {
    pub(crate) fn new(cfg: &SchedConfig) -> Inbox {
        let lead = cfg.fixed.map_or(cfg.front_end(), |(ttft, _)| ttft);
        Inbox {
            queue: Mutex::new(Vec::new()),
            wake_at: AtomicU64::new(0),
            base: Instant::now(),
            lead,
        }
    }

    fn queue(&self) -> MutexGuard<'_, Vec<Submit>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands `s` to the engine; wakes its thread only when it would look too late.
    /// Err: the engine thread is gone (shutting down).
    pub(crate) fn submit(&self, engine: &mpsc::Sender<Cmd>, s: Submit) -> Result<(), EngineGone> {
        let due = (s.arrival + self.lead)
            .saturating_duration_since(self.base)
            .as_nanos() as u64;
        self.queue().push(s);
        // After the push (the mutex orders it against the engine's last look at the queue).
        if self.wake_at.load(SeqCst) > due {
            return engine.send(Cmd::Wake).map_err(|_| EngineGone);
        }
        Ok(())
    }

    /// Publishes the engine's next look (`None`: only a command wakes it); false when requests
    /// are already waiting (the engine must not sleep).
    fn publish(&self, next: Option<Instant>) -> bool {
        let ns = next.map_or(u64::MAX, |t| {
            t.saturating_duration_since(self.base).as_nanos() as u64
        });
        self.wake_at.store(ns.max(1), SeqCst);
        let empty = self.queue().is_empty();
        if !empty {
            self.wake_at.store(0, SeqCst);
        }
        empty
    }
}

struct Req {
    sink: Arc<dyn Sink>,
    arrival: Instant,
    /// The stall-mid fault is cleared once it has struck.
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
    any_stop: bool,
}

/// Events held back by a stall (or an injected reset), by (due, order): with their request's id
/// and sink, so that they are delivered even after the engine has finished the request.
type Delayed = std::collections::BTreeMap<(Instant, u64), (u64, Arc<dyn Sink>, Emit)>;

/// Stream events due in this wake-up and the writer threads they may go to.
#[derive(Default)]
struct Writers {
    now: SinkBatch,
    marks: Marks,
    out: Vec<SinkBatch>,
    txs: Vec<mpsc::Sender<SinkBatch>>,
}

impl Writers {
    /// Starts the writer threads.
    fn spawn(
        realtime: bool,
        stats: &Arc<EngineCounters>,
    ) -> std::io::Result<(Writers, Vec<Thread>)> {
        let (mut w, mut threads) = (Writers::default(), Vec::new());
        for i in 0..WRITERS {
            let (tx, rx) = mpsc::channel::<SinkBatch>();
            let st = stats.clone();
            let thread = std::thread::Builder::new().name(format!("mock-writer-{i}"));
            threads.push(thread.spawn(move || {
                timing_thread(realtime, &st);
                writer_loop(rx);
            })?);
            w.txs.push(tx);
            w.out.push(Vec::new());
        }
        Ok((w, threads))
    }
}

type Thread = std::thread::JoinHandle<()>;

struct Engine {
    sched: Scheduler,
    /// Added to each arrival: the front end's latency (cost-model mode).
    front_end: Duration,
    /// Minimum gap between two hand-overs (events due within it go out together).
    coalesce: Duration,
    stats: Arc<EngineCounters>,
    reqs: IdMap<Req>,
    delayed: Delayed,
    delayed_n: u64,
    /// The scheduler's events (scratch).
    events: Vec<EngineEvent>,
    writers: Writers,
}

/// Starts the engine thread (and its writer threads, SCHED_FIFO with `realtime`), which takes
/// requests from `inbox` ([`Inbox::submit`]) and commands from the returned channel.
pub(crate) fn spawn(
    sched: SchedConfig,
    realtime: bool,
    coalesce: Duration,
    stats: Arc<EngineCounters>,
    inbox: Arc<Inbox>,
) -> std::io::Result<(mpsc::Sender<Cmd>, Thread)> {
    let (tx, rx) = mpsc::channel();
    let (writers, threads) = Writers::spawn(realtime, &stats)?;
    let handle = std::thread::Builder::new()
        .name("mock-engine".into())
        .spawn(move || {
            timing_thread(realtime, &stats);
            let mut e = Engine {
                front_end: sched.front_end(),
                sched: Scheduler::new(sched),
                coalesce,
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
            let left = std::mem::take(&mut *inbox.queue());
            drop(left);
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
fn timing_thread(realtime: bool, stats: &EngineCounters) {
    crate::sys::thread_timing::precise(true);
    stats.go_realtime(realtime);
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Engine {
    fn run(&mut self, rx: &mpsc::Receiver<Cmd>, inbox: &Inbox) {
        loop {
            inbox.wake_at.store(0, SeqCst);
            let new = std::mem::take(&mut *inbox.queue()); // not locked while submitting
            for s in new {
                self.submit(s);
            }
            loop {
                let c = match rx.try_recv() {
                    Err(mpsc::TryRecvError::Empty) => break,
                    c => c.ok(),
                };
                if !self.command(c) {
                    return;
                }
            }
            let now = Instant::now();
            self.progress(now);
            self.write_sinks();
            // The next hand-over happens no sooner than `coalesce` after this one, so events due
            // within that window go out together and each is at most `coalesce` late.
            let wake = self.next_wake().map(|t| t.max(now + self.coalesce));
            if !inbox.publish(wake) {
                continue; // requests arrived meanwhile
            }
            let cmd = match wake {
                None => rx.recv().ok(),
                Some(t) => match rx.recv_timeout(t.saturating_duration_since(Instant::now())) {
                    Err(mpsc::RecvTimeoutError::Timeout) => continue,
                    c => c.ok(),
                },
            };
            inbox.wake_at.store(0, SeqCst);
            if !self.command(cmd) {
                return;
            }
        }
    }

    /// Acts on a command (`None`: the channel is closed); false when the engine is to stop.
    fn command(&mut self, c: Option<Cmd>) -> bool {
        match c {
            Some(Cmd::Cancel(id)) => self.abort(id),
            Some(Cmd::ResetPrefixCache(done)) => {
                let _ = done.send(self.sched.reset_prefix_cache());
            }
            Some(Cmd::Wake) => {}
            Some(Cmd::Shutdown) | None => return false,
        }
        true
    }

    fn next_delayed(&self) -> Option<Instant> {
        self.delayed.first_key_value().map(|(k, _)| k.0)
    }

    fn next_wake(&self) -> Option<Instant> {
        [self.next_delayed(), self.sched.next_due()]
            .into_iter()
            .flatten()
            .min()
    }

    fn submit(&mut self, s: Submit) {
        let arrival = s.arrival + self.front_end;
        let (seqs_left, prompt_tokens) = (s.seqs.len(), s.prompt_tokens);
        let seq_keys = self.sched.add(s.id, arrival, s.seqs, &mut self.events);
        let req = Req {
            sink: s.sink,
            arrival,
            seqs_left,
            seq_keys,
            prompt_tokens,
            produced: 0,
            scheduled: None,
            first: None,
            last: None,
            offset: Duration::from_secs_f64(s.faults.stall_first_ms.unwrap_or(0.0) / 1e3),
            faults: s.faults,
            any_stop: false,
        };
        self.reqs.insert(s.id, req);
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
            let d = self.next_delayed().filter(|&t| t <= now);
            match (s, d) {
                (Some(s), d) if d.is_none_or(|d| s <= d) => {
                    self.sched.run_next(&mut self.events);
                    self.take_events();
                }
                (_, Some(_)) => {
                    if let Some((_, (rid, sink, e))) = self.delayed.pop_first() {
                        self.hand_over(rid, sink, e);
                    }
                }
                _ => break,
            }
        }
        self.update_gauges();
    }

    /// Acts on what the scheduler decided.
    fn take_events(&mut self) {
        let mut events = std::mem::take(&mut self.events);
        for e in events.drain(..) {
            match e {
                EngineEvent::Admitted {
                    req,
                    at,
                    prompt_tokens,
                    hit_tokens,
                } => self.admitted(req, at, prompt_tokens, hit_tokens),
                EngineEvent::Tokens {
                    req,
                    choice,
                    ids,
                    finish,
                    at,
                } => self.deliver(req, choice, ids, finish, at),
                EngineEvent::Rejected { req } => self.abort(req),
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

    /// Puts an event in this wake-up's batch, recording how late the engine clock is.
    fn hand_over(&mut self, rid: u64, sink: Arc<dyn Sink>, e: Emit) {
        let late = Instant::now().saturating_duration_since(e.at());
        self.stats.dispatch.record(late);
        self.writers.now.push((rid, sink, e));
    }

    /// Hands `e` over now, or when it is due if a stall holds it back.
    fn emit(&mut self, rid: u64, sink: Arc<dyn Sink>, e: Emit, held: bool) {
        if !held {
            return self.hand_over(rid, sink, e);
        }
        self.delayed_n += 1;
        self.delayed
            .insert((e.at(), self.delayed_n), (rid, sink, e));
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
        for (i, (rid, sink, e)) in w.now.drain(..).enumerate() {
            if local && sink.queued().load(Relaxed) == 0 {
                if !sink.emit(e, w.marks.flush[i]) {
                    gone.push(rid);
                }
            } else {
                sink.queued().fetch_add(1, Relaxed);
                w.out[(rid % n as u64) as usize].push((rid, sink, e));
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
        let Some(r) = self.reqs.get_mut(&rid) else {
            return;
        };
        let (held, at, n) = (!r.offset.is_zero(), at + r.offset, ids.len() as u64);
        match r.last.replace(at) {
            None => self.stats.ttft.observe((at - r.arrival).as_secs_f64()),
            Some(prev) => self.stats.itl.observe((at - prev).as_secs_f64()),
        }
        r.first.get_or_insert(at);
        r.produced += n;
        r.any_stop |= finish == Some(Finish::Stop);
        r.seqs_left = r.seqs_left.saturating_sub(usize::from(finish.is_some()));
        let produced = r.produced;
        if let Some((_, ms)) = r
            .faults
            .stall_mid
            .filter(|&(a, _)| produced >= u64::from(a))
        {
            r.faults.stall_mid = None;
            r.offset += Duration::from_secs_f64(ms / 1e3);
        }
        let reset = r
            .faults
            .reset_after
            .is_some_and(|a| produced >= u64::from(a));
        let done = (!reset && finish.is_some() && r.seqs_left == 0).then(|| {
            self.stats.e2e.observe((at - r.arrival).as_secs_f64());
            let by_reason = match r.any_stop {
                true => &self.stats.success_stop,
                false => &self.stats.success_length,
            };
            by_reason.fetch_add(1, Relaxed);
            done_emit(r, at)
        });
        let sink = r.sink.clone();
        self.stats.generation_tokens.fetch_add(n, Relaxed);
        let tokens = Emit::Tokens {
            at,
            choice,
            ids,
            finish,
        };
        self.emit(rid, sink.clone(), tokens, held);
        if reset {
            // The RST follows the tokens; the request ends now.
            self.emit(
                rid,
                sink,
                Emit::Reset {
                    at: at + RESET_GRACE,
                },
                true,
            );
            self.stats.aborted.fetch_add(1, Relaxed);
            self.drop_req(rid);
        } else if let Some(done) = done {
            self.emit(rid, sink, done, held);
            self.drop_req(rid);
        }
    }

    /// Client went away or asked to cancel.
    fn abort(&mut self, rid: u64) {
        if self.reqs.contains_key(&rid) {
            self.stats.aborted.fetch_add(1, Relaxed);
            self.drop_req(rid);
        }
    }

    /// Forgets a request and frees its sequences' blocks.
    fn drop_req(&mut self, rid: u64) {
        if let Some(r) = self.reqs.remove(&rid) {
            r.seq_keys.into_iter().for_each(|k| self.sched.remove(k));
        }
        self.update_gauges();
    }
}

/// The request's `Done` at `at`, with the engine's own timings of it.
fn done_emit(r: &Req, at: Instant) -> Emit {
    let scheduled = r.scheduled.unwrap_or(r.arrival);
    let first = r.first.unwrap_or(at);
    let last = r.last.unwrap_or(at);
    let ttft_ms = ms(first.saturating_duration_since(scheduled));
    let generation_ms = ms(last - first);
    // With one token or none the generation time is 0.
    let mean_itl_ms = generation_ms / (r.produced.max(2) - 1) as f64;
    let total = ttft_ms + generation_ms;
    let usage = TokenUsage {
        prompt_tokens: r.prompt_tokens,
        completion_tokens: r.produced,
        queue_ms: ms(scheduled - r.arrival),
        ttft_ms,
        generation_ms,
        mean_itl_ms,
        tokens_per_second: if total > 0.0 {
            r.produced as f64 / (total / 1e3)
        } else {
            0.0
        },
    };
    Emit::Done { at, usage }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::sched::{tests::test_config, CostModel};
    use proptest::prelude::*;

    /// A sink that forwards every event to a channel.
    struct ChanSink(
        tokio::sync::mpsc::UnboundedSender<Emit>,
        std::sync::atomic::AtomicU32,
    );
    impl Sink for ChanSink {
        fn emit(&self, e: Emit, _: bool) -> bool {
            self.0.send(e).is_ok()
        }
        fn queued(&self) -> &std::sync::atomic::AtomicU32 {
            &self.1
        }
    }

    type Events = tokio::sync::mpsc::UnboundedReceiver<Emit>;
    const COALESCE: Duration = Duration::from_micros(50);

    /// Submits request `id` (one sequence of `prompt`, exactly `max_tokens` tokens, or none)
    /// arrived at `arrival`; the events it gets come on the returned channel.
    fn submit(
        inbox: &Inbox,
        tx: &mpsc::Sender<Cmd>,
        id: u64,
        arrival: Instant,
        seq: Option<(Vec<u32>, u32)>,
    ) -> Result<Events, EngineGone> {
        let (etx, rx) = tokio::sync::mpsc::unbounded_channel();
        let seqs = seq.into_iter().map(|(prompt, max_tokens)| SeqIn {
            prompt,
            max_tokens,
            min_tokens: 0,
            ignore_eos: true,
            stop_after: None,
        });
        let seqs: Vec<SeqIn> = seqs.collect();
        let s = Submit {
            id,
            arrival,
            prompt_tokens: seqs.iter().map(|q| q.prompt.len() as u64).sum(),
            seqs,
            faults: FaultPlan::default(),
            sink: Arc::new(ChanSink(etx, Default::default())),
        };
        inbox.submit(tx, s)?;
        Ok(rx)
    }

    /// A request's events up to its `Done` (panics if it never comes), and its token count.
    fn until_done(mut rx: Events) -> (Vec<Emit>, u64) {
        let mut evs = Vec::new();
        while !matches!(evs.last(), Some(Emit::Done { .. })) {
            evs.push(rx.blocking_recv().expect("request must finish"));
        }
        let tokens = evs.iter().map(|e| match e {
            Emit::Tokens { ids, .. } => ids.len() as u64,
            _ => 0,
        });
        let tokens = tokens.sum();
        (evs, tokens)
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(64))]
        /// Random workloads on a tiny engine: every request completes with exactly its tokens,
        /// its events arrive in time order and end with `Done`, and the cache stays within
        /// capacity.
        #[test]
        fn random_workloads_complete_exactly(
            bs in 1u32..=8,
            budget in 1u32..=32,
            max_seqs in 1usize..=4,
            tpe in 1u32..=64,
            reqs in proptest::collection::vec((1u32..=120, 1u32..=12, 0u32..3), 1..12),
        ) {
            let max_len = 140u32;
            let cfg = SchedConfig {
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
                ..test_config()
            };
            let stats = Arc::new(EngineCounters::new("m"));
            let inbox = Arc::new(Inbox::new(&cfg));
            let (tx, th) = spawn(cfg, false, COALESCE, stats.clone(), inbox.clone()).unwrap();
            let mut rxs = Vec::new();
            for (i, (plen, max_tokens, family)) in reqs.iter().enumerate() {
                // prompts of one family share a prefix
                let prompt: Vec<u32> = (0..*plen).map(|t| t + family * 10_000).collect();
                let seq = (prompt, (*max_tokens).min(max_len - plen));
                let now = Instant::now();
                rxs.push(submit(&inbox, &tx, i as u64, now, Some(seq)).unwrap());
            }
            for (i, rx) in rxs.into_iter().enumerate() {
                let want = reqs[i].1.min(max_len - reqs[i].0) as u64;
                let (evs, got) = until_done(rx);
                let in_order = evs.windows(2).all(|w| w[1].at() >= w[0].at());
                prop_assert!(in_order, "events in time order");
                let reset = evs.iter().any(|e| matches!(e, Emit::Reset { .. }));
                prop_assert!(!reset, "no reset asked");
                if let Some(Emit::Done { usage: u, .. }) = evs.last() {
                    prop_assert_eq!(u.completion_tokens, got);
                    prop_assert!(u.queue_ms >= 0.0 && u.ttft_ms > 0.0);
                }
                prop_assert_eq!(got, want);
            }
            prop_assert!(stats.prefix_hits.load(Relaxed) <= stats.prefix_queries.load(Relaxed));
            tx.send(Cmd::Shutdown).unwrap();
            th.join().unwrap();
            // every block released once the engine is done
            prop_assert_eq!(f64::from_bits(stats.kv_usage_bits.load(Relaxed)), 0.0);
        }
    }

    /// Requests handed over through the inbox while the engine sleeps (a burst, then stragglers
    /// while streams run) all complete, none before `arrival + ttft`, and in fixed mode the
    /// engine is woken only when needed (it keeps on time without a wake-up per request).
    #[test]
    fn inbox_requests_are_served_on_time() {
        let cfg = SchedConfig {
            fixed: Some((Duration::from_millis(30), Duration::from_millis(5))),
            ..test_config()
        };
        let inbox = Arc::new(Inbox::new(&cfg));
        assert_eq!(inbox.lead, Duration::from_millis(30));
        let stats = Arc::new(EngineCounters::new("m"));
        let (tx, th) = spawn(cfg, false, COALESCE, stats, inbox.clone()).unwrap();
        let mut rxs = Vec::new();
        for i in 0..60u64 {
            if i >= 40 {
                std::thread::sleep(Duration::from_millis(3)); // stragglers while streams run
            }
            let arrival = Instant::now();
            let seq = (vec![1, 2, 3, i as u32], 4);
            rxs.push((arrival, submit(&inbox, &tx, i, arrival, Some(seq)).unwrap()));
        }
        for (arrival, rx) in rxs {
            let (evs, tokens) = until_done(rx);
            let reset = evs.iter().any(|e| matches!(e, Emit::Reset { .. }));
            assert!(!reset, "no reset asked");
            assert_eq!(tokens, 4);
            let first = evs.iter().find(|e| matches!(e, Emit::Tokens { .. }));
            let first = first.map(Emit::at);
            let want = arrival + Duration::from_millis(30);
            assert_eq!(first, Some(want), "scheduled from arrival");
        }
        tx.send(Cmd::Shutdown).unwrap();
        th.join().unwrap();
        // after the engine ended, a submit fails instead of waiting forever
        assert!(submit(&inbox, &tx, 99, Instant::now(), None).is_err());
    }

    #[test]
    fn each_response_flushes_on_its_last_event_in_a_batch() {
        let (etx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let sink: Arc<dyn Sink> = Arc::new(ChanSink(etx, Default::default()));
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
