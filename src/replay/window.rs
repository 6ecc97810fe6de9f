//! The body builder: request bodies made on their own thread, a bounded window ahead of the
//! clock, and freed once their request has been sent.
//!
//! The builder walks the plan in order and builds a body while it is due within
//! [`LEAD`] of schedule time and the bodies built but not yet released hold under
//! [`MAX_BYTES`] (whichever is smaller); before t0 it fills that window. The dispatcher takes a
//! body before it sleeps to the request's deadline, so no body is built on the send path; a body
//! that is not ready when the dispatcher wants it is waited for and counted as late (the drift of
//! that send shows by how much). Each body lives until its request's task ends.

use super::request::{build, BodyOptions, BuiltRequest, Prompts};
use super::schedule::PlannedSend;
use crate::trace::{Request, Trace};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How far ahead of the clock (schedule time) bodies are built.
pub const LEAD: Duration = Duration::from_secs(3);
/// Most bytes of bodies built and not yet released.
pub const MAX_BYTES: usize = 128 << 20;

/// The window's limits ([`LEAD`], [`MAX_BYTES`]; tests make them small).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub lead: Duration,
    pub max_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            lead: LEAD,
            max_bytes: MAX_BYTES,
        }
    }
}

/// What the builder did, for the result file.
#[derive(Debug, Default)]
pub struct BuilderStats {
    pub built: AtomicU64,
    /// Bodies ready only after their request's deadline (the dispatcher waited for them).
    pub late: AtomicU64,
    /// Least time from a body being ready to its request's deadline, ns (negative: late).
    pub min_lead_ns: AtomicI64,
    /// Text prompts that do not re-encode exactly.
    pub inexact: AtomicU64,
    /// Most body bytes built and not yet released (the window itself: at most
    /// `max_bytes` plus one body).
    pub peak_held_bytes: AtomicUsize,
    /// Body bytes alive now (built and not yet dropped: the window, and the requests released
    /// and not yet finished), and the most at any time.
    pub live_bytes: AtomicUsize,
    pub peak_live_bytes: AtomicUsize,
    pub peak_live_bodies: AtomicUsize,
    live_bodies: AtomicUsize,
}

/// A built body; dropping it (when its request's task ends) frees it and is counted.
pub struct Body {
    pub req: BuiltRequest,
    stats: Arc<BuilderStats>,
}

impl Body {
    fn new(req: BuiltRequest, stats: Arc<BuilderStats>) -> Body {
        let bytes = req.body.len();
        let live = stats.live_bytes.fetch_add(bytes, Relaxed) + bytes;
        stats.peak_live_bytes.fetch_max(live, Relaxed);
        let n = stats.live_bodies.fetch_add(1, Relaxed) + 1;
        stats.peak_live_bodies.fetch_max(n, Relaxed);
        Body { req, stats }
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        self.stats
            .live_bytes
            .fetch_sub(self.req.body.len(), Relaxed);
        self.stats.live_bodies.fetch_sub(1, Relaxed);
    }
}

/// Records handed to the builder together and freed together: (trace index, record).
type Chunk = Vec<(usize, Option<Request>)>;

/// Records per [`Chunk`].
const CHUNK: usize = 4096;

/// The trace's records in plan order, in chunks (records the plan does not send are freed).
fn in_plan_order(trace: Trace, plan: &[PlannedSend]) -> Vec<Chunk> {
    let mut records: Vec<Option<Request>> = trace.requests.into_iter().map(Some).collect();
    plan.chunks(CHUNK)
        .map(|c| {
            c.iter()
                .map(|p| (p.index, records.get_mut(p.index).and_then(Option::take)))
                .collect()
        })
        .collect()
}

#[derive(Default)]
struct State {
    ready: HashMap<usize, Arc<Body>>,
    /// Bytes in `ready`.
    held: usize,
    /// The slot the dispatcher waits for, if any.
    wanted: Option<usize>,
    /// Slots built so far (the builder goes in plan order).
    next: usize,
    failed: Option<String>,
    stop: bool,
}

/// Marks the builder's end, however it ends: a dispatcher waiting for a body it will never build
/// (the builder stopped early or panicked) gets an error instead of waiting forever.
struct Ended<'a>(&'a Window);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        if st.next < self.0.deadlines.len() && st.failed.is_none() {
            st.failed = Some(format!("the body builder ended before request {}", st.next));
        }
        drop(st);
        self.0.changed.notify_all();
    }
}

/// The window between the builder thread and the dispatcher.
pub struct Window {
    state: Mutex<State>,
    changed: Condvar,
    t0: OnceLock<Instant>,
    pub stats: Arc<BuilderStats>,
    deadlines: Vec<u64>,
    limits: Limits,
}

impl Window {
    /// Starts the builder thread over `plan` (slot k builds `trace.requests[plan[k].index]`).
    /// The builder owns the trace's records, in plan order: they are freed a chunk at a time as
    /// their bodies are built (a record's prompt ids, recorded body and response at once).
    pub fn start(
        trace: Trace,
        plan: &[PlannedSend],
        opts: BodyOptions,
        prompts: Prompts,
        limits: Limits,
    ) -> std::io::Result<Arc<Window>> {
        let stats = Arc::new(BuilderStats {
            min_lead_ns: AtomicI64::new(i64::MAX),
            ..Default::default()
        });
        let w = Arc::new(Window {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            t0: OnceLock::new(),
            stats,
            deadlines: plan.iter().map(|p| p.at_ns).collect(),
            limits,
        });
        let records = in_plan_order(trace, plan);
        let me = w.clone();
        std::thread::Builder::new()
            .name("retrace-bodies".into())
            .spawn(move || me.run(records, &opts, &prompts))?;
        Ok(w)
    }

    /// The clock started: deadlines count from `t0`.
    pub fn set_t0(&self, t0: Instant) {
        let _ = self.t0.set(t0);
        self.changed.notify_all();
    }

    /// Schedule time now, ns (0 before t0).
    fn now_ns(&self) -> u64 {
        self.t0.get().map_or(0, |t0| {
            Instant::now().saturating_duration_since(*t0).as_nanos() as u64
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn run(self: &Arc<Self>, records: Vec<Chunk>, opts: &BodyOptions, prompts: &Prompts) {
        let _ended = Ended(self);
        // Each chunk's records are freed once their bodies are built.
        let slots = records.into_iter().flatten().enumerate();
        for (slot, (idx, record)) in slots {
            if !self.wait_for_room(slot) {
                return;
            }
            // A plan index the trace lacks ends the builder (the dispatcher is told).
            let Some(record) = record else { return };
            let built = build(&record, idx as u64, opts, prompts);
            drop(record);
            let body = match built {
                Ok(b) => b,
                Err(e) => {
                    self.lock().failed = Some(format!("request {idx}: {e}"));
                    self.changed.notify_all();
                    return;
                }
            };
            self.stats.built.fetch_add(1, Relaxed);
            self.stats
                .inexact
                .fetch_add(u64::from(!body.exact_prompt), Relaxed);
            let body = Arc::new(Body::new(body, self.stats.clone()));
            self.note_lead(slot);
            let mut st = self.lock();
            st.held += body.req.body.len();
            self.stats.peak_held_bytes.fetch_max(st.held, Relaxed);
            st.ready.insert(slot, body);
            st.next = slot + 1;
            let waiting = st.wanted.is_some();
            drop(st);
            if waiting {
                self.changed.notify_all();
            }
        }
    }

    /// The lead of the body of `slot` over its deadline, once the clock runs.
    fn note_lead(&self, slot: usize) {
        if let Some(t0) = self.t0.get() {
            let now = Instant::now().saturating_duration_since(*t0).as_nanos() as i64;
            let lead = self.deadlines[slot] as i64 - now;
            self.stats.min_lead_ns.fetch_min(lead, Relaxed);
        }
    }

    /// Waits until `slot` may be built: due within the lead and the window has room (at once
    /// when the dispatcher waits for it). False when the run stopped.
    fn wait_for_room(self: &Arc<Self>, slot: usize) -> bool {
        let mut st = self.lock();
        loop {
            // Stopped, or nobody but this thread holds the window (the run was abandoned).
            if st.stop || Arc::strong_count(self) == 1 {
                return false;
            }
            let due_in = self.deadlines[slot].saturating_sub(self.now_ns());
            let lead = self.limits.lead.as_nanos() as u64;
            let room = st.held < self.limits.max_bytes || st.ready.is_empty();
            // The dispatcher waits for this slot or a later one: build regardless.
            if st.wanted.is_some_and(|w| w >= slot) || (room && due_in <= lead) {
                return true;
            }
            // Woken by a release or the clock's start; else when the slot comes within the lead.
            let wait = match self.t0.get() {
                Some(_) if room => Duration::from_nanos(due_in - lead),
                _ => Duration::from_millis(100),
            };
            st = self
                .changed
                .wait_timeout(st, wait.min(Duration::from_millis(100)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The body of `slot` (the dispatcher, before it sleeps to the deadline): waits for the
    /// builder when it is behind, and counts that. Err when a body could not be built.
    pub fn take(&self, slot: usize) -> Result<Arc<Body>, String> {
        let mut st = self.lock();
        let mut waited = false;
        loop {
            if let Some(b) = st.ready.remove(&slot) {
                // The builder waits for room only when the window was full.
                let full = st.held >= self.limits.max_bytes;
                st.held -= b.req.body.len();
                st.wanted = None;
                drop(st);
                if full {
                    self.changed.notify_all();
                }
                let late = waited && self.now_ns() > self.deadlines[slot];
                self.stats.late.fetch_add(u64::from(late), Relaxed);
                return Ok(b);
            }
            if let Some(e) = &st.failed {
                return Err(e.clone());
            }
            waited = true;
            st.wanted = Some(slot);
            self.changed.notify_all();
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Stops the builder (the run ended or failed) and frees the bodies not sent.
    pub fn stop(&self) {
        let mut st = self.lock();
        st.stop = true;
        st.ready.clear();
        st.held = 0;
        drop(st);
        self.changed.notify_all();
    }

    /// Slots built so far.
    pub fn built(&self) -> usize {
        self.lock().next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{Synth, Vocab};
    use crate::trace::{Request, TraceHeader};

    fn window(trace: Trace, plan: &[PlannedSend]) -> Arc<Window> {
        let opts = BodyOptions {
            api: None,
            model: "m".into(),
            model_override: false,
            extra_body: Default::default(),
            keep_original_limits: false,
            overheads: Default::default(),
        };
        let prompts = Prompts::Tokens(Synth::new(Vocab::from_size(1000).unwrap(), 16, 0));
        Window::start(trace, plan, opts, prompts, Limits::default()).unwrap()
    }

    #[test]
    fn a_builder_that_dies_is_an_error_for_the_dispatcher_not_a_hang() {
        let trace = Trace {
            header: TraceHeader::imported(16, true, "t"),
            requests: vec![Request {
                input_tokens: 20,
                output_tokens: 2,
                ..Default::default()
            }],
        };
        // slot 1 names a request the trace does not have: the builder ends there
        let plan = [
            PlannedSend { index: 0, at_ns: 0 },
            PlannedSend { index: 7, at_ns: 0 },
        ];
        let w = window(trace, &plan);
        w.set_t0(Instant::now());
        assert!(w.take(0).is_ok());
        let err = w.take(1).err().expect("no body for slot 1");
        assert!(err.contains("before request 1"), "{err}");
    }
}
