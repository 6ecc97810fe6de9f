//! Filters applied while converting: time window, first N rows, 1-in-K sampling, speed factor.
//!
//! Applied in that order, to arrival offsets (µs from t0). The window keeps arrivals in
//! `[start, end)` and shifts them so the first kept arrival keeps its offset from `start`; the
//! speed factor divides every offset (2 = twice as fast; recorded per-request response timings are
//! left as they were measured). Pure; no I/O.

use super::Trace;

/// Conversion filters. `None`/`1` means "keep everything".
#[derive(Debug, Clone, PartialEq)]
pub struct Filters {
    /// `[start, end)` in µs of trace time.
    pub window_us: Option<(u64, u64)>,
    /// Keep only the first N requests (after the window).
    pub head: Option<usize>,
    /// Keep every K-th request (1 keeps all).
    pub sample_every: usize,
    /// Divide arrival offsets by this.
    pub speed: f64,
}

impl Default for Filters {
    fn default() -> Self {
        Filters {
            window_us: None,
            head: None,
            sample_every: 1,
            speed: 1.0,
        }
    }
}

/// Parses `START..END` with units `ms`, `s` (default), `m`, `h`; either side may be empty.
pub fn parse_window(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| format!("window `{s}` must look like START..END, e.g. 60s..120s"))?;
    let a = if a.trim().is_empty() {
        0
    } else {
        parse_duration_us(a)?
    };
    let b = if b.trim().is_empty() {
        u64::MAX
    } else {
        parse_duration_us(b)?
    };
    if b <= a {
        return Err(format!("window `{s}`: END must be after START"));
    }
    Ok((a, b))
}

/// Parses `1.5s`, `250ms`, `2m`, `1h`, `30` (seconds) into µs.
pub fn parse_duration_us(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e6)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60e6)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600e6)
    } else {
        (s, 1e6)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (e.g. 90s, 250ms, 2m)"))?;
    if !v.is_finite() || v < 0.0 || v * mul > 1e18 {
        return Err(format!("duration `{s}` is negative or too large"));
    }
    Ok((v * mul).round() as u64)
}

/// Applies the filters in place.
pub fn apply(trace: &mut Trace, f: &Filters) -> Result<(), String> {
    if !(f.speed.is_finite() && f.speed > 0.0) {
        return Err(format!("speed {} must be a positive number", f.speed));
    }
    if f.sample_every == 0 {
        return Err("sample interval must be at least 1".into());
    }
    let reqs = std::mem::take(&mut trace.requests);
    let mut kept: Vec<_> = match f.window_us {
        Some((a, b)) => reqs
            .into_iter()
            .filter(|r| r.arrival_us >= a && r.arrival_us < b)
            .map(|mut r| {
                r.arrival_us -= a;
                r
            })
            .collect(),
        None => reqs,
    };
    if let Some(n) = f.head {
        kept.truncate(n);
    }
    if f.sample_every > 1 {
        kept = kept
            .into_iter()
            .enumerate()
            .filter(|(i, _)| i % f.sample_every == 0)
            .map(|(_, r)| r)
            .collect();
    }
    if f.speed != 1.0 {
        for r in &mut kept {
            r.arrival_us = (r.arrival_us as f64 / f.speed).round() as u64;
        }
    }
    trace.requests = kept;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Request, TraceHeader};

    #[test]
    fn filters_in_order() {
        let mut t = Trace {
            header: TraceHeader::imported(512, true, "t"),
            requests: (0..10)
                .map(|k| Request {
                    arrival_us: k * 1_000_000,
                    ..Default::default()
                })
                .collect(),
        };
        apply(
            &mut t,
            &Filters {
                window_us: Some(parse_window("2s..8s").unwrap()),
                head: Some(5),
                sample_every: 2,
                speed: 2.0,
            },
        )
        .unwrap();
        let at: Vec<u64> = t.requests.iter().map(|r| r.arrival_us).collect();
        assert_eq!(at, vec![0, 1_000_000, 2_000_000]);
    }

    #[test]
    fn parse_errors_are_clear() {
        assert!(parse_window("5s").unwrap_err().contains("START..END"));
        assert!(parse_window("5s..1s").is_err());
        assert_eq!(parse_window("..250ms").unwrap(), (0, 250_000));
        assert_eq!(parse_duration_us("2m").unwrap(), 120_000_000);
        assert!(parse_duration_us("-1s").is_err());
    }
}
