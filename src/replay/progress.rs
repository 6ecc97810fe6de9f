//! The progress line of a replay on a terminal (nothing when stderr is not one): requests ended
//! of those planned, the failures so far, the requests in flight, the time since t0 and an ETA
//! from the schedule, the time left until the plan's last send is due (its offset is already
//! scaled by `--speed`). Past the last send the line says so instead: what is left is the
//! requests in flight.
//!
//! The counts are atomics the driver and the collection bump; [`line`] formats a snapshot at a
//! given instant, so it is tested with an owned clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the line is redrawn between completions (the clock and the in-flight count move
/// without them).
const TICK: Duration = Duration::from_millis(250);

/// Counts of a running replay, shared by the driver (requests sent) and the collection.
#[derive(Debug, Default)]
pub(crate) struct Live {
    /// Requests that left for the target (past their concurrency slot), counted by the driver.
    pub(crate) sent: Arc<AtomicU64>,
    ended: AtomicU64,
    failed: AtomicU64,
}

impl Live {
    /// A request ended, `ok` or not.
    pub(crate) fn ended(&self, ok: bool) {
        self.ended.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn counts(&self, planned: u64) -> Counts {
        let ended = self.ended.load(Ordering::Relaxed);
        Counts {
            planned,
            ended,
            failed: self.failed.load(Ordering::Relaxed),
            // A request not sent (a halted run) ends without having been sent.
            in_flight: self.sent.load(Ordering::Relaxed).saturating_sub(ended),
        }
    }
}

/// A snapshot of the counts.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Counts {
    planned: u64,
    ended: u64,
    failed: u64,
    in_flight: u64,
}

/// The time left until the schedule's last send (`last_send` from t0), `elapsed` after t0, in
/// whole seconds rounded up; `None` once it is due.
fn eta(last_send: Duration, elapsed: Duration) -> Option<Duration> {
    let left = last_send.checked_sub(elapsed).filter(|d| !d.is_zero())?;
    let up = u64::from(left.subsec_nanos() > 0);
    Some(Duration::from_secs(left.as_secs() + up))
}

/// `HH:MM:SS` of whole seconds (rounded down; more hours as they come).
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// The line for counts `c` at `elapsed` after t0 of a plan whose last send is at `last_send`:
/// `00:01:05 812/1000 requests, 3 failed, 41 in flight, ETA 00:00:20 (last send)`.
fn line(c: Counts, elapsed: Duration, last_send: Duration) -> String {
    let when = match eta(last_send, elapsed) {
        Some(left) => format!("ETA {} (last send)", clock(left)),
        None => "all sent".into(),
    };
    format!(
        "{} {}/{} requests, {} failed, {} in flight, {when}",
        clock(elapsed),
        c.ended,
        c.planned,
        c.failed,
        c.in_flight
    )
}

/// The bar of a replay of `planned` requests from `t0`, whose last send is due `last_send` after
/// it, redrawn every [`TICK`].
pub(crate) fn bar(
    planned: usize,
    t0: Instant,
    last_send: Duration,
    live: Arc<Live>,
) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(planned as u64);
    pb.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    let planned = planned as u64;
    let key = move |_: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
        let elapsed = Instant::now().saturating_duration_since(t0);
        let _ = w.write_str(&line(live.counts(planned), elapsed, last_send));
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template("[{bar:30}] {live}") {
        pb.set_style(style.with_key("live", key));
    }
    pb.enable_steady_tick(TICK);
    pb
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn the_eta_is_the_time_left_to_the_last_send() {
        assert_eq!(eta(100 * S, 30 * S), Some(70 * S));
        let ms = Duration::from_millis;
        assert_eq!(eta(100 * S, 30 * S + ms(100)), Some(70 * S), "rounded up");
        assert_eq!(eta(100 * S, 100 * S - ms(1)), Some(S));
        assert_eq!(eta(100 * S, Duration::ZERO), Some(100 * S));
        assert_eq!(eta(100 * S, 100 * S), None);
        assert_eq!(eta(100 * S, 250 * S), None);
        // A plan whose sends are all at t0 (rate inf) has no time left from the start.
        assert_eq!(eta(Duration::ZERO, Duration::ZERO), None);
    }

    #[test]
    fn the_line_has_counts_failures_in_flight_and_the_eta() {
        let c = Counts {
            planned: 1000,
            ended: 812,
            failed: 3,
            in_flight: 41,
        };
        assert_eq!(
            line(c, 65 * S + Duration::from_millis(900), 3725 * S),
            "00:01:05 812/1000 requests, 3 failed, 41 in flight, ETA 01:01:00 (last send)"
        );
        assert_eq!(
            line(c, 3726 * S, 3725 * S),
            "01:02:06 812/1000 requests, 3 failed, 41 in flight, all sent"
        );
        assert_eq!(clock(100 * 3600 * S + 61 * S), "100:01:01");
    }

    /// The counts come from the driver's sends and the collection's ends: in flight is sent
    /// less ended (never below 0, for requests a halt ended unsent).
    #[test]
    fn in_flight_is_sent_less_ended() {
        let live = Live::default();
        live.sent.fetch_add(5, Ordering::Relaxed);
        live.ended(true);
        live.ended(false);
        assert_eq!(
            live.counts(9),
            Counts {
                planned: 9,
                ended: 2,
                failed: 1,
                in_flight: 3
            }
        );
        for _ in 0..4 {
            live.ended(false);
        }
        assert_eq!(live.counts(9).in_flight, 0);
        assert_eq!(live.counts(9).failed, 5);
    }
}
