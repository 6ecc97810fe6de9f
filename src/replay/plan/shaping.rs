//! Workload shaping for replay: the `--window`, `--shard`, `--loop`, `--overlay`, `--max-gap`,
//! `--request-rate`/`--burstiness` and `--ramp-up` options, validated once; [`crate::replay::plan::source`]
//! applies them in a fixed order.
//!
//! Order: window → loop → overlay → max-gap → arrival override → limit → shard. Sharding comes
//! last so that every shard keeps the arrival times the whole shaped trace would have had (the
//! plan's origin is the shaped trace's first arrival), and `--limit` is cut before it, so N
//! shards of `--limit L` send the whole run's first L. The transforms themselves are those of
//! [`crate::trace::shape`] and [`crate::trace::filter`].

use crate::trace::shape::{self, Arrivals};

/// Validated shaping options (all off by default).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Shaping {
    pub(crate) window_us: Option<(u64, u64)>,
    pub(crate) loops: u32,
    pub(crate) overlay: u32,
    pub(crate) overlay_distinct: bool,
    pub(crate) max_gap_us: Option<u64>,
    pub(crate) arrivals: Option<Arrivals>,
    pub(crate) shard: Option<(u32, u32)>,
    /// `--limit`: the shaped trace's first N arrivals, kept before sharding.
    pub(crate) limit: Option<usize>,
    pub(crate) seed: u64,
    /// `capacity`'s: the `--loop` copies get their own hash ids, those of copies numbered from
    /// this one on (0 keeps the trace's in the first copy; no flag of replay's).
    pub(crate) loop_distinct: Option<u64>,
    /// `capacity`'s: only sends planned before this offset from t0 (ns, after `--speed`), a
    /// fixed stretch of wall-clock time (no flag of replay's).
    pub(crate) until_ns: Option<u64>,
}

/// The flag values, durations parsed.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShapingFlags<'a> {
    /// `--window`, parsed: `[start, end)` in µs of trace time.
    pub(crate) window_us: Option<(u64, u64)>,
    pub(crate) loops: Option<u32>,
    pub(crate) overlay: Option<u32>,
    pub(crate) overlay_distinct: bool,
    /// `--max-gap`, parsed, in µs.
    pub(crate) max_gap_us: Option<u64>,
    pub(crate) request_rate: Option<f64>,
    pub(crate) burstiness: f64,
    pub(crate) ramp_up: Option<&'a str>,
    pub(crate) ramp_up_start_rps: Option<f64>,
    pub(crate) ramp_up_end_rps: Option<f64>,
    pub(crate) shard: Option<&'a str>,
    pub(crate) limit: Option<usize>,
    pub(crate) seed: u64,
}

impl Shaping {
    /// Validates the flags; every error names its flag.
    pub(crate) fn from_flags(f: &ShapingFlags) -> Result<Shaping, String> {
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
            window_us: f.window_us,
            loops: f.loops.unwrap_or(1),
            overlay: f.overlay.unwrap_or(1),
            overlay_distinct: f.overlay_distinct,
            max_gap_us: f.max_gap_us,
            arrivals,
            shard,
            limit: f.limit,
            seed: f.seed,
            loop_distinct: None,
            until_ns: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Request;

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
        ];
        for (f, flag) in cases {
            let e = Shaping::from_flags(&f).unwrap_err();
            assert!(e.contains(flag), "{e} should name {flag}");
        }
        assert_eq!(Shaping::from_flags(&flags()).unwrap().loops, 1);
    }

    /// The sends of `reqs` (in arrival order) under `s`: offset and record.
    fn sends(s: &Shaping, reqs: &[Request]) -> Vec<(u64, Request)> {
        let records = reqs.iter().cloned().map(Ok);
        let stage = super::super::source::Stage::new(records, s, 1.0, reqs.len()).unwrap();
        stage
            .map(|p| p.map(|p| (p.at_ns, p.record)).unwrap())
            .collect()
    }

    fn sharded(shard: Option<&str>, limit: Option<usize>) -> Shaping {
        let f = ShapingFlags {
            shard,
            limit,
            ..flags()
        };
        Shaping::from_flags(&f).unwrap()
    }

    #[test]
    fn shards_keep_the_whole_traces_origin_and_times() {
        let reqs: Vec<Request> = (0..100)
            .map(|k| Request {
                arrival_us: 5_000_000 + k * 1000,
                ..Default::default()
            })
            .collect();
        let whole = sends(&sharded(None, None), &reqs);
        assert_eq!(whole[0].0, 0);
        let mut all = Vec::new();
        for i in ["0/4", "1/4", "2/4", "3/4"] {
            all.extend(sends(&sharded(Some(i), None), &reqs));
        }
        all.sort_by_key(|(at, _)| *at);
        assert_eq!(all, whole);
    }

    #[test]
    fn shards_of_a_limited_run_send_the_whole_runs_first_requests() {
        let mut reqs: Vec<Request> = (0..100u64)
            .map(|k| Request {
                arrival_us: (k * 7919) % 1000,
                input_tokens: k,
                ..Default::default()
            })
            .collect();
        reqs.sort_by_key(|r| r.arrival_us);
        let mut whole = sends(&sharded(None, Some(30)), &reqs);
        assert_eq!(whole.len(), 30);
        assert_eq!(whole.last().unwrap().1, reqs[29]);
        let mut all = Vec::new();
        for i in ["0/3", "1/3", "2/3"] {
            all.extend(sends(&sharded(Some(i), Some(30)), &reqs));
        }
        let key = |(at, r): &(u64, Request)| (*at, r.input_tokens);
        all.sort_by_key(key);
        whole.sort_by_key(key);
        assert_eq!(all, whole);
    }
}
