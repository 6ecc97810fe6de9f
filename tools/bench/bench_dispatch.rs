//! Benchmark of the replay dispatcher's wake-up precision and cost on a busy machine: the
//! lateness of a thread waiting for a train of deadlines 1 ms apart, and its CPU time per deadline,
//! while `--hogs` CPU-bound threads (at the same nice level) compete for the cores. Four variants
//! alternate in one process, `--rounds` times each: the default scheduler slice with a fixed
//! 200 µs spin window before each deadline, and with the 100 µs EEVDF slice the dispatcher asks
//! for: the fixed window, an adaptive window (the largest recent oversleep plus a margin) and no
//! spin at all (what `retrace replay`'s dispatcher does). Medians of their p50/p99/max and CPU are
//! printed side by side.
//!
//! Bounded: `--rounds` × 4 × `--deadlines` ms of deadlines; the hog threads stop when it ends.
//! Usage: `cargo run --release --example bench_dispatch -- [--hogs 3] [--rounds 5] [--deadlines 2000]`

use retrace::sys::thread_timing::precise as precise_sleep_setup;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest spin window.
const SPIN_WINDOW: Duration = Duration::from_micros(200);

/// Waits for deadlines: a timed sleep until the spin window before the deadline, then
/// `sched_yield` and a pause loop for the last 20 µs. Adaptive: the window is the largest of the
/// last 64 oversleeps (preemptions beyond [`SPIN_WINDOW`] not counted) plus 25 µs, within
/// 30..=200 µs.
struct Waiter {
    recent: [u32; 64],
    next: usize,
    window: Duration,
    adaptive: bool,
}

impl Waiter {
    fn new(fixed: Option<Duration>) -> Waiter {
        Waiter {
            recent: [SPIN_WINDOW.as_micros() as u32; 64],
            next: 0,
            window: fixed.unwrap_or(SPIN_WINDOW),
            adaptive: fixed.is_none(),
        }
    }

    fn note(&mut self, over: Duration) {
        if !self.adaptive || over > SPIN_WINDOW {
            return;
        }
        self.recent[self.next] = over.as_micros() as u32;
        self.next = (self.next + 1) % self.recent.len();
        let worst = self.recent.iter().copied().max().unwrap_or(0);
        self.window = (Duration::from_micros(u64::from(worst)) + Duration::from_micros(25))
            .clamp(Duration::from_micros(30), SPIN_WINDOW);
    }

    fn wait_until(&mut self, deadline: Instant) {
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

fn arg(name: &str, default: u64) -> u64 {
    let v: Vec<String> = std::env::args().collect();
    v.iter()
        .position(|a| a == name)
        .and_then(|i| v.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// CPU time of the calling thread, ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One train of deadlines on a fresh thread; returns (p50, p99, max) lateness in ms, CPU µs per
/// deadline, and whether the slice hint was accepted.
/// `spin`: a fixed spin window, `None` = adaptive.
fn train(short_slice: bool, spin: Option<Duration>, n: u64) -> (f64, f64, f64, f64, bool) {
    std::thread::spawn(move || {
        let ok = precise_sleep_setup(short_slice);
        let mut waiter = Waiter::new(spin);
        let t0 = Instant::now() + Duration::from_millis(5);
        let cpu0 = thread_cpu_ns();
        let mut late: Vec<u64> = (0..n)
            .map(|k| {
                let d = t0 + Duration::from_millis(k);
                waiter.wait_until(d);
                (Instant::now() - d).as_nanos() as u64
            })
            .collect();
        let cpu_us = (thread_cpu_ns() - cpu0) as f64 / n as f64 / 1e3;
        late.sort_unstable();
        let q = |p: f64| late[((late.len() - 1) as f64 * p).round() as usize] as f64 / 1e6;
        (q(0.5), q(0.99), q(1.0), cpu_us, ok)
    })
    .join()
    .expect("train thread")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let hogs = arg("--hogs", 3);
    let rounds = arg("--rounds", 5).max(1);
    let n = arg("--deadlines", 2000).max(10);
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..hogs)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            })
        })
        .collect();
    const VARIANTS: [(&str, bool, Option<Duration>); 4] = [
        ("default slice, 200 µs spin", false, Some(SPIN_WINDOW)),
        ("100 µs slice, 200 µs spin", true, Some(SPIN_WINDOW)),
        ("100 µs slice, adaptive spin", true, None),
        ("100 µs slice, no spin", true, Some(Duration::ZERO)),
    ];
    let mut res: [Vec<(f64, f64, f64, f64)>; 4] = Default::default();
    let mut accepted = false;
    for _ in 0..rounds {
        for (i, (_, slice, spin)) in VARIANTS.into_iter().enumerate() {
            let (a, b, c, cpu, ok) = train(slice, spin, n);
            accepted |= ok;
            res[i].push((a, b, c, cpu));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "dispatch wake-up lateness, {n} deadlines 1 ms apart, {hogs} CPU hogs, medians of {rounds} rounds (load {})",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    println!("variant                       p50_ms   p99_ms   max_ms   cpu_us/deadline");
    for (i, (name, _, _)) in VARIANTS.iter().enumerate() {
        let r = &res[i];
        println!(
            "{name:<29} {:<8.3} {:<8.3} {:<8.3} {:<8.1}",
            median(r.iter().map(|x| x.0).collect()),
            median(r.iter().map(|x| x.1).collect()),
            median(r.iter().map(|x| x.2).collect()),
            median(r.iter().map(|x| x.3).collect())
        );
    }
    if !accepted {
        println!("(the kernel refused the slice hint: both rows use the default slice)");
    }
}
