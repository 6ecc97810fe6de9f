//! The driver: executes a plan against absolute deadlines from a monotonic t0.
//!
//! A dedicated dispatcher thread walks the plan in order (each send's offset comes with its body
//! from [`crate::replay::plan::body`], or for `--sessions` from the links) and releases each request at
//! `t0 + at_ns`: it sleeps with the thread's timer slack lowered to 1 ns (Linux `prctl`) and a
//! short EEVDF slice ([`crate::sys::thread_timing`], unprivileged), so releases land within tens of
//! microseconds instead of tokio's 1 ms timer-wheel granularity. It does not spin: a thread that
//! sleeps keeps its scheduler credit, so with CPU hogs on every core its wake-ups still preempt
//! them, while one that spins spends that credit and is then preempted for milliseconds
//! (`tools/bench/bench_dispatch.rs` measures both). Deadlines are absolute, so a late release never
//! shifts later ones (no drift accumulation); a late dispatcher releases everything already due
//! back to back. Each released request becomes a tokio task (requests released at
//! the same instant reach the runtime together, see `flush`) that waits for a
//! concurrency slot (client queue time, measured), then runs [`Client::send`]. Every request
//! yields exactly one sample. The driver owns no policy: what to send when comes from the schedule,
//! bodies come from [`crate::replay::plan::body`], taken before the sleep to each deadline.
//!
//! With session links ([`crate::replay::plan::turns::Links`], `--sessions`) the dispatcher walks only the
//! roots of the plan; a dependent turn is handed to it by its predecessor's task when that ends
//! (success or failure, or even a panic: the hand-over sits in a drop guard) with the deadline
//! `predecessor end + think time`, and the dispatcher merges those into its walk (it waits on the
//! hand-over channel with a timeout instead of sleeping). A dependent turn's
//! `intended_ns` is that deadline, so drift keeps meaning lateness of the send (and the dispatch
//! drift, lateness of the dispatcher), not the think time.
//!
//! A run can be halted ([`Halt`], replay's first SIGINT or SIGTERM): the dispatcher releases
//! nothing after it (it looks at the halt at least every [`HALT_CHECK`] while it waits), a
//! released request still waiting for its concurrency slot is not sent, and the requests in
//! flight get [`HALT_GRACE`] to end before they are cut. Each request released yields its one
//! sample still: those not sent or cut with [`Failure::Interrupted`].

use crate::metrics::{Failure, Sample, Scalars};
use crate::replay::http::client::{Client, SendTimes};
use crate::replay::plan::body::{Body, Tag, Window};
use crate::replay::plan::turns::Links;
use crate::sys::signal::Signal;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch, Semaphore};

/// How far in the future t0 is set, so the dispatcher and runtime are settled at the first send.
pub(crate) const START_LEAD: Duration = Duration::from_millis(20);

/// How long the requests in flight when a run is halted may take to end before they are cut.
pub(crate) const HALT_GRACE: Duration = Duration::from_secs(2);

/// The longest the dispatcher sleeps or waits without looking at the halt.
const HALT_CHECK: Duration = Duration::from_millis(50);

/// Where a run stands when a signal comes ([`Halt::halt`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Phase {
    /// Before the clock: nothing was sent.
    #[default]
    Setup,
    /// Driving: the signal halts the run.
    Running,
    /// Every request ended: the run is whole.
    Ended,
}

/// A run's halt by a signal: set once while it runs, seen by the dispatcher, every released
/// request's task and [`drive`]'s collection (see the module docs).
#[derive(Default)]
pub struct Halt {
    /// The phase and the signal, under one lock: a signal halts a running drive or none.
    state: Mutex<(Phase, Option<Signal>)>,
    halted: AtomicBool,
    /// Turns true at the halt: every side's [`drive`] of a shadowed replay sees it (one wake-up
    /// permit would reach one side only).
    woken: watch::Sender<bool>,
}

impl Halt {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Phase, Option<Signal>)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The run enters `phase` (the clock starts, or its last request ended).
    pub(crate) fn enter(&self, phase: Phase) {
        self.lock().0 = phase;
    }

    /// A signal came: it halts the run when the run is [`Phase::Running`] (the first signal
    /// counts); the phase it found.
    pub(crate) fn halt(&self, s: Signal) -> Phase {
        let mut st = self.lock();
        if st.0 == Phase::Running && st.1.is_none() {
            st.1 = Some(s);
            self.halted.store(true, Ordering::Release);
            self.woken.send_replace(true);
        }
        st.0
    }

    /// The run is given up (`capacity`'s step lost its objective): halted as by a signal, with
    /// none named.
    pub(crate) fn give_up(&self) {
        let st = self.lock();
        if st.0 == Phase::Running && st.1.is_none() {
            self.halted.store(true, Ordering::Release);
            self.woken.send_replace(true);
        }
    }

    /// The signal that halted the run.
    pub(crate) fn by(&self) -> Option<Signal> {
        self.lock().1
    }

    fn is_halted(&self) -> bool {
        self.halted.load(Ordering::Acquire)
    }
}

/// What the driver needs besides the plan.
pub(crate) struct DriveOptions {
    pub(crate) max_concurrency: Option<usize>,
    /// Session links over plan slots (`--sessions`): dependent turns wait for their predecessor.
    pub(crate) links: Option<Links>,
    /// The replay's t0 (offsets are from it); `None` = [`START_LEAD`] from now.
    pub(crate) t0: Option<Instant>,
    /// Set when a signal halts the run.
    pub(crate) halt: Arc<Halt>,
    /// Counts each request as it leaves for the target, past its concurrency slot (the
    /// progress line's requests in flight).
    pub(crate) sent: Option<Arc<AtomicU64>>,
}

/// A released request's task, not yet spawned.
type Task = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;

/// Most requests handed to the runtime in one go.
const MAX_BATCH: usize = 256;

/// Releases in one batch (due at the same instant) beyond this many are sent by their tasks on
/// the runtime's workers instead of by the dispatcher ([`Client::presend`]): a burst of a
/// thousand would otherwise be written one by one on this thread.
const PRESEND_MAX_BATCH: usize = 16;

/// Hands the released requests to the runtime. One request is spawned directly; several (a burst
/// due at one instant, or a dispatcher running late) go in one task that spawns them from inside
/// the runtime: one cross-thread hand-off and wake-up instead of one per request (less dispatch
/// drift in large bursts).
fn flush(handle: &tokio::runtime::Handle, batch: &mut Vec<Task>) {
    match batch.len() {
        0 => {}
        1 => {
            if let Some(t) = batch.pop() {
                handle.spawn(t);
            }
        }
        _ => {
            let tasks = std::mem::take(batch);
            handle.spawn(async move {
                for t in tasks {
                    tokio::spawn(t);
                }
            });
        }
    }
}

/// The outcome of a drive (the samples went to `on_done`).
pub(crate) struct Driven {
    /// First dispatch to last completion, seconds (vLLM's benchmark duration).
    pub(crate) duration_s: f64,
}

/// Hands the next turn of a session to the dispatcher when dropped: at the end of its
/// predecessor's task, or during a panic's unwinding (then "now" stands for the end).
struct Handover {
    tx: std_mpsc::Sender<(u64, usize)>,
    slot: usize,
    think_ns: u64,
    end_ns: Option<u64>,
    t0: Instant,
}

impl Drop for Handover {
    fn drop(&mut self) {
        let end = self
            .end_ns
            .unwrap_or_else(|| Instant::now().saturating_duration_since(self.t0).as_nanos() as u64);
        let _ = self.tx.send((end.saturating_add(self.think_ns), self.slot));
    }
}

/// A released request's reply to the driver, sent when dropped: its sample, or a local failure
/// at its release when its task ended without one (a panic, or the runtime dropping it).
struct Reply {
    tx: mpsc::UnboundedSender<(usize, Tag, Sample)>,
    slot: usize,
    tag: Tag,
    /// Intended and actual release, ns from t0.
    released: (u64, u64),
    sample: Option<Sample>,
}

impl Reply {
    /// Replies with the request's sample.
    fn send(mut self, s: Sample) {
        self.sample = Some(s);
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        let (intended_ns, dispatched_ns) = self.released;
        let s = self.sample.take().unwrap_or_else(|| Sample {
            scalars: Scalars {
                error: Some(Failure::Local),
                intended_ns,
                dispatched_ns,
                end_ns: dispatched_ns,
                ..Default::default()
            },
            error_detail: Some("request task ended without a result".into()),
            ..Default::default()
        });
        let _ = self.tx.send((self.slot, std::mem::take(&mut self.tag), s));
    }
}

/// Blocks the calling thread until `deadline` (returns at once when it has passed); false when
/// the run was halted first (looked at every [`HALT_CHECK`]).
fn sleep_until(deadline: Instant, halt: &Halt) -> bool {
    loop {
        if halt.is_halted() {
            return false;
        }
        let now = Instant::now();
        if now >= deadline {
            return true;
        }
        std::thread::sleep((deadline - now).min(HALT_CHECK));
    }
}

/// The sample of a released request the halt ended before it did: `what` happened to it.
fn interrupted(req_tokens: u64, times: SendTimes, t0: Instant, what: &str) -> Sample {
    Sample {
        scalars: Scalars {
            input_tokens: req_tokens,
            error: Some(Failure::Interrupted),
            intended_ns: times.intended_ns,
            dispatched_ns: times.dispatched_ns,
            slot_wait_ns: times.slot_wait_ns,
            end_ns: Instant::now().saturating_duration_since(t0).as_nanos() as u64,
            ..Default::default()
        },
        error_detail: Some(format!("{what}: the run was interrupted")),
        ..Default::default()
    }
}

/// Resolves once the requests in flight are to be cut (never, if that is not going to happen).
async fn cut(mut rx: watch::Receiver<bool>) {
    if rx.wait_for(|cut| *cut).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The plan's roots in order, with their offsets: from the session links, or else every slot,
/// its offset read from its body (taken from the window before the sleep to its deadline).
struct Roots {
    n: usize,
    next: usize,
    links: Option<Arc<Links>>,
    bodies: Arc<Window>,
    /// The next root, peeked: (slot, offset, its body when taken).
    peeked: Option<(usize, u64, Option<Body>)>,
    failed: Option<String>,
}

impl Roots {
    /// The next root's offset; `before_wait` runs first when its body is not built yet.
    fn peek(&mut self, before_wait: impl FnOnce()) -> Option<u64> {
        if self.peeked.is_none() && self.failed.is_none() {
            self.peeked = self.advance(before_wait);
        }
        self.peeked.as_ref().map(|p| p.1)
    }

    fn advance(&mut self, before_wait: impl FnOnce()) -> Option<(usize, u64, Option<Body>)> {
        if let Some(l) = &self.links {
            let root = (self.next..self.n).find(|&s| l.is_root(s));
            self.next = root.map_or(self.n, |s| s + 1);
            return root.map(|s| (s, l.at_ns[s], None));
        }
        let slot = self.next;
        if slot >= self.n {
            return None;
        }
        self.next += 1;
        match self.bodies.take_or(slot, before_wait) {
            Ok(b) => Some((slot, b.at_ns, Some(b))),
            Err(e) => {
                self.failed = Some(e);
                None
            }
        }
    }

    fn pop(&mut self) -> Option<(usize, u64, Option<Body>)> {
        self.peek(|| {})?;
        self.peeked.take()
    }
}

/// What every released request's task shares.
struct Release {
    client: Arc<Client>,
    sem: Option<Arc<Semaphore>>,
    links: Option<Arc<Links>>,
    /// Where a finished turn hands its session's next turn back to the dispatcher.
    dep_tx: std_mpsc::Sender<(u64, usize)>,
    tx: mpsc::UnboundedSender<(usize, Tag, Sample)>,
    t0: Instant,
    halt: Arc<Halt>,
    /// Turns true [`HALT_GRACE`] after a halt: the requests still in flight are cut.
    cut: watch::Receiver<bool>,
    /// Counts the requests sent ([`DriveOptions::sent`]).
    sent: Option<Arc<AtomicU64>>,
}

impl Release {
    /// The task of the request in `slot`, released now (`released`: its intended and dispatch
    /// instants, ns from t0). With `presend`, the request leaves from this thread at once when a
    /// connection is idle and a slot free (`Client::presend`); not within a large simultaneous
    /// release, whose sends the runtime's workers share.
    fn task(&self, slot: usize, released: (u64, u64), mut body: Body, presend: bool) -> Task {
        let (intended_ns, dispatched_ns) = released;
        let mut times = SendTimes {
            intended_ns,
            dispatched_ns,
            slot_wait_ns: 0,
        };
        let (client, sem, t0) = (self.client.clone(), self.sem.clone(), self.t0);
        let (halt, cut_rx) = (self.halt.clone(), self.cut.clone());
        let sent = self.sent.clone();
        let mut next = self.links.as_ref().and_then(|l| {
            l.succ[slot].map(|s| Handover {
                tx: self.dep_tx.clone(),
                slot: s,
                think_ns: l.think_ns[s],
                end_ns: None,
                t0,
            })
        });
        let reply = Reply {
            tx: self.tx.clone(),
            slot,
            tag: std::mem::take(&mut body.tag),
            released,
            sample: None,
        };
        let mut permit = None;
        let pre = match presend {
            true => {
                permit = sem
                    .as_ref()
                    .and_then(|s| s.clone().try_acquire_owned().ok());
                match sem.is_none() || permit.is_some() {
                    true => client.presend(&body.req, t0),
                    false => None,
                }
            }
            false => None,
        };
        Box::pin(async move {
            let _permit = match (&sem, permit) {
                (_, Some(p)) => Some(p),
                (Some(s), None) => {
                    let asked = Instant::now();
                    let p = s.clone().acquire_owned().await.ok();
                    times.slot_wait_ns = asked.elapsed().as_nanos() as u64;
                    p
                }
                (None, None) => None,
            };
            let tokens = body.req.input_tokens;
            let s = if pre.is_none() && halt.is_halted() {
                interrupted(tokens, times, t0, "not sent")
            } else {
                if let Some(n) = &sent {
                    n.fetch_add(1, Ordering::Relaxed);
                }
                tokio::select! {
                    biased;
                    s = client.send(&body.req, times, t0, pre) => s,
                    () = cut(cut_rx) => interrupted(tokens, times, t0, "cut in flight"),
                }
            };
            drop(body); // freed once sent
            if let Some(h) = &mut next {
                h.end_ns = Some(s.end_ns);
            }
            drop(next); // releases the next turn before the sample is collected
            reply.send(s);
        })
    }
}

/// Runs `n` planned sends (their bodies and offsets from `bodies`, in plan order); `on_done`
/// gets each released slot's sample and tag once, as the request finishes (every slot, unless
/// the run is halted). Err when the body builder failed (once the sends released before it
/// have ended) or the dispatcher could not start.
pub(crate) async fn drive(
    n: usize,
    bodies: Arc<Window>,
    client: Arc<Client>,
    opts: DriveOptions,
    mut on_done: impl FnMut(usize, Tag, Sample),
) -> Result<Driven, String> {
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, Tag, Sample)>();
    let sem = opts
        .max_concurrency
        .map(|c| Arc::new(Semaphore::new(c.max(1))));
    let handle = tokio::runtime::Handle::current();
    let t0 = opts.t0.unwrap_or_else(|| Instant::now() + START_LEAD);
    let links = opts.links.map(Arc::new);
    let halt = opts.halt;
    let (cut_tx, cut_rx) = watch::channel(false);
    let dispatcher_halt = halt.clone();
    let dispatcher = std::thread::Builder::new()
        .name("retrace-dispatch".into())
        .spawn(move || {
            let short_slice = crate::sys::thread_timing::precise(true);
            tracing::debug!(short_slice, "dispatcher thread set up");
            // Dependent turns handed over by their predecessor's task: (deadline ns, slot).
            let (dep_tx, dep_rx) = std_mpsc::channel::<(u64, usize)>();
            let mut due: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
            let mut roots = Roots {
                n,
                next: 0,
                links: links.clone(),
                bodies: bodies.clone(),
                peeked: None,
                failed: None,
            };
            let mut released = 0;
            // Requests released at this instant, handed to the runtime together (see `flush`).
            let mut batch: Vec<Task> = Vec::new();
            let halt = dispatcher_halt;
            let release = Release {
                client,
                sem,
                links: links.clone(),
                dep_tx,
                tx,
                t0,
                halt: halt.clone(),
                cut: cut_rx,
                sent: opts.sent,
            };
            while released < n && !halt.is_halted() {
                while let Ok((at, slot)) = dep_rx.try_recv() {
                    due.push(Reverse((at, slot)));
                }
                // Requests already released go to the runtime before waiting for the builder.
                let next_root = roots.peek(|| flush(&handle, &mut batch));
                if let Some(e) = roots.failed.take() {
                    flush(&handle, &mut batch);
                    return Err(e);
                }
                let next_dep = due.peek().map(|Reverse((at, _))| *at);
                let at_ns = match (next_root, next_dep) {
                    (None, None) => {
                        // Nothing due until a running turn ends.
                        flush(&handle, &mut batch);
                        match dep_rx.recv_timeout(HALT_CHECK) {
                            Ok((at, slot)) => {
                                due.push(Reverse((at, slot)));
                                continue;
                            }
                            Err(std_mpsc::RecvTimeoutError::Timeout) => continue,
                            Err(std_mpsc::RecvTimeoutError::Disconnected) => break,
                        }
                    }
                    (Some(a), None) | (None, Some(a)) => a,
                    (Some(a), Some(b)) => a.min(b),
                };
                let deadline = t0 + Duration::from_nanos(at_ns);
                if deadline > Instant::now() || batch.len() >= MAX_BATCH {
                    flush(&handle, &mut batch);
                }
                if links.is_some() {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match dep_rx.recv_timeout(left.min(HALT_CHECK)) {
                        Ok((at, slot)) => {
                            due.push(Reverse((at, slot)));
                            continue;
                        }
                        Err(_) if left > HALT_CHECK => continue,
                        Err(_) => {}
                    }
                }
                // The body is taken before the sleep: none is built on the send path.
                let (slot, intended_ns, body) = match next_root == Some(at_ns) {
                    true => match roots.pop() {
                        Some(r) => r,
                        None => break,
                    },
                    false => match due.pop() {
                        Some(Reverse((at, slot))) => (slot, at, None),
                        None => break,
                    },
                };
                let body = match body {
                    Some(b) => b,
                    None => match bodies.take_or(slot, || flush(&handle, &mut batch)) {
                        Ok(b) => b,
                        Err(e) => {
                            flush(&handle, &mut batch);
                            return Err(e);
                        }
                    },
                };
                if !sleep_until(deadline, &halt) {
                    break;
                }
                released += 1;
                let dispatched_ns = Instant::now().saturating_duration_since(t0).as_nanos() as u64;
                let presend = batch.len() < PRESEND_MAX_BATCH;
                batch.push(release.task(slot, (intended_ns, dispatched_ns), body, presend));
            }
            flush(&handle, &mut batch);
            Ok(())
        });
    let dispatcher = match dispatcher {
        Ok(d) => d,
        Err(e) => return Err(format!("starting the dispatcher thread: {e}")),
    };
    let (mut first, mut last) = (u64::MAX, 0u64);
    let mut grace = Some(cut_tx);
    let mut halted = halt.woken.subscribe();
    // Every released request replies once; the channel closes when the dispatcher and every
    // request's task are done.
    loop {
        tokio::select! {
            got = rx.recv() => {
                let Some((slot, tag, s)) = got else { break };
                // The run's span is its measured requests': not the halt's grace.
                if s.error != Some(Failure::Interrupted) {
                    first = first.min(s.dispatched_ns);
                    last = last.max(s.end_ns);
                }
                on_done(slot, tag, s);
            }
            _ = halted.wait_for(|h| *h), if grace.is_some() => {
                if let Some(tx) = grace.take() {
                    tokio::spawn(async move {
                        tokio::time::sleep(HALT_GRACE).await;
                        let _ = tx.send(true);
                    });
                }
            }
        }
    }
    match dispatcher.join() {
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err("the dispatcher thread panicked".into()),
        Ok(Ok(())) => {}
    }
    Ok(Driven {
        duration_s: last.saturating_sub(first.min(last)) as f64 / 1e9,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's task that ends without its sample (a panic, or dropped unpolled) still
    /// replies: a local failure at its release, with its tag.
    #[test]
    fn a_task_ended_without_a_sample_replies_a_local_failure_at_its_release() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let tag = Tag {
            work: Some(4),
            recorded: Some("http_500".into()),
        };
        let reply = |slot| Reply {
            tx: tx.clone(),
            slot,
            tag: tag.clone(),
            released: (1_000, 1_250),
            sample: None,
        };
        let r = reply(7);
        let task = async move { r.send(Sample::default()) };
        drop(Box::pin(task)); // never polled
        let (slot, got, s) = rx.try_recv().unwrap();
        assert_eq!((slot, &got), (7, &tag));
        assert_eq!(s.error, Some(Failure::Local));
        assert_eq!(
            (s.intended_ns, s.dispatched_ns, s.end_ns),
            (1_000, 1_250, 1_250)
        );
        reply(8).send(Sample {
            scalars: Scalars {
                ttft_ns: Some(5),
                ..Default::default()
            },
            ..Default::default()
        });
        let (slot, _, s) = rx.try_recv().unwrap();
        assert_eq!((slot, s.ttft_ns, s.error), (8, Some(5), None));
    }

    #[test]
    fn sleep_until_never_returns_early() {
        let halt = Halt::default();
        let start = Instant::now();
        for k in 1..=5u64 {
            let d = start + Duration::from_micros(300 * k);
            assert!(sleep_until(d, &halt));
            assert!(Instant::now() >= d);
        }
        assert!(sleep_until(start, &halt)); // a past deadline returns at once
    }

    /// A signal halts a running drive only (the first one counts); a halted sleep of the
    /// dispatcher says so instead of releasing.
    #[test]
    fn a_signal_halts_a_running_drive_only() {
        let halt = Halt::default();
        assert_eq!(halt.halt(Signal::Interrupt), Phase::Setup);
        assert_eq!(halt.by(), None);
        halt.enter(Phase::Running);
        assert_eq!(halt.halt(Signal::Terminate), Phase::Running);
        assert_eq!(halt.halt(Signal::Interrupt), Phase::Running);
        assert_eq!(halt.by(), Some(Signal::Terminate));
        let far = Instant::now() + Duration::from_secs(3600);
        assert!(!sleep_until(far, &halt));
        let ended = Halt::default();
        ended.enter(Phase::Ended);
        assert_eq!(ended.halt(Signal::Interrupt), Phase::Ended);
        assert_eq!(ended.by(), None);
    }
}
