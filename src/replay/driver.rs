//! The driver: executes a plan against absolute deadlines from a monotonic t0.
//!
//! A dedicated dispatcher thread walks the plan in order and releases each request at
//! `t0 + at_ns`: it sleeps with the thread's timer slack lowered to 1 ns (Linux `prctl`) and a
//! short EEVDF slice ([`crate::thread_timing`], unprivileged), so releases land within tens of
//! microseconds instead of tokio's 1 ms timer-wheel granularity. By default it does not spin: a
//! thread that sleeps keeps its scheduler credit, so with CPU hogs on every core its wake-ups
//! still preempt them, while one that spins spends that credit and is then preempted for
//! milliseconds (`tools/bench_dispatch.rs` measures both). A spin window is available
//! ([`Waiter`], the hidden `--spin-us`): fixed, or adaptive. Deadlines are absolute, so a late
//! release never shifts later ones (no drift accumulation); a late dispatcher releases everything
//! already due back to back. Each released request becomes a tokio task (requests released at
//! the same instant reach the runtime together, see `flush`) that waits for a
//! concurrency slot (client queue time, measured), then runs [`Client::send`]. Every request
//! yields exactly one sample. The driver owns no policy: what to send when comes from the schedule,
//! bodies are built before the clock starts.
//!
//! With session links ([`super::sessions::Links`], `--sessions`) the dispatcher walks only the
//! roots of the plan; a dependent turn is handed to it by its predecessor's task when that ends
//! (success or failure, or even a panic: the hand-over sits in a drop guard) with the deadline
//! `predecessor end + think time`, and the dispatcher merges those into its walk (it waits on the
//! hand-over channel with a timeout instead of sleeping, then spins as usual). A dependent turn's
//! `intended_ns` is that deadline, so drift keeps meaning lateness of the send (and the dispatch
//! drift, lateness of the dispatcher), not the think time.

use super::client::{Client, SendTimes};
use super::request::BuiltRequest;
use super::sessions::Links;
use crate::metrics::{Failure, Sample};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Semaphore};

/// The longest spin window: sleep until this long before a deadline at most, then spin.
pub const SPIN_WINDOW: Duration = Duration::from_micros(200);

/// The shortest spin window.
pub const MIN_SPIN_WINDOW: Duration = Duration::from_micros(30);

/// Added to the largest recent oversleep to make the window.
const SPIN_MARGIN: Duration = Duration::from_micros(25);

/// How many recent oversleeps the window covers.
const RECENT: usize = 64;

/// How far in the future t0 is set, so the dispatcher and runtime are settled at the first send.
pub const START_LEAD: Duration = Duration::from_millis(20);

/// What the driver needs besides the plan.
pub struct DriveOptions {
    pub max_concurrency: Option<usize>,
    /// Run the dispatcher thread under SCHED_FIFO (needs CAP_SYS_NICE); on a loaded machine this
    /// keeps other processes from delaying releases.
    pub realtime: bool,
    /// A fixed spin window before each release (`Some(ZERO)`: sleep only, the CLI default;
    /// `None`: adaptive, see [`Waiter`]).
    pub spin: Option<Duration>,
    /// Session links over plan slots (`--sessions`): dependent turns wait for their predecessor.
    pub links: Option<Links>,
    /// The replay's t0 (offsets are from it); `None` = [`START_LEAD`] from now.
    pub t0: Option<Instant>,
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

/// The outcome of a drive.
pub struct Driven {
    /// One sample per planned send, in plan order.
    pub samples: Vec<Sample>,
    /// First dispatch to last completion, seconds (vLLM's benchmark duration).
    pub duration_s: f64,
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

/// Blocks the calling thread until `deadline`, precisely, with the longest spin window
/// ([`SPIN_WINDOW`]); a thread that waits for many deadlines should use a [`Waiter`].
pub fn wait_until(deadline: Instant) {
    Waiter::fixed(SPIN_WINDOW).wait_until(deadline);
}

/// Waits for deadlines on one thread: a timed sleep until the spin window before the deadline,
/// then `sched_yield` (other threads may run) and finally a pause loop for the last 20 µs.
///
/// The spin window is what the sleep may overshoot, and spinning costs CPU for the whole window.
/// So the adaptive window is the largest of the last `RECENT` oversleeps plus `SPIN_MARGIN`,
/// within [`MIN_SPIN_WINDOW`]..=[`SPIN_WINDOW`]. An oversleep longer than [`SPIN_WINDOW`] (the
/// thread was preempted: no window would have helped) is not counted.
#[derive(Debug, Clone)]
pub struct Waiter {
    /// Recent oversleeps, µs (a ring).
    recent: [u32; RECENT],
    next: usize,
    window: Duration,
    adaptive: bool,
}

impl Default for Waiter {
    /// An adaptive waiter that starts with the longest window.
    fn default() -> Self {
        Waiter {
            recent: [SPIN_WINDOW.as_micros() as u32; RECENT],
            next: 0,
            window: SPIN_WINDOW,
            adaptive: true,
        }
    }
}

impl Waiter {
    /// A waiter whose window never changes (benchmarks compare against it).
    pub fn fixed(window: Duration) -> Waiter {
        Waiter {
            window,
            adaptive: false,
            ..Waiter::default()
        }
    }

    /// The current spin window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Notes how far a timed sleep overshot its end.
    fn note(&mut self, over: Duration) {
        if !self.adaptive || over > SPIN_WINDOW {
            return;
        }
        self.recent[self.next] = over.as_micros() as u32;
        self.next = (self.next + 1) % RECENT;
        let worst = self.recent.iter().copied().max().unwrap_or(0);
        self.window = (Duration::from_micros(u64::from(worst)) + SPIN_MARGIN)
            .clamp(MIN_SPIN_WINDOW, SPIN_WINDOW);
    }

    /// Blocks the calling thread until `deadline` (returns at once when it has passed).
    pub fn wait_until(&mut self, deadline: Instant) {
        loop {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            let left = deadline - now;
            if left > self.window {
                let target = deadline - self.window;
                std::thread::sleep(left - self.window);
                self.note(Instant::now().saturating_duration_since(target));
            } else if left > Duration::from_micros(20) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// Runs `plan` (`(request index, offset ns)` pairs, sorted by offset); `on_done` is called once
/// per finished request (progress).
pub async fn drive(
    plan: Vec<(usize, u64)>,
    requests: Arc<Vec<BuiltRequest>>,
    client: Arc<Client>,
    opts: DriveOptions,
    mut on_done: impl FnMut(&Sample),
) -> Driven {
    let n = plan.len();
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, Sample)>();
    let sem = opts
        .max_concurrency
        .map(|c| Arc::new(Semaphore::new(c.max(1))));
    let handle = tokio::runtime::Handle::current();
    let t0 = opts.t0.unwrap_or_else(|| Instant::now() + START_LEAD);
    let realtime = opts.realtime;
    let spin = opts.spin;
    let links = opts.links.map(Arc::new);
    let dispatcher = std::thread::Builder::new()
        .name("retrace-dispatch".into())
        .spawn(move || {
            let short_slice = crate::thread_timing::precise(true);
            tracing::debug!(short_slice, "dispatcher thread set up");
            if realtime && !crate::thread_timing::realtime() {
                eprintln!("retrace: warning: --realtime: cannot use SCHED_FIFO (needs CAP_SYS_NICE); dispatching at normal priority");
            }
            // Dependent turns handed over by their predecessor's task: (deadline ns, slot).
            let (dep_tx, dep_rx) = std_mpsc::channel::<(u64, usize)>();
            let mut due: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
            let mut roots = plan
                .iter()
                .enumerate()
                .filter(|(slot, _)| links.as_ref().is_none_or(|l| l.is_root(*slot)))
                .map(|(slot, &(idx, at))| (slot, idx, at))
                .collect::<Vec<_>>()
                .into_iter()
                .peekable();
            let mut released = 0;
            let mut waiter = spin.map_or_else(Waiter::default, Waiter::fixed);
            // Requests released at this instant, handed to the runtime together (see `flush`).
            let mut batch: Vec<Task> = Vec::new();
            while released < n {
                while let Ok((at, slot)) = dep_rx.try_recv() {
                    due.push(Reverse((at, slot)));
                }
                let next_root = roots.peek().map(|r| r.2);
                let next_dep = due.peek().map(|Reverse((at, _))| *at);
                let at_ns = match (next_root, next_dep) {
                    (None, None) => {
                        // Nothing due until a running turn ends.
                        flush(&handle, &mut batch);
                        match dep_rx.recv() {
                            Ok((at, slot)) => {
                                due.push(Reverse((at, slot)));
                                continue;
                            }
                            Err(_) => break,
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
                    let now = Instant::now();
                    let window = waiter.window();
                    if deadline > now + window {
                        if let Ok((at, slot)) = dep_rx.recv_timeout(deadline - window - now)
                        {
                            due.push(Reverse((at, slot)));
                            continue;
                        }
                    }
                }
                waiter.wait_until(deadline);
                let (slot, idx, intended_ns) = if next_root == Some(at_ns) {
                    match roots.next() {
                        Some(r) => r,
                        None => break,
                    }
                } else {
                    match due.pop() {
                        Some(Reverse((at, slot))) => (slot, plan[slot].0, at),
                        None => break,
                    }
                };
                released += 1;
                let dispatched_ns = Instant::now().saturating_duration_since(t0).as_nanos() as u64;
                let mut times = SendTimes {
                    intended_ns,
                    dispatched_ns,
                    slot_wait_ns: 0,
                };
                let (tx, client, requests, sem) =
                    (tx.clone(), client.clone(), requests.clone(), sem.clone());
                let mut next = links.as_ref().and_then(|l| {
                    l.succ[slot].map(|s| Handover {
                        tx: dep_tx.clone(),
                        slot: s,
                        think_ns: l.think_ns[s],
                        end_ns: None,
                        t0,
                    })
                });
                // The request leaves from this thread at its deadline when a connection is idle
                // and a slot free (Client::presend); not within a large simultaneous release,
                // whose sends the runtime's workers share.
                let mut permit = None;
                let pre = if batch.len() < PRESEND_MAX_BATCH {
                    permit = sem.as_ref().and_then(|s| s.clone().try_acquire_owned().ok());
                    if sem.is_none() || permit.is_some() {
                        client.presend(&requests[idx], t0)
                    } else {
                        None
                    }
                } else {
                    None
                };
                batch.push(Box::pin(async move {
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
                    let req = &requests[idx];
                    let s = client.send(req, times, t0, pre).await;
                    if let Some(h) = &mut next {
                        h.end_ns = Some(s.end_ns);
                    }
                    drop(next); // releases the next turn before the sample is collected
                    let _ = tx.send((slot, s));
                }));
            }
            flush(&handle, &mut batch);
        });
    let mut samples: Vec<Option<Sample>> = vec![None; n];
    if let Err(e) = dispatcher {
        // Could not start the thread: every request is a local failure, the run still reports.
        for (i, s) in samples.iter_mut().enumerate() {
            *s = Some(Sample {
                error: Some(Failure::Local),
                error_detail: Some(format!("dispatcher thread: {e}")),
                end_ns: i as u64,
                ..Default::default()
            });
        }
    } else {
        let mut got = 0;
        while got < n {
            match rx.recv().await {
                Some((slot, s)) => {
                    on_done(&s);
                    samples[slot] = Some(s);
                    got += 1;
                }
                None => break,
            }
        }
    }
    let samples: Vec<Sample> = samples
        .into_iter()
        .map(|s| {
            s.unwrap_or_else(|| Sample {
                error: Some(Failure::Local),
                error_detail: Some("request task ended without a result".into()),
                ..Default::default()
            })
        })
        .collect();
    let first = samples.iter().map(|s| s.dispatched_ns).min().unwrap_or(0);
    let last = samples.iter().map(|s| s.end_ns).max().unwrap_or(0);
    Driven {
        duration_s: last.saturating_sub(first) as f64 / 1e9,
        samples,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_until_never_returns_early() {
        let start = Instant::now();
        for k in 1..=5u64 {
            let d = start + Duration::from_micros(300 * k);
            wait_until(d);
            assert!(Instant::now() >= d);
        }
        wait_until(start); // a past deadline returns at once
        let mut w = Waiter::default();
        for k in 1..=20u64 {
            let d = Instant::now() + Duration::from_micros(150 * k);
            w.wait_until(d);
            assert!(Instant::now() >= d);
        }
        assert!(w.window() >= MIN_SPIN_WINDOW && w.window() <= SPIN_WINDOW);
    }

    #[test]
    fn spin_window_covers_recent_oversleeps_but_not_preemptions() {
        let us = Duration::from_micros;
        let m = SPIN_MARGIN;
        let mut w = Waiter::default();
        assert_eq!(w.window(), SPIN_WINDOW, "starts with the longest window");
        for _ in 0..RECENT {
            w.note(us(0));
        }
        assert_eq!(w.window(), MIN_SPIN_WINDOW, "never shorter than this");
        for _ in 0..RECENT {
            w.note(us(10));
        }
        assert_eq!(w.window(), (us(10) + m).max(MIN_SPIN_WINDOW));
        w.note(us(100));
        assert_eq!(
            w.window(),
            us(100) + m,
            "the largest recent oversleep + margin"
        );
        w.note(us(5_000));
        assert_eq!(w.window(), us(100) + m, "a preemption is not counted");
        for _ in 0..RECENT - 1 {
            w.note(us(40));
        }
        assert_eq!(w.window(), us(100) + m, "still among the last {RECENT}");
        w.note(us(40));
        assert_eq!(w.window(), us(40) + m, "forgotten after {RECENT} more");
        w.note(us(199));
        assert_eq!(
            w.window(),
            SPIN_WINDOW,
            "never longer than the longest window"
        );
        let mut f = Waiter::fixed(us(200));
        f.note(us(1));
        assert_eq!(f.window(), us(200));
    }
}
