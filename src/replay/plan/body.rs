//! The body builder: request bodies made on their own thread, a bounded window ahead of the
//! clock, and freed once their request has been sent.
//!
//! The builder reads its [`Source`] in plan order and builds a body while it is due within
//! [`LEAD`] of schedule time and the bodies built but not yet released hold under
//! [`MAX_BYTES`] (whichever is smaller); before t0 it fills that window. The dispatcher takes a
//! body before it sleeps to the request's deadline, so no body is built on the send path; a body
//! that is not ready when the dispatcher wants it is waited for and counted as late (the drift of
//! that send shows by how much). Each body lives until its request's task ends.

use crate::replay::http::request::{build, BodyOptions, BuiltRequest, Prompts};
use crate::replay::plan::source::{PlanError, Planned, Source};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How far ahead of the clock (schedule time) bodies are built.
pub(crate) const LEAD: Duration = Duration::from_secs(3);
/// Most bytes of bodies built and not yet released.
pub(crate) const MAX_BYTES: usize = 128 << 20;

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
    pub(crate) late: AtomicU64,
    /// Least time from a body being ready to its request's deadline, ns (negative: late).
    pub(crate) min_lead_ns: AtomicI64,
    /// Text prompts that do not re-encode exactly.
    pub(crate) inexact: AtomicU64,
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

/// A built body and what the run needs to know of its request; dropping it (when its request's
/// task ends) frees it and is counted.
pub(crate) struct Body {
    pub(crate) req: BuiltRequest,
    /// Send offset from t0, ns.
    pub(crate) at_ns: u64,
    pub(crate) tag: Tag,
    stats: Arc<BuilderStats>,
}

/// Where a request's sample goes: its workload index (plan order among the requests that are
/// not side requests; `None` for a side request) and its recorded failure kind.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Tag {
    pub(crate) work: Option<usize>,
    pub(crate) recorded: Option<String>,
}

impl Body {
    fn new(req: BuiltRequest, at_ns: u64, tag: Tag, stats: Arc<BuilderStats>) -> Body {
        let bytes = req.body.len();
        let live = stats.live_bytes.fetch_add(bytes, Relaxed) + bytes;
        stats.peak_live_bytes.fetch_max(live, Relaxed);
        let n = stats.live_bodies.fetch_add(1, Relaxed) + 1;
        stats.peak_live_bodies.fetch_max(n, Relaxed);
        Body {
            req,
            at_ns,
            tag,
            stats,
        }
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

#[derive(Default)]
struct State {
    ready: HashMap<usize, Body>,
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
        if st.next < self.0.planned && st.failed.is_none() {
            st.failed = Some(format!("the body builder ended before request {}", st.next));
        }
        drop(st);
        self.0.changed.notify_all();
    }
}

/// The window between the builder thread and the dispatcher.
pub(crate) struct Window {
    state: Mutex<State>,
    changed: Condvar,
    t0: OnceLock<Instant>,
    pub(crate) stats: Arc<BuilderStats>,
    /// Slots the source is to yield.
    planned: usize,
    limits: Limits,
}

impl Window {
    /// Starts the builder thread over `source`, which yields the `planned` sends (slot k is its
    /// k-th record), each record freed as its body is built.
    pub(crate) fn start(
        source: Source,
        planned: usize,
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
            planned,
            limits,
        });
        let me = w.clone();
        std::thread::Builder::new()
            .name("retrace-bodies".into())
            .spawn(move || me.run(source, &opts, &prompts))?;
        Ok(w)
    }

    /// The clock started: deadlines count from `t0`.
    pub(crate) fn set_t0(&self, t0: Instant) {
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

    fn run(
        self: &Arc<Self>,
        source: impl Iterator<Item = Result<Planned, PlanError>>,
        opts: &BodyOptions,
        prompts: &Prompts,
    ) {
        let _ended = Ended(self);
        let mut work = 0;
        for (slot, planned) in source.enumerate() {
            let p = match planned {
                Ok(p) => p,
                Err(e) => return self.fail(e.to_string()),
            };
            if !self.wait_for_room(p.at_ns) {
                return;
            }
            let mut body = match self.build(p, opts, prompts) {
                Ok(b) => b,
                Err(e) => return self.fail(e),
            };
            if !body.req.aux {
                body.tag.work = Some(work);
                work += 1;
            }
            self.stats.built.fetch_add(1, Relaxed);
            self.stats
                .inexact
                .fetch_add(u64::from(!body.req.exact_prompt), Relaxed);
            self.note_lead(body.at_ns);
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

    /// The body of `p`, its record freed once it is built.
    fn build(&self, p: Planned, opts: &BodyOptions, prompts: &Prompts) -> Result<Body, String> {
        let tag = Tag {
            work: None,
            recorded: p.record.recorded_failure().map(str::to_string),
        };
        let req = build(&p.record, p.index as u64, opts, prompts)
            .map_err(|e| format!("request {}: {e}", p.index))?;
        Ok(Body::new(req, p.at_ns, tag, self.stats.clone()))
    }

    /// The builder failed: the dispatcher is told at its next body.
    fn fail(&self, why: String) {
        self.lock().failed = Some(why);
        self.changed.notify_all();
    }

    /// The lead of a body due at `at_ns` over its deadline, once the clock runs.
    fn note_lead(&self, at_ns: u64) {
        if let Some(t0) = self.t0.get() {
            let now = Instant::now().saturating_duration_since(*t0).as_nanos() as i64;
            self.stats
                .min_lead_ns
                .fetch_min(at_ns as i64 - now, Relaxed);
        }
    }

    /// Waits until the next slot (due at `at_ns`) may be built: due within the lead and the
    /// window has room (at once when the dispatcher waits for it). False when the run stopped.
    fn wait_for_room(self: &Arc<Self>, at_ns: u64) -> bool {
        let mut st = self.lock();
        let slot = st.next;
        loop {
            // Stopped, or nobody but this thread holds the window (the run was abandoned).
            if st.stop || Arc::strong_count(self) == 1 {
                return false;
            }
            let due_in = at_ns.saturating_sub(self.now_ns());
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
    #[cfg(test)]
    pub(crate) fn take(&self, slot: usize) -> Result<Body, String> {
        self.take_or(slot, || {})
    }

    /// [`Window::take`], calling `before_wait` (without the window's lock) once, before it
    /// first waits for the builder.
    pub(crate) fn take_or(&self, slot: usize, before_wait: impl FnOnce()) -> Result<Body, String> {
        let mut st = self.lock();
        let mut before_wait = Some(before_wait);
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
                let late = waited && self.now_ns() > b.at_ns;
                self.stats.late.fetch_add(u64::from(late), Relaxed);
                return Ok(b);
            }
            if let Some(e) = &st.failed {
                return Err(e.clone());
            }
            if let Some(f) = before_wait.take() {
                drop(st);
                f();
                st = self.lock();
                continue;
            }
            waited = true;
            st.wanted = Some(slot);
            self.changed.notify_all();
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Stops the builder (the run ended or failed) and frees the bodies not sent.
    pub(crate) fn stop(&self) {
        let mut st = self.lock();
        st.stop = true;
        st.ready.clear();
        st.held = 0;
        drop(st);
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::plan::prompts::{Synth, Vocab};
    use crate::trace::Request;

    fn window(source: Source, planned: usize) -> Arc<Window> {
        window_with(source, planned, Limits::default())
    }

    fn window_with(source: Source, planned: usize, limits: Limits) -> Arc<Window> {
        let opts = BodyOptions {
            api: None,
            model: "m".into(),
            model_override: false,
            extra_body: Default::default(),
            keep_original_limits: false,
            overheads: Default::default(),
        };
        let prompts = Prompts::Tokens(Synth::new(Vocab::from_size(1000).unwrap(), 16, 0));
        Window::start(source, planned, opts, prompts, limits).unwrap()
    }

    fn planned(index: usize) -> Planned {
        Planned {
            index,
            at_ns: 0,
            record: Request {
                input_tokens: 20,
                output_tokens: 2,
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_builder_that_dies_is_an_error_for_the_dispatcher_not_a_hang() {
        // the source fails at its second record
        let failing: Source = Box::new(
            [
                Ok(planned(0)),
                Err(PlanError::Shaping("the trace changed".into())),
            ]
            .into_iter(),
        );
        let w = window(failing, 3);
        w.set_t0(Instant::now());
        let first = w.take(0).expect("slot 0 is built");
        assert_eq!(first.tag.work, Some(0));
        let err = w.take(1).err().expect("no body for slot 1");
        assert!(err.contains("the trace changed"), "{err}");
        // a source that ends before its planned count
        let short: Source = Box::new([Ok(planned(0))].into_iter());
        let w = window(short, 2);
        w.set_t0(Instant::now());
        assert!(w.take(0).is_ok());
        let err = w.take(1).err().expect("no body for slot 1");
        assert!(err.contains("before request 1"), "{err}");
    }

    /// Waits (polling, bounded) until the builder has built `n` bodies.
    fn wait_built(w: &Window, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while w.stats.built.load(Relaxed) < n {
            assert!(Instant::now() < deadline, "the builder did not build {n}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A plan far longer than the window: the builder reads its source only as far as the
    /// window reaches (records read, counted at the source), and reads on as bodies are taken.
    #[test]
    fn the_builder_reads_a_long_plan_only_as_far_as_its_window() {
        use std::sync::atomic::AtomicUsize;
        let pulled = Arc::new(AtomicUsize::new(0));
        let n = 1_000_000;
        let counter = pulled.clone();
        // one record a millisecond; a 20 ms lead before t0 reaches the first 21
        let source: Source = Box::new((0..n).map(move |k| {
            counter.fetch_add(1, Relaxed);
            Ok(Planned {
                at_ns: k as u64 * 1_000_000,
                ..planned(k)
            })
        }));
        let limits = Limits {
            lead: Duration::from_millis(20),
            max_bytes: MAX_BYTES,
        };
        let w = window_with(source, n, limits);
        wait_built(&w, 21);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(w.stats.built.load(Relaxed), 21, "built past the lead");
        assert!(pulled.load(Relaxed) <= 22, "{} read", pulled.load(Relaxed));
        // the dispatcher wants slot 100: the builder reads up to it, not beyond
        let b = w.take(100).unwrap();
        assert_eq!((b.at_ns, b.tag.work), (100_000_000, Some(100)));
        assert!(pulled.load(Relaxed) <= 102, "{} read", pulled.load(Relaxed));
        w.stop();
    }
}
