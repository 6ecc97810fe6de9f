//! `--start-at`: one agreed wall-clock instant at which every shard's t0 falls, so N shards
//! started separately (a Kubernetes Indexed Job, ssh to N machines) replay one timeline together.
//!
//! [`parse`] (pure, given "now") reads a Unix time in seconds (`1767225600`, `1767225600.25`) or an
//! RFC 3339 time (`2026-11-29T22:00:00Z`, any offset) and refuses a time more than
//! [`PAST_TOLERANCE`] in the past (the shards could no longer start together) or more than
//! [`MAX_AHEAD`] ahead (almost always milliseconds given as seconds, or a typo). [`t0_for`] maps the
//! instant onto the monotonic clock just before the run starts: a t0 a little in the past (setup
//! ran late, within the tolerance) is kept as is, so the dispatcher catches up on what is already
//! due and the shards stay aligned; later than that is an error before anything is sent. Clocks
//! must agree across machines (NTP): this module cannot check that.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How far in the past a start time may be (parsing, and at t0).
pub(crate) const PAST_TOLERANCE: Duration = Duration::from_secs(5);

/// How far ahead a start time may be.
pub(crate) const MAX_AHEAD: Duration = Duration::from_secs(7 * 24 * 3600);

/// Connections are opened (and the "before" scrape taken) this long before the start instant:
/// servers close idle keep-alive connections after a few seconds (uvicorn: 5 s).
pub(crate) const WARM_LEAD: Duration = Duration::from_secs(2);

fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Parses `--start-at` against `now`.
pub(crate) fn parse(s: &str, now: SystemTime) -> Result<SystemTime, String> {
    let s = s.trim();
    let at = if let Ok(secs) = s.parse::<f64>() {
        if !(secs.is_finite() && (0.0..1e11).contains(&secs)) {
            return Err(format!(
                "--start-at {s}: not a Unix time in seconds (milliseconds? divide by 1000)"
            ));
        }
        UNIX_EPOCH + Duration::from_secs_f64(secs)
    } else {
        let t = chrono::DateTime::parse_from_rfc3339(s).map_err(|e| {
            format!("--start-at {s:?}: expected Unix seconds or an RFC 3339 time like 2026-11-29T22:00:00Z ({e})")
        })?;
        let ns = t
            .timestamp_nanos_opt()
            .filter(|n| *n >= 0)
            .ok_or_else(|| format!("--start-at {s}: out of range"))?;
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    };
    match now.duration_since(at) {
        Ok(late) if late > PAST_TOLERANCE => Err(format!(
            "--start-at {s} ({}) is {:.1} s in the past (now {}); give a time ahead, e.g. $(( $(date +%s) + 60 ))",
            rfc3339(at),
            late.as_secs_f64(),
            rfc3339(now)
        )),
        Ok(_) => Ok(at),
        Err(_) => {
            let ahead = at.duration_since(now).unwrap_or_default();
            if ahead > MAX_AHEAD {
                Err(format!(
                    "--start-at {s} ({}) is {:.0} days ahead; more than {} days is refused (milliseconds given as seconds?)",
                    rfc3339(at),
                    ahead.as_secs_f64() / 86400.0,
                    MAX_AHEAD.as_secs() / 86400
                ))
            } else {
                Ok(at)
            }
        }
    }
}

/// The monotonic instant of wall-clock `at`, given (`now_sys`, `now_mono`) read together.
pub(crate) fn t0_for(
    at: SystemTime,
    now_sys: SystemTime,
    now_mono: Instant,
) -> Result<Instant, String> {
    match at.duration_since(now_sys) {
        Ok(ahead) => Ok(now_mono + ahead),
        Err(e) => {
            let late = e.duration();
            if late > PAST_TOLERANCE {
                return Err(format!(
                    "--start-at {}: setup finished {:.1} s after the start time (tolerance {} s); nothing was sent. Give a later time (bodies and connections are prepared before it)",
                    rfc3339(at),
                    late.as_secs_f64(),
                    PAST_TOLERANCE.as_secs()
                ));
            }
            now_mono.checked_sub(late).ok_or_else(|| {
                "--start-at: the monotonic clock cannot go that far back".to_string()
            })
        }
    }
}

/// For display: the instant as RFC 3339 (UTC, milliseconds).
pub(crate) fn display(at: SystemTime) -> String {
    rfc3339(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_796_000_000) // 2026-11-29
    }

    #[test]
    fn unix_seconds_and_rfc3339_are_read() {
        let n = now();
        assert_eq!(parse("1796000060", n), Ok(n + Duration::from_secs(60)));
        assert_eq!(
            parse(" 1796000060.25 ", n),
            Ok(n + Duration::from_millis(60_250))
        );
        let iso = display(n + Duration::from_secs(90));
        assert_eq!(parse(&iso, n), Ok(n + Duration::from_secs(90)));
        // any offset
        let at = parse("2026-11-29T10:00:00+02:00", n - Duration::from_secs(86400)).unwrap();
        assert_eq!(display(at), "2026-11-29T08:00:00.000Z");
        // within the tolerance in the past: accepted
        assert!(parse("1795999997", n).is_ok());
    }

    #[test]
    fn the_past_the_far_future_and_junk_are_refused_clearly() {
        let n = now();
        let e = parse("1795999990", n).unwrap_err();
        assert!(e.contains("10.0 s in the past"), "{e}");
        assert!(e.starts_with("--start-at 1795999990"), "{e}");
        let e = parse("1796000000000", n).unwrap_err();
        assert!(e.contains("milliseconds"), "{e}");
        let e = parse("1796900000", n).unwrap_err();
        assert!(e.contains("days ahead"), "{e}");
        for bad in ["tomorrow", "-5", "NaN", "2026-13-01T00:00:00Z", ""] {
            let e = parse(bad, n).unwrap_err();
            assert!(e.starts_with("--start-at"), "{bad}: {e}");
        }
    }

    #[test]
    fn t0_maps_onto_the_monotonic_clock() {
        let (sys, mono) = (now(), Instant::now());
        let ahead = t0_for(sys + Duration::from_secs(3), sys, mono).unwrap();
        assert_eq!(ahead - mono, Duration::from_secs(3));
        // a little late: t0 stays in the past (the dispatcher catches up, shards stay aligned)
        if let Some(back) = mono.checked_sub(Duration::from_secs(2)) {
            assert_eq!(t0_for(sys - Duration::from_secs(2), sys, mono), Ok(back));
        }
        let e = t0_for(sys - Duration::from_secs(9), sys, mono).unwrap_err();
        assert!(e.contains("nothing was sent"), "{e}");
    }
}
