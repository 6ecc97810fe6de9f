//! Workload shaping for replay: the `--window`, `--shard`, `--loop`, `--overlay`, `--max-gap`,
//! `--request-rate`/`--burstiness` and `--ramp-up` options, validated once and applied to the
//! trace in a fixed order before the schedule is planned ([`super::source::Stage`] applies the
//! same order one record at a time).
//!
//! Order: window → loop → overlay → max-gap → arrival override → limit → shard. Sharding comes
//! last so that every shard keeps the arrival times the whole shaped trace would have had (the
//! plan's origin is the shaped trace's first arrival, see [`Shaping::apply`], which returns it),
//! and `--limit` is cut before it, so N shards of `--limit L` send the whole run's first L. The transforms
//! themselves are the pure functions of [`crate::trace::shape`]; this module only orders them.

use crate::trace::filter;
use crate::trace::shape::{self, Arrivals};
use crate::trace::Trace;

/// Validated shaping options (all off by default).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Shaping {
    pub window_us: Option<(u64, u64)>,
    pub loops: u32,
    pub overlay: u32,
    pub overlay_distinct: bool,
    pub max_gap_us: Option<u64>,
    pub arrivals: Option<Arrivals>,
    pub shard: Option<(u32, u32)>,
    /// `--limit`: the shaped trace's first N arrivals, kept before sharding.
    pub limit: Option<usize>,
    pub seed: u64,
}

/// The raw flag values, as the CLI gives them.
#[derive(Debug, Clone, Default)]
pub struct ShapingFlags<'a> {
    pub window: Option<&'a str>,
    pub loops: Option<u32>,
    pub overlay: Option<u32>,
    pub overlay_distinct: bool,
    pub max_gap: Option<&'a str>,
    pub request_rate: Option<f64>,
    pub burstiness: f64,
    pub ramp_up: Option<&'a str>,
    pub ramp_up_start_rps: Option<f64>,
    pub ramp_up_end_rps: Option<f64>,
    pub shard: Option<&'a str>,
    pub limit: Option<usize>,
    pub seed: u64,
}

impl Shaping {
    /// Validates the flags; every error names its flag.
    pub fn from_flags(f: &ShapingFlags) -> Result<Shaping, String> {
        let window_us = f
            .window
            .map(filter::parse_window)
            .transpose()
            .map_err(|e| format!("--window: {e}"))?;
        let max_gap_us = f
            .max_gap
            .map(filter::parse_duration_us)
            .transpose()
            .map_err(|e| format!("--max-gap: {e}"))?;
        if f.loops == Some(0) {
            return Err("--loop 0: must be at least 1".into());
        }
        if f.overlay == Some(0) {
            return Err("--overlay 0: must be at least 1".into());
        }
        if f.overlay_distinct && f.overlay.is_none() {
            return Err("--overlay-distinct needs --overlay K".into());
        }
        if !(f.burstiness.is_finite() && f.burstiness > 0.0) {
            return Err(format!(
                "--burstiness {}: must be a positive number",
                f.burstiness
            ));
        }
        let arrivals = match (f.request_rate, f.ramp_up) {
            (Some(_), Some(_)) => {
                return Err("--request-rate and --ramp-up exclude each other".into())
            }
            (Some(rate), None) => {
                if rate.is_nan() || rate <= 0.0 {
                    return Err(format!("--request-rate {rate}: must be positive (or inf)"));
                }
                Some(Arrivals::Rate {
                    rate,
                    burstiness: f.burstiness,
                })
            }
            (None, Some(kind)) => {
                let exponential = match kind {
                    "linear" => false,
                    "exponential" => true,
                    other => {
                        return Err(format!("--ramp-up {other}: must be linear or exponential"))
                    }
                };
                let get = |v: Option<f64>, flag: &str| match v {
                    Some(x) if x.is_finite() && x > 0.0 => Ok(x),
                    Some(x) => Err(format!("{flag} {x}: must be a positive number")),
                    None => Err(format!("--ramp-up needs {flag}")),
                };
                Some(Arrivals::Ramp {
                    exponential,
                    start: get(f.ramp_up_start_rps, "--ramp-up-start-rps")?,
                    end: get(f.ramp_up_end_rps, "--ramp-up-end-rps")?,
                    burstiness: f.burstiness,
                })
            }
            (None, None) => {
                if f.ramp_up_start_rps.is_some() || f.ramp_up_end_rps.is_some() {
                    return Err("--ramp-up-start-rps/--ramp-up-end-rps need --ramp-up".into());
                }
                None
            }
        };
        let shard = f
            .shard
            .map(shape::parse_shard)
            .transpose()
            .map_err(|e| format!("--shard: {e}"))?;
        Ok(Shaping {
            window_us,
            loops: f.loops.unwrap_or(1),
            overlay: f.overlay.unwrap_or(1),
            overlay_distinct: f.overlay_distinct,
            max_gap_us,
            arrivals,
            shard,
            limit: f.limit,
            seed: f.seed,
        })
    }

    /// Applies the shaping in order; returns the origin (first arrival of the shaped trace before
    /// sharding) that the schedule must measure offsets from.
    pub fn apply(&self, trace: &mut Trace) -> Result<u64, String> {
        if let Some(w) = self.window_us {
            filter::apply(
                trace,
                &filter::Filters {
                    window_us: Some(w),
                    ..Default::default()
                },
            )?;
        }
        trace.requests.sort_by_key(|r| r.arrival_us);
        shape::repeat(trace, self.loops);
        shape::overlay(trace, self.overlay, self.overlay_distinct);
        if let Some(g) = self.max_gap_us {
            shape::cap_gaps(trace, g);
        }
        if let Some(a) = &self.arrivals {
            shape::retime(trace, a, self.seed)?;
        }
        let origin = trace
            .requests
            .iter()
            .map(|r| r.arrival_us)
            .min()
            .unwrap_or(0);
        if let Some(n) = self.limit {
            // the schedule's order: stable by arrival
            trace.requests.sort_by_key(|r| r.arrival_us);
            trace.requests.truncate(n);
        }
        if let Some((i, n)) = self.shard {
            shape::shard(trace, i, n);
        }
        Ok(origin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Request, TraceHeader};

    fn flags() -> ShapingFlags<'static> {
        ShapingFlags {
            burstiness: 1.0,
            ..Default::default()
        }
    }

    #[test]
    fn flag_errors_name_the_flag() {
        let cases: Vec<(ShapingFlags, &str)> = vec![
            (
                ShapingFlags {
                    window: Some("3s"),
                    ..flags()
                },
                "--window",
            ),
            (
                ShapingFlags {
                    loops: Some(0),
                    ..flags()
                },
                "--loop",
            ),
            (
                ShapingFlags {
                    overlay_distinct: true,
                    ..flags()
                },
                "--overlay",
            ),
            (
                ShapingFlags {
                    burstiness: 0.0,
                    ..flags()
                },
                "--burstiness",
            ),
            (
                ShapingFlags {
                    request_rate: Some(-1.0),
                    ..flags()
                },
                "--request-rate",
            ),
            (
                ShapingFlags {
                    ramp_up: Some("cubic"),
                    ..flags()
                },
                "--ramp-up",
            ),
            (
                ShapingFlags {
                    ramp_up: Some("linear"),
                    ..flags()
                },
                "--ramp-up-start-rps",
            ),
            (
                ShapingFlags {
                    shard: Some("2/2"),
                    ..flags()
                },
                "--shard",
            ),
            (
                ShapingFlags {
                    max_gap: Some("x"),
                    ..flags()
                },
                "--max-gap",
            ),
        ];
        for (f, flag) in cases {
            let e = Shaping::from_flags(&f).unwrap_err();
            assert!(e.contains(flag), "{e} should name {flag}");
        }
        assert_eq!(Shaping::from_flags(&flags()).unwrap().loops, 1);
    }

    #[test]
    fn shards_keep_the_whole_traces_origin_and_times() {
        let t = Trace {
            header: TraceHeader::imported(512, true, "t"),
            requests: (0..100)
                .map(|k| Request {
                    arrival_us: 5_000_000 + k * 1000,
                    ..Default::default()
                })
                .collect(),
        };
        let mut all = Vec::new();
        for i in 0..4 {
            let s = Shaping::from_flags(&ShapingFlags {
                shard: Some(["0/4", "1/4", "2/4", "3/4"][i]),
                ..flags()
            })
            .unwrap();
            let mut x = t.clone();
            assert_eq!(s.apply(&mut x).unwrap(), 5_000_000);
            all.extend(x.requests);
        }
        all.sort_by_key(|r| r.arrival_us);
        assert_eq!(all, t.requests);
    }

    #[test]
    fn shards_of_a_limited_run_send_the_whole_runs_first_requests() {
        let t = Trace {
            header: TraceHeader::imported(512, true, "t"),
            requests: (0..100u64)
                .map(|k| Request {
                    arrival_us: (k * 7919) % 1000,
                    input_tokens: k,
                    ..Default::default()
                })
                .collect(),
        };
        let limited = |shard| {
            Shaping::from_flags(&ShapingFlags {
                limit: Some(30),
                shard,
                ..flags()
            })
            .unwrap()
        };
        let mut whole = t.clone();
        limited(None).apply(&mut whole).unwrap();
        assert_eq!(whole.requests.len(), 30);
        let mut all = Vec::new();
        for i in ["0/3", "1/3", "2/3"] {
            let mut x = t.clone();
            limited(Some(i)).apply(&mut x).unwrap();
            all.extend(x.requests);
        }
        all.sort_by_key(|r| (r.arrival_us, r.input_tokens));
        whole
            .requests
            .sort_by_key(|r| (r.arrival_us, r.input_tokens));
        assert_eq!(all, whole.requests);
    }
}
