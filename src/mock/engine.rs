//! The simulated serving engine: a continuous-batching scheduler stepping in real time on its own
//! thread, and the emission clock that hands each token event to its response at an exact instant.
//!
//! **Cost-model mode** (default). Each step admits waiting sequences in arrival order while fewer
//! than `max_num_seqs` run and the KV cache can reserve their blocks (prompt + output; the cached
//! prefix is shared, see [`super::cache`]); then spends a budget of `max_num_batched_tokens`: one
//! decode token for every running sequence past its prefill, then prefill chunks (chunked prefill).
//! The step lasts `step_ms = overhead + prefill_token_ms × prefill_tokens + seq_ms × sequences +
//! context_token_ms × context_tokens` (context = KV tokens attended by the step's sequences). At the step's end
//! every sequence that finished its prefill emits its first token and every decoding sequence emits
//! `tokens_per_event` tokens (speculative-decoding style), and the next step starts at that instant.
//! A request reaches the queue `request_overhead_ms` after it arrived (front-end latency).
//! Defaults (profile `llama8b`): 56.4 ms front end; steps of 7.9 ms + 0.04 ms/prefill token +
//! 0.12 ms/sequence + 0.00005 ms/context token, so a lone 137-token prompt gets a 69.9 ms TTFT and
//! ~8 ms TPOT (Llama-3.1-8B-like), and load raises both.
//! Timings are computed on an ideal timeline (a step starts exactly when the previous ends, or at
//! the arrival that wakes an idle engine), so the same arrivals give the same timings.
//! **Fixed mode** (`fixed_timing = (ttft, itl)`): every request's first event comes `ttft` after
//! arrival and each next one `itl` later, whatever the load; the cost model is bypassed (prefix
//! cache counters are still kept).
//! Output length: `max_tokens` with `ignore_eos`, otherwise a seeded geometric EOS (probability
//! `eos_prob` per token after `min_tokens`). Output ids: `xxh3(index; seed ^ prompt hash) % vocab`.
//! Emission: events wait in a deadline heap; the thread sleeps (1 ns timer slack) until the next
//! deadline, or about `spin_us` before it and then spins, then hands the event to its response:
//! a streamed response's [`Sink`] formats the event and writes it to the socket
//! (`super::stream`), on this thread when at most `DIRECT_MAX` events are due in this wake-up,
//! else on `writers` writer threads in parallel (a response stays on one writer while it has
//! events queued there, so its events keep their order); a channel response gets it in one batch
//! per wake-up. Hand-overs are at least `coalesce` apart, so a burst of close deadlines costs one
//! wake-up and no event is more than `coalesce` late on the engine's side. The response measures
//! lateness when it hands the bytes to the socket. This module itself does not format JSON or
//! touch sockets.

use super::cache::{Alloc, IdMap, PrefixCache};
use super::faults::FaultPlan;
use super::prom::Stats;
use crate::trace::hash::BlockHasher;
use rand::SeedableRng;
use rand_distr::Distribution;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// The step-time cost model, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Front-end latency of every request before the engine queues it (HTTP, tokenization,
    /// hand-off to the engine): adds to the client's TTFT, not to the engine's queue time or
    /// per-request `metrics`, and uses no engine capacity. Cost-model mode only.
    pub request_overhead_ms: f64,
    pub step_overhead_ms: f64,
    pub prefill_token_ms: f64,
    pub seq_ms: f64,
    pub context_token_ms: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        Profile::LLAMA8B.cost
    }
}

/// A named engine model: the cost model and the step token budget (`retrace mock --profile`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Profile {
    pub name: &'static str,
    pub cost: CostModel,
    pub max_num_batched_tokens: u32,
}

impl Profile {
    /// The calibrated default: a lone 137-token prompt gets a 69.9 ms TTFT and 8.0 ms TPOT (the
    /// issue's Llama-3.1-8B figures). Most of that TTFT is front-end latency (56.4 ms), not
    /// compute: prefill runs at 25k tokens/s and a decode step reads KV at 50 ns per context
    /// token, so long prompts and long contexts cost what a single accelerator's memory and
    /// compute suggest (a 7k-token prompt ≈ 0.4 s TTFT; 64 sequences × 1k context ≈ 19 ms steps)
    /// instead of growing with the short-prompt fit.
    pub const LLAMA8B: Profile = Profile {
        name: "llama8b",
        cost: CostModel {
            request_overhead_ms: 56.4,
            step_overhead_ms: 7.9,
            prefill_token_ms: 0.04,
            seq_ms: 0.12,
            context_token_ms: 0.00005,
        },
        max_num_batched_tokens: 2048,
    };
    /// A fast multi-accelerator node: about 200k prefill tokens/s, 8,192-token steps, cheap KV
    /// reads, so Mooncake-size prompts (7k-100k tokens) at the traces' own speed are served
    /// without an ever-growing queue. The embedded target of `retrace replay`.
    pub const FAST: Profile = Profile {
        name: "fast",
        cost: CostModel {
            request_overhead_ms: 0.0,
            step_overhead_ms: 5.0,
            prefill_token_ms: 0.005,
            seq_ms: 0.05,
            context_token_ms: 0.00004,
        },
        max_num_batched_tokens: 8192,
    };
    pub const ALL: [Profile; 2] = [Profile::LLAMA8B, Profile::FAST];

    /// The profile called `name`; the error lists the known ones.
    pub fn by_name(name: &str) -> Result<Profile, String> {
        Profile::ALL
            .into_iter()
            .find(|p| p.name == name)
            .ok_or_else(|| {
                let known: Vec<&str> = Profile::ALL.iter().map(|p| p.name).collect();
                format!(
                    "--profile: unknown profile `{name}` (known: {})",
                    known.join(", ")
                )
            })
    }
}

impl CostModel {
    pub fn step_ms(&self, prefill_tokens: u64, seqs: u64, context_tokens: u64) -> f64 {
        self.step_overhead_ms
            + self.prefill_token_ms * prefill_tokens as f64
            + self.seq_ms * seqs as f64
            + self.context_token_ms * context_tokens as f64
    }
}

/// Engine knobs (derived from `MockConfig`).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub fixed: Option<(Duration, Duration)>,
    pub cost: CostModel,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: u32,
    pub block_size: u32,
    pub kv_blocks: usize,
    pub tokens_per_event: u32,
    pub seed: u64,
    pub eos_prob: f64,
    pub vocab: u32,
    pub spin: Duration,
    /// Run the engine thread under SCHED_FIFO (see [`crate::thread_timing::realtime`]).
    pub realtime: bool,
    /// Minimum gap between two hand-overs (batches events due close together).
    pub coalesce: Duration,
    /// Threads that call the sinks (write streams to their sockets); 0: the engine thread
    /// writes them itself. Several spread the socket work over cores (and over CPU shares on a
    /// busy machine); each response always goes through the same one.
    pub writers: usize,
}

/// Why a choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

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

/// One prompt to complete (a choice).
#[derive(Debug, Clone)]
pub struct SeqIn {
    pub prompt: Vec<u32>,
    /// Already clamped to the context length; at least 1.
    pub max_tokens: u32,
    pub min_tokens: u32,
    pub ignore_eos: bool,
}

/// A request handed to the engine.
#[derive(Debug)]
pub struct Submit {
    pub id: u64,
    pub arrival: Instant,
    pub seqs: Vec<SeqIn>,
    pub faults: FaultPlan,
    pub tx: Out,
}

/// A response that takes each event on the engine thread, at its due instant (the streaming
/// writer, `super::stream`): it formats the event and hands its bytes to the socket at once.
pub trait Sink: Send + Sync {
    /// Takes one event; false when the client is gone (the engine then aborts the request; a
    /// sink called on a writer thread also sends `Cmd::Cancel` itself). `flush: false` when
    /// another event of the same response follows in the same batch: the bytes are queued and
    /// go out with that one, in one write.
    fn emit(&self, e: Emit, flush: bool) -> bool;
    /// A stable number of this response (shards responses over the writer threads, so that one
    /// response's events stay in order).
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
    if batch.len() <= 64 {
        for (i, (k, _, _)) in batch.iter().enumerate() {
            m.flush
                .push(!batch[i + 1..].iter().any(|(k2, _, _)| k2 == k));
        }
        return;
    }
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

/// Where a request's events go: a channel read by a task on the HTTP runtime (whole bodies, and
/// streams served through hyper), or a [`Sink`] called directly on the engine thread.
#[derive(Clone)]
pub enum Out {
    Chan(UnboundedSender<Emit>),
    Sink(Arc<dyn Sink>),
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Out::Chan(_) => "Out::Chan",
            Out::Sink(_) => "Out::Sink",
        })
    }
}

/// Channel events handed over together: the engine sends one batch per wake-up to a dispatcher
/// task on the HTTP runtime, which wakes the connections from inside the runtime (one
/// cross-thread wake-up per batch instead of one per event).
pub type Batch = Vec<(UnboundedSender<Emit>, Emit)>;

#[derive(Debug)]
pub enum Cmd {
    Submit(Box<Submit>),
    Cancel(u64),
    Shutdown,
    /// Look at the [`Inbox`] now.
    Wake,
}

/// The engine thread has ended (the mock is shutting down).
#[derive(Debug)]
pub struct EngineGone;

/// New requests handed to the engine without waking its thread when it will look anyway before
/// the request's first event can be due: a burst of C arrivals costs the engine thread one
/// wake-up instead of C (each a futex wake and a context switch competing with the HTTP threads
/// for the CPU). The engine publishes when it next looks (`Inbox::wake_at`); a request whose
/// first event may be due sooner (`arrival + lead`) wakes it. `lead` is the fixed TTFT, or the
/// front-end latency in cost-model mode (0: every request arriving while the engine sleeps
/// wakes it, as before).
pub struct Inbox {
    queue: std::sync::Mutex<Vec<Submit>>,
    /// ns after `base` at which the engine will next drain the queue; 0 while it is awake,
    /// `u64::MAX` while it waits for a command.
    wake_at: std::sync::atomic::AtomicU64,
    base: Instant,
    lead: Duration,
}

impl Inbox {
    pub fn new(lead: Duration) -> Inbox {
        Inbox {
            queue: std::sync::Mutex::new(Vec::new()),
            wake_at: std::sync::atomic::AtomicU64::new(0),
            base: Instant::now(),
            lead,
        }
    }

    /// The earliest instant a request's first event could be due, for a request arriving at
    /// `arrival`.
    pub fn lead(cfg: &EngineConfig) -> Duration {
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
        if self.wake_at.load(std::sync::atomic::Ordering::SeqCst) > due {
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
        self.wake_at
            .store(ns.max(1), std::sync::atomic::Ordering::SeqCst);
        let empty = self
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty();
        if !empty {
            self.wake_at.store(0, std::sync::atomic::Ordering::SeqCst);
        }
        empty
    }

    fn awake(&self) {
        self.wake_at.store(0, std::sync::atomic::Ordering::SeqCst);
    }
}

struct Req {
    tx: Out,
    arrival: Instant,
    faults: FaultPlan,
    seqs_left: usize,
    seq_keys: Vec<u64>,
    prompt_tokens: u64,
    produced: u64,
    scheduled: Option<Instant>,
    first: Option<Instant>,
    last: Option<Instant>,
    offset: Duration,
    mid_done: bool,
    any_stop: bool,
    /// A reset is scheduled; nothing else is sent.
    reset_pending: bool,
}

struct Seq {
    req: u64,
    choice: u32,
    prompt_len: u32,
    hashes: Vec<u64>,
    /// Prompt tokens whose KV exists (cache hits + prefilled).
    computed: u32,
    registered: usize,
    target: u32,
    finish: Finish,
    generated: u32,
    out_seed: u64,
    alloc: Alloc,
    arrival: Instant,
    /// Fixed mode: when the next event is due.
    next_at: Instant,
}

enum Timed {
    FixedNext(u64),
    /// An emission held back by a stall; carries its channel so that it is delivered even
    /// after the engine has finished the request.
    Deliver(Out, Emit),
}

struct Entry {
    at: Instant,
    n: u64,
    req: u64,
    what: Timed,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.n) == (o.at, o.n)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.n).cmp(&(o.at, o.n))
    }
}

struct Step {
    end: Instant,
    prefill: Vec<(u64, u32)>,
    decode: Vec<u64>,
}

struct Engine {
    cfg: EngineConfig,
    stats: Arc<Stats>,
    cache: PrefixCache,
    hasher: BlockHasher,
    reqs: IdMap<Req>,
    seqs: IdMap<Seq>,
    next_seq: u64,
    waiting: VecDeque<u64>,
    running: Vec<u64>,
    heap: BinaryHeap<Reverse<Entry>>,
    heap_n: u64,
    step: Option<Step>,
    last_step_end: Option<Instant>,
    out: Batch,
    out_tx: UnboundedSender<Batch>,
    /// Sink events due in this wake-up, in time order.
    sink_now: SinkBatch,
    sink_marks: Marks,
    sink_out: Vec<SinkBatch>,
    writer_txs: Vec<mpsc::Sender<SinkBatch>>,
}

/// Starts the engine thread (requests come as [`Cmd::Submit`]).
pub fn spawn(
    cfg: EngineConfig,
    stats: Arc<Stats>,
    out_tx: UnboundedSender<Batch>,
) -> std::io::Result<(mpsc::Sender<Cmd>, std::thread::JoinHandle<()>)> {
    let inbox = Arc::new(Inbox::new(Inbox::lead(&cfg)));
    spawn_with_inbox(cfg, stats, out_tx, inbox)
}

/// Starts the engine thread, which also takes requests from `inbox` ([`Inbox::submit`]).
pub fn spawn_with_inbox(
    cfg: EngineConfig,
    stats: Arc<Stats>,
    out_tx: UnboundedSender<Batch>,
    inbox: Arc<Inbox>,
) -> std::io::Result<(mpsc::Sender<Cmd>, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel();
    let mut writer_txs = Vec::new();
    let mut writers = Vec::new();
    for i in 0..cfg.writers {
        let (wtx, wrx) = mpsc::channel::<SinkBatch>();
        let realtime = cfg.realtime;
        let st = stats.clone();
        writers.push(
            std::thread::Builder::new()
                .name(format!("mock-writer-{i}"))
                .spawn(move || {
                    crate::thread_timing::precise(true);
                    if realtime && !crate::thread_timing::realtime() {
                        st.realtime_failed.store(true, Relaxed);
                    }
                    writer_loop(wrx);
                })?,
        );
        writer_txs.push(wtx);
    }
    let handle = std::thread::Builder::new()
        .name("mock-engine".into())
        .spawn(move || {
            // Timed waits wake within microseconds instead of the default 50 us slack, so the
            // clock needs only a short spin before each deadline; a short EEVDF slice gets the
            // thread onto a busy CPU sooner when a deadline comes.
            crate::thread_timing::precise(true);
            if cfg.realtime && !crate::thread_timing::realtime() {
                stats.realtime_failed.store(true, Relaxed);
            }
            let mut e = Engine {
                cache: PrefixCache::new(cfg.kv_blocks, cfg.block_size),
                cfg,
                stats,
                hasher: BlockHasher::xxh3(),
                reqs: IdMap::default(),
                seqs: IdMap::default(),
                next_seq: 0,
                waiting: VecDeque::new(),
                running: Vec::new(),
                heap: BinaryHeap::new(),
                heap_n: 0,
                step: None,
                last_step_end: None,
                out: Vec::new(),
                out_tx,
                sink_now: Vec::new(),
                sink_marks: Marks::default(),
                sink_out: (0..writer_txs.len()).map(|_| Vec::new()).collect(),
                writer_txs,
            };
            e.run(rx, &inbox);
            // Requests queued after the last look are dropped with the engine (their responses
            // end as on shutdown); later submits find no engine to wake and fail.
            inbox
                .wake_at
                .store(u64::MAX, std::sync::atomic::Ordering::SeqCst);
            drop(inbox.take());
            // Writers end once their queue is empty and closed; every queued write is done
            // before the engine thread (which shutdown waits for) ends.
            drop(e);
            for w in writers {
                let _ = w.join();
            }
        })?;
    Ok((tx, handle))
}

/// xxh3 of the prompt's ids as little-endian bytes (the output tokens' seed).
fn prompt_hash(prompt: &[u32]) -> u64 {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: a u32 slice is readable as 4 bytes per element, which are its little-endian
        // bytes on this target; the length cannot overflow (it is the slice's own size).
        let bytes = unsafe {
            std::slice::from_raw_parts(prompt.as_ptr() as *const u8, std::mem::size_of_val(prompt))
        };
        xxhash_rust::xxh3::xxh3_64(bytes)
    }
    #[cfg(not(target_endian = "little"))]
    {
        xxhash_rust::xxh3::xxh3_64(
            &prompt
                .iter()
                .flat_map(|t| t.to_le_bytes())
                .collect::<Vec<u8>>(),
        )
    }
}

fn token_id(out_seed: u64, i: u32, vocab: u32) -> u32 {
    (xxhash_rust::xxh3::xxh3_64_with_seed(&i.to_le_bytes(), out_seed) % u64::from(vocab.max(1)))
        as u32
}

/// Output length and finish reason for one sequence (see the module doc).
pub fn output_len(s: &SeqIn, out_seed: u64, eos_prob: f64) -> (u32, Finish) {
    let max = s.max_tokens.max(1);
    if s.ignore_eos || eos_prob <= 0.0 || s.min_tokens >= max {
        return (max, Finish::Length);
    }
    let Ok(geo) = rand_distr::Geometric::new(eos_prob.min(1.0)) else {
        return (max, Finish::Length);
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(out_seed);
    let extra = geo.sample(&mut rng);
    let len = u64::from(s.min_tokens) + 1 + extra;
    if len < u64::from(max) {
        (len as u32, Finish::Stop)
    } else {
        (max, Finish::Length)
    }
}

/// Delay between the last token before an injected reset and the reset itself.
const RESET_GRACE: Duration = Duration::from_millis(20);

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Engine {
    fn run(&mut self, rx: mpsc::Receiver<Cmd>, inbox: &Inbox) {
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
            if !self.out.is_empty() {
                let batch = std::mem::take(&mut self.out);
                if self.out_tx.send(batch).is_err() {
                    return; // the HTTP side is gone
                }
            }
            self.write_sinks();
            // Coalescing: the next hand-over happens no sooner than `coalesce` after this one, so
            // events due within that window go out together (one wake-up for several) and each
            // is at most `coalesce` late; an isolated event is still handed over on time.
            let wake = self.next_wake().map(|t| t.max(now + self.cfg.coalesce));
            if !inbox.publish(wake) {
                continue; // requests arrived meanwhile
            }
            let cmd = match wake {
                None => match rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => return,
                },
                Some(t) => {
                    let now = Instant::now();
                    if t <= now {
                        None
                    } else if t - now > self.cfg.spin {
                        match rx.recv_timeout(t - now - self.cfg.spin) {
                            Ok(c) => Some(c),
                            Err(mpsc::RecvTimeoutError::Timeout) => None,
                            Err(mpsc::RecvTimeoutError::Disconnected) => return,
                        }
                    } else {
                        while Instant::now() < t {
                            std::hint::spin_loop();
                        }
                        None
                    }
                }
            };
            inbox.awake();
            match cmd {
                Some(Cmd::Shutdown) => return,
                Some(c) => self.handle(c),
                None => {}
            }
        }
    }

    fn next_wake(&self) -> Option<Instant> {
        let h = self.heap.peek().map(|Reverse(e)| e.at);
        let s = self.step.as_ref().map(|s| s.end);
        let idle_start = if self.step.is_none() && !self.waiting.is_empty() {
            self.idle_start()
        } else {
            None
        };
        [h, s, idle_start].into_iter().flatten().min()
    }

    fn idle_start(&self) -> Option<Instant> {
        let first = self.waiting.front().and_then(|k| self.seqs.get(k))?;
        Some(match self.last_step_end {
            Some(e) if e > first.arrival => e,
            _ => first.arrival,
        })
    }

    fn handle(&mut self, c: Cmd) {
        match c {
            Cmd::Submit(s) => self.submit(*s),
            Cmd::Cancel(id) => self.abort(id),
            Cmd::Shutdown | Cmd::Wake => {}
        }
    }

    fn push(&mut self, at: Instant, req: u64, what: Timed) {
        self.heap_n += 1;
        self.heap.push(Reverse(Entry {
            at,
            n: self.heap_n,
            req,
            what,
        }));
    }

    fn submit(&mut self, mut s: Submit) {
        // The engine sees the request after the front end's latency (cost-model mode only).
        if self.cfg.fixed.is_none() {
            s.arrival += Duration::from_secs_f64(self.cfg.cost.request_overhead_ms / 1e3);
        }
        let prompt_tokens: u64 = s.seqs.iter().map(|q| q.prompt.len() as u64).sum();
        let mut req = Req {
            tx: s.tx,
            arrival: s.arrival,
            seqs_left: s.seqs.len(),
            seq_keys: Vec::with_capacity(s.seqs.len()),
            prompt_tokens,
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
        for (choice, q) in s.seqs.into_iter().enumerate() {
            let phash = prompt_hash(&q.prompt);
            let out_seed = self.cfg.seed ^ phash ^ (choice as u64).wrapping_mul(0x9E37_79B9);
            let (target, finish) = output_len(&q, out_seed, self.cfg.eos_prob);
            let key = self.next_seq;
            self.next_seq += 1;
            let seq = Seq {
                req: s.id,
                choice: choice as u32,
                prompt_len: q.prompt.len() as u32,
                hashes: self
                    .hasher
                    .chain(&q.prompt, self.cfg.block_size as usize, false),
                computed: 0,
                registered: 0,
                target,
                finish,
                generated: 0,
                out_seed,
                alloc: Alloc::default(),
                arrival: s.arrival,
                next_at: s.arrival,
            };
            req.seq_keys.push(key);
            self.seqs.insert(key, seq);
            if let Some((ttft, _)) = self.cfg.fixed {
                self.fixed_admit(key, &mut req, ttft);
            } else {
                self.waiting.push_back(key);
            }
        }
        self.reqs.insert(s.id, req);
        self.update_gauges();
    }

    /// Fixed mode: prefix-cache accounting and the first event's deadline.
    fn fixed_admit(&mut self, key: u64, req: &mut Req, ttft: Duration) {
        let seq = self.seqs.get_mut(&key).expect("just inserted");
        let need = self.cache.blocks_for(seq.prompt_len);
        let hits = match self.cache.acquire(&seq.hashes, seq.prompt_len, need) {
            Some(a) => {
                let h = a.hit_tokens;
                seq.alloc = a;
                h
            }
            None => 0,
        };
        seq.computed = hits;
        self.stats
            .prefix_queries
            .fetch_add(u64::from(seq.prompt_len), Relaxed);
        self.stats.prefix_hits.fetch_add(u64::from(hits), Relaxed);
        self.stats
            .prompt_tokens
            .fetch_add(u64::from(seq.prompt_len), Relaxed);
        req.scheduled = Some(req.arrival);
        self.stats.queue.observe(0.0);
        seq.next_at = req.arrival + ttft + req.offset;
        let at = seq.next_at;
        let rid = seq.req;
        self.push(at, rid, Timed::FixedNext(key));
    }

    fn update_gauges(&self) {
        if self.cfg.fixed.is_some() {
            self.stats.running.store(self.reqs.len() as u64, Relaxed);
            self.stats.waiting.store(0, Relaxed);
        } else {
            self.stats.running.store(self.running.len() as u64, Relaxed);
            self.stats.waiting.store(self.waiting.len() as u64, Relaxed);
        }
        self.stats.set_kv_usage(self.cache.usage());
    }

    /// Everything due at or before `now`, in time order.
    fn progress(&mut self, now: Instant) {
        loop {
            let step_due = self.step.as_ref().map(|s| s.end).filter(|&e| e <= now);
            let heap_due = self
                .heap
                .peek()
                .map(|Reverse(e)| e.at)
                .filter(|&t| t <= now);
            match (step_due, heap_due) {
                (Some(s), Some(h)) if h < s => self.pop_heap(),
                (Some(_), _) => self.finish_step(),
                (None, Some(_)) => self.pop_heap(),
                (None, None) => {
                    if self.step.is_none() && self.cfg.fixed.is_none() {
                        if let Some(start) = self.idle_start().filter(|&t| t <= now) {
                            self.plan_step(start);
                            continue;
                        }
                    }
                    break;
                }
            }
        }
    }

    /// Hands an event over (into the current batch), recording how late the engine clock is in
    /// doing so; false when the response is gone.
    fn send(&mut self, tx: Out, e: Emit) -> bool {
        let late = Instant::now().saturating_duration_since(e.at());
        self.stats.record_dispatch(late.as_nanos());
        match tx {
            Out::Chan(tx) => {
                let ok = !tx.is_closed();
                self.out.push((tx, e));
                ok
            }
            // Written at the end of this wake-up's `progress` (see `write_sinks`); a client
            // found gone there is cancelled then.
            Out::Sink(s) => {
                self.sink_now.push((s.key(), s, e));
                true
            }
        }
    }

    /// Writes this wake-up's stream events: a small batch on this thread (no hand-over at all),
    /// a large one spread over the writer threads. A response with events still queued at a
    /// writer keeps going through that writer.
    fn write_sinks(&mut self) {
        if self.sink_now.is_empty() {
            return;
        }
        let n = self.writer_txs.len();
        let local = n == 0 || self.sink_now.len() <= DIRECT_MAX;
        let mut gone = Vec::new();
        // The batch's buffer is kept for the next hand-over (no regrowth per wake-up).
        let mut batch = std::mem::take(&mut self.sink_now);
        // All of one response's events in this batch go the same way (its `queued` count
        // changes only below, and only for responses sent to a writer).
        flush_marks(&batch, &mut self.sink_marks);
        for (i, (key, sink, e)) in batch.drain(..).enumerate() {
            if local && sink.queued().load(Relaxed) == 0 {
                if !sink.emit(e, self.sink_marks.flush[i]) {
                    gone.push(key);
                }
            } else {
                sink.queued().fetch_add(1, Relaxed);
                let w = (key % n as u64) as usize;
                self.sink_out[w].push((key, sink, e));
            }
        }
        for (w, b) in self.sink_out.iter_mut().enumerate() {
            if !b.is_empty() {
                let _ = self.writer_txs[w].send(std::mem::take(b));
            }
        }
        self.sink_now = batch;
        for rid in gone {
            self.abort(rid);
        }
    }

    fn pop_heap(&mut self) {
        let Some(Reverse(e)) = self.heap.pop() else {
            return;
        };
        match e.what {
            Timed::Deliver(tx, emit) => {
                let reset = matches!(emit, Emit::Reset { .. });
                if !self.send(tx, emit) && !reset {
                    self.abort(e.req);
                }
                if reset {
                    self.drop_req(e.req);
                }
            }
            Timed::FixedNext(key) => self.fixed_event(key, e.at),
        }
    }

    /// Fixed mode: one event of one sequence.
    fn fixed_event(&mut self, key: u64, at: Instant) {
        let Some((_, itl)) = self.cfg.fixed else {
            return;
        };
        let k = self.cfg.tokens_per_event.max(1);
        let Some(seq) = self.seqs.get_mut(&key) else {
            return;
        };
        let first = seq.generated == 0;
        if first {
            // The prompt is "computed" at the first token: register its full blocks.
            for (i, h) in seq.hashes.iter().enumerate() {
                if let Some(&b) = seq.alloc.blocks.get(i) {
                    self.cache.register(b, *h);
                }
            }
        }
        let n = if first { 1 } else { k }.min(seq.target - seq.generated);
        let ids: Vec<u32> = (seq.generated..seq.generated + n)
            .map(|i| token_id(seq.out_seed, i, self.cfg.vocab))
            .collect();
        seq.generated += n;
        let done = seq.generated >= seq.target;
        let finish = done.then_some(seq.finish);
        let (rid, choice) = (seq.req, seq.choice);
        let added = self.deliver(rid, choice, ids, finish, at, true);
        if done {
            self.finish_seq(key);
        } else if let Some(seq) = self.seqs.get_mut(&key) {
            seq.next_at = at + itl + added;
            let next = seq.next_at;
            self.push(next, rid, Timed::FixedNext(key));
        }
    }

    /// Hands tokens of one choice to its request at `at`; applies stall/reset faults and
    /// finishes the request after its last choice. Returns the stall added to later events.
    fn deliver(
        &mut self,
        rid: u64,
        choice: u32,
        ids: Vec<u32>,
        finish: Option<Finish>,
        at: Instant,
        direct: bool,
    ) -> Duration {
        let Some(req) = self.reqs.get_mut(&rid).filter(|r| !r.reset_pending) else {
            return Duration::ZERO;
        };
        let n = ids.len() as u64;
        self.stats.generation_tokens.fetch_add(n, Relaxed);
        match req.last {
            None => self.stats.ttft.observe((at - req.arrival).as_secs_f64()),
            Some(prev) => self.stats.itl.observe((at - prev).as_secs_f64()),
        }
        req.first.get_or_insert(at);
        req.last = Some(at);
        req.produced += n;
        if finish == Some(Finish::Stop) {
            req.any_stop = true;
        }
        let emit = Emit::Tokens {
            at,
            choice,
            ids,
            finish,
        };
        let mut ok = true;
        if direct {
            let tx = req.tx.clone();
            ok = self.send(tx, emit);
        } else {
            self.heap_n += 1;
            self.heap.push(Reverse(Entry {
                at,
                n: self.heap_n,
                req: rid,
                what: Timed::Deliver(req.tx.clone(), emit),
            }));
        }
        let req = self.reqs.get_mut(&rid).expect("present above");
        let mut added = Duration::ZERO;
        if let Some((after, d)) = req.faults.stall_mid {
            if !req.mid_done && req.produced >= u64::from(after) {
                req.mid_done = true;
                added = Duration::from_secs_f64(d / 1e3);
                req.offset += added;
            }
        }
        if let Some(after) = req.faults.reset_after {
            if req.produced >= u64::from(after) {
                // The RST follows after a grace period so that the tokens before it reach the
                // client (a TCP reset makes the peer discard data it has not read yet).
                let at = at + RESET_GRACE;
                let tx = req.tx.clone();
                self.push(at, rid, Timed::Deliver(tx, Emit::Reset { at }));
                self.reqs
                    .get_mut(&rid)
                    .expect("present above")
                    .reset_pending = true;
                self.stats.aborted.fetch_add(1, Relaxed);
                self.detach_req(rid);
                return added;
            }
        }
        if !ok {
            self.abort(rid);
            return added;
        }
        if finish.is_some() {
            req.seqs_left = req.seqs_left.saturating_sub(1);
            if req.seqs_left == 0 {
                let done = self.done_emit(rid, at);
                if direct {
                    if let Some(tx) = self.reqs.get(&rid).map(|r| r.tx.clone()) {
                        self.send(tx, done);
                    }
                } else {
                    let tx = self.reqs[&rid].tx.clone();
                    self.push(at, rid, Timed::Deliver(tx, done));
                }
                self.complete_req(rid);
            }
        }
        added
    }

    fn done_emit(&self, rid: u64, at: Instant) -> Emit {
        let r = &self.reqs[&rid];
        let scheduled = r.scheduled.unwrap_or(r.arrival);
        let first = r.first.unwrap_or(at);
        let last = r.last.unwrap_or(at);
        let queue_ms = ms(scheduled - r.arrival);
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
                queue_ms,
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

    fn complete_req(&mut self, rid: u64) {
        if let Some(r) = self.reqs.get(&rid) {
            if let Some(l) = r.last {
                self.stats.e2e.observe((l - r.arrival).as_secs_f64());
            }
            if r.any_stop {
                self.stats.success_stop.fetch_add(1, Relaxed);
            } else {
                self.stats.success_length.fetch_add(1, Relaxed);
            }
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

    /// Frees a request's sequences but keeps its channel until the pending reset is delivered.
    fn detach_req(&mut self, rid: u64) {
        let keys = match self.reqs.get_mut(&rid) {
            Some(r) => std::mem::take(&mut r.seq_keys),
            None => return,
        };
        for k in keys {
            self.finish_seq(k);
        }
        self.update_gauges();
    }

    /// Forgets a request and frees its sequences' blocks.
    fn drop_req(&mut self, rid: u64) {
        if let Some(r) = self.reqs.remove(&rid) {
            for k in r.seq_keys {
                self.finish_seq(k);
            }
        }
        self.update_gauges();
    }

    fn finish_seq(&mut self, key: u64) {
        if let Some(s) = self.seqs.remove(&key) {
            self.cache.release(&s.alloc.blocks);
            if let Some(p) = self.running.iter().position(|&k| k == key) {
                self.running.remove(p);
            } else if let Some(p) = self.waiting.iter().position(|&k| k == key) {
                self.waiting.remove(p);
            }
        }
    }

    /// Plans the step starting at `start` (cost-model mode).
    fn plan_step(&mut self, start: Instant) {
        let mut budget = self.cfg.max_num_batched_tokens.max(1);
        let mut prefill = Vec::new();
        let mut decode = Vec::new();
        let mut prefill_tokens = 0u64;
        let mut context = 0u64;
        for &k in &self.running {
            let s = &self.seqs[&k];
            if s.computed >= s.prompt_len {
                if budget == 0 {
                    continue;
                }
                budget -= 1;
                decode.push(k);
                context += u64::from(s.prompt_len + s.generated);
            }
        }
        for &k in &self.running {
            let s = &self.seqs[&k];
            if s.computed < s.prompt_len && budget > 0 {
                let chunk = (s.prompt_len - s.computed).min(budget);
                budget -= chunk;
                prefill.push((k, chunk));
                prefill_tokens += u64::from(chunk);
                context += u64::from(s.computed + chunk);
            }
        }
        while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(&k) = self.waiting.front() else {
                break;
            };
            let s = &self.seqs[&k];
            if s.arrival > start {
                break;
            }
            let need = self.cache.blocks_for(s.prompt_len + s.target);
            let Some(alloc) = self.cache.acquire(&s.hashes, s.prompt_len, need) else {
                break;
            };
            self.waiting.pop_front();
            let s = self.seqs.get_mut(&k).expect("waiting seq exists");
            s.computed = alloc.hit_tokens;
            s.registered = (alloc.hit_tokens / self.cfg.block_size) as usize;
            s.alloc = alloc;
            self.stats
                .prefix_queries
                .fetch_add(u64::from(s.prompt_len), Relaxed);
            self.stats
                .prefix_hits
                .fetch_add(u64::from(s.computed), Relaxed);
            self.stats
                .prompt_tokens
                .fetch_add(u64::from(s.prompt_len), Relaxed);
            if let Some(r) = self.reqs.get_mut(&s.req) {
                if r.scheduled.is_none() {
                    r.scheduled = Some(start);
                    self.stats.queue.observe((start - r.arrival).as_secs_f64());
                }
            }
            let chunk = (s.prompt_len - s.computed).min(budget);
            budget -= chunk;
            prefill.push((k, chunk));
            prefill_tokens += u64::from(chunk);
            context += u64::from(s.computed + chunk);
            self.running.push(k);
        }
        let seqs = (prefill.len() + decode.len()) as u64;
        if seqs == 0 {
            if self.running.is_empty() {
                // The head of the queue cannot fit even in an empty cache (configuration allows
                // no such request; never spin on it).
                if let Some(&k) = self.waiting.front() {
                    if let Some(rid) = self.seqs.get(&k).map(|s| s.req) {
                        self.abort(rid);
                    }
                }
            }
            self.last_step_end = Some(start);
            self.update_gauges();
            return;
        }
        // At most an hour per step, whatever the cost knobs say.
        let dur = self
            .cfg
            .cost
            .step_ms(prefill_tokens, seqs, context)
            .clamp(0.0, 3_600_000.0);
        self.step = Some(Step {
            end: start + Duration::from_secs_f64(dur / 1e3),
            prefill,
            decode,
        });
        self.update_gauges();
    }

    fn finish_step(&mut self) {
        let Some(step) = self.step.take() else {
            return;
        };
        let end = step.end;
        let bs = self.cfg.block_size;
        let k_tokens = self.cfg.tokens_per_event.max(1);
        // (request, choice, token ids, finish, sequence key)
        type Out = (u64, u32, Vec<u32>, Option<Finish>, u64);
        let mut out: Vec<Out> = Vec::new();
        for (key, chunk) in step.prefill {
            let Some(s) = self.seqs.get_mut(&key) else {
                continue;
            };
            s.computed += chunk;
            let full = ((s.computed / bs) as usize).min(s.hashes.len());
            while s.registered < full {
                if let Some(&b) = s.alloc.blocks.get(s.registered) {
                    self.cache.register(b, s.hashes[s.registered]);
                }
                s.registered += 1;
            }
            if s.computed >= s.prompt_len {
                let id = token_id(s.out_seed, 0, self.cfg.vocab);
                s.generated = 1;
                let fin = (s.generated >= s.target).then_some(s.finish);
                out.push((s.req, s.choice, vec![id], fin, key));
            }
        }
        for key in step.decode {
            let Some(s) = self.seqs.get_mut(&key) else {
                continue;
            };
            let n = k_tokens.min(s.target.saturating_sub(s.generated));
            if n == 0 {
                continue;
            }
            let ids = (s.generated..s.generated + n)
                .map(|i| token_id(s.out_seed, i, self.cfg.vocab))
                .collect();
            s.generated += n;
            let fin = (s.generated >= s.target).then_some(s.finish);
            out.push((s.req, s.choice, ids, fin, key));
        }
        for (rid, choice, ids, fin, key) in out {
            let offset = self
                .reqs
                .get(&rid)
                .map(|r| r.offset)
                .unwrap_or(Duration::ZERO);
            let at = end + offset;
            self.deliver(rid, choice, ids, fin, at, offset.is_zero());
            if fin.is_some() {
                self.finish_seq(key);
            }
        }
        self.last_step_end = Some(end);
        if !self.running.is_empty()
            || self
                .waiting
                .front()
                .is_some_and(|k| self.seqs[k].arrival <= end)
        {
            self.plan_step(end);
        } else {
            self.update_gauges();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_model_calibration() {
        let c = CostModel::default();
        let ttft = c.request_overhead_ms + c.step_ms(137, 1, 137);
        assert!((ttft - 70.0).abs() < 1.0, "{ttft}");
        let tpot = c.step_ms(0, 1, 138);
        assert!((tpot - 8.0).abs() < 0.2, "{tpot}");
        assert!(c.step_ms(0, 64, 64 * 1000) > 2.0 * tpot);
        // Long prompts and contexts stay within an accelerator's reach: a 7k-token prompt in
        // 2,048-token chunks is under half a second, a 100k-token context step under 20 ms.
        let long = c.request_overhead_ms
            + (0..4)
                .map(|k| {
                    let chunk = (7000 - 2048 * k).min(2048);
                    c.step_ms(chunk, 1, 2048 * k + chunk)
                })
                .sum::<f64>();
        assert!(long < 500.0, "{long}");
        assert!(c.step_ms(0, 1, 100_000) < 20.0);
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
                let cfg = EngineConfig {
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
                    spin: Duration::ZERO,
                    realtime: false,
                    coalesce: Duration::from_micros(50),
                    writers: 0,
                };
                let stats = Arc::new(Stats::new("m"));
                let (btx, mut brx) = tokio::sync::mpsc::unbounded_channel::<Batch>();
                let fwd = std::thread::spawn(move || {
                    while let Some(b) = brx.blocking_recv() {
                        for (t, e) in b {
                            let _ = t.send(e);
                        }
                    }
                });
                let (tx, th) = spawn(cfg, stats.clone(), btx).unwrap();
                let mut rxs = Vec::new();
                for (i, (plen, max_tokens, family)) in reqs.iter().enumerate() {
                    let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
                    // prompts of one family share a prefix
                    let prompt: Vec<u32> = (0..*plen).map(|t| t + family * 10_000).collect();
                    tx.send(Cmd::Submit(Box::new(Submit {
                        id: i as u64,
                        arrival: Instant::now(),
                        seqs: vec![SeqIn {
                            prompt,
                            max_tokens: (*max_tokens).min(max_len - plen),
                            min_tokens: 0,
                            ignore_eos: true,
                        }],
                        faults: FaultPlan::default(),
                        tx: Out::Chan(etx),
                    })))
                    .unwrap();
                    rxs.push(erx);
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
                fwd.join().unwrap();
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
        let cfg = EngineConfig {
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
            spin: Duration::ZERO,
            realtime: false,
            coalesce: Duration::from_micros(50),
            writers: 0,
        };
        let inbox = Arc::new(Inbox::new(Inbox::lead(&cfg)));
        assert_eq!(inbox.lead, Duration::from_millis(30));
        let stats = Arc::new(Stats::new("m"));
        let (btx, mut brx) = tokio::sync::mpsc::unbounded_channel::<Batch>();
        let fwd = std::thread::spawn(move || {
            while let Some(b) = brx.blocking_recv() {
                for (t, e) in b {
                    let _ = t.send(e);
                }
            }
        });
        let (tx, th) = spawn_with_inbox(cfg, stats, btx, inbox.clone()).unwrap();
        let mut rxs = Vec::new();
        for i in 0..60u64 {
            if i >= 40 {
                std::thread::sleep(Duration::from_millis(3)); // stragglers while streams run
            }
            let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
            let arrival = Instant::now();
            inbox
                .submit(
                    &tx,
                    Submit {
                        id: i,
                        arrival,
                        seqs: vec![SeqIn {
                            prompt: vec![1, 2, 3, i as u32],
                            max_tokens: 4,
                            min_tokens: 0,
                            ignore_eos: true,
                        }],
                        faults: FaultPlan::default(),
                        tx: Out::Chan(etx),
                    },
                )
                .unwrap();
            rxs.push((arrival, erx));
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
        fwd.join().unwrap();
        // after the engine ended, a submit fails instead of waiting forever
        let (etx, _erx) = tokio::sync::mpsc::unbounded_channel();
        let r = inbox.submit(
            &tx,
            Submit {
                id: 99,
                arrival: Instant::now(),
                seqs: Vec::new(),
                faults: FaultPlan::default(),
                tx: Out::Chan(etx),
            },
        );
        assert!(r.is_err());
    }

    struct NoSink(std::sync::atomic::AtomicU32);
    impl Sink for NoSink {
        fn emit(&self, _: Emit, _: bool) -> bool {
            true
        }
        fn key(&self) -> u64 {
            0
        }
        fn queued(&self) -> &std::sync::atomic::AtomicU32 {
            &self.0
        }
    }

    #[test]
    fn each_response_flushes_on_its_last_event_in_a_batch() {
        let sink: Arc<dyn Sink> = Arc::new(NoSink(Default::default()));
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

    #[test]
    fn prompt_hash_is_xxh3_of_little_endian_ids() {
        for p in [vec![], vec![7u32], vec![1, 2, 3, u32::MAX, 0x0102_0304]] {
            let bytes: Vec<u8> = p.iter().flat_map(|t| t.to_le_bytes()).collect();
            assert_eq!(prompt_hash(&p), xxhash_rust::xxh3::xxh3_64(&bytes));
        }
    }

    #[test]
    fn output_len_rules() {
        let s = SeqIn {
            prompt: vec![1],
            max_tokens: 50,
            min_tokens: 0,
            ignore_eos: true,
        };
        assert_eq!(output_len(&s, 1, 0.5), (50, Finish::Length));
        let s = SeqIn {
            ignore_eos: false,
            min_tokens: 10,
            ..s
        };
        for seed in 0..200 {
            let (n, f) = output_len(&s, seed, 0.2);
            assert!((11..=50).contains(&n), "{n}");
            assert_eq!(f == Finish::Stop, n < 50);
            assert_eq!(output_len(&s, seed, 0.2), (n, f), "deterministic");
        }
        assert!((0..200).any(|seed| output_len(&s, seed, 0.2).1 == Finish::Stop));
    }
}
