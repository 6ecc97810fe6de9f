//! The plan's records in send order, as the body builder reads them, and the survey of them
//! that is taken before the clock ([`Survey`]).
//!
//! Streamed ([`Stage`]): the trace files are read twice, once for the survey and once by the
//! builder, each time through the same per-record selection, shaping and schedule, so no record
//! is held beyond the builder's window. `--ramp-up` spreads its rates over the request count, so
//! it reads the files once more first to count them. `--loop`, `--overlay` and `--sessions` need
//! the whole trace: then it is read, shaped and planned in memory ([`in_plan_order`]).

use super::request::{self, BodyOptions, Prompts};
use super::schedule::PlannedSend;
use super::shaping::Shaping;
use crate::metrics::Api;
use crate::trace::filter::{Filtering, Filters};
use crate::trace::select::{Selection, Skipped};
use crate::trace::shape::{self, Arrivals, GapCap, Retimer};
use crate::trace::stats::PrefixCache;
use crate::trace::stream::TraceStream;
use crate::trace::{Request, Trace};
use std::collections::{BTreeMap, VecDeque};

/// One planned send: the record, its index in the shaped trace and its offset from t0.
pub struct Planned {
    pub index: usize,
    pub at_ns: u64,
    pub record: Request,
}

/// The builder's input, in plan order.
pub type Source = Box<dyn Iterator<Item = Result<Planned, PlanError>> + Send>;

/// Why a plan could not be read, shaped or surveyed.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{name}: {source}")]
    Read {
        name: String,
        source: crate::trace::TraceError,
    },
    #[error("{name}: records out of arrival order")]
    OutOfOrder { name: String },
    /// A shaping flag's numbers (the transforms' own message).
    #[error("{0}")]
    Shaping(String),
    /// A planned request that cannot be built.
    #[error("{name}: request {index}: {why}")]
    Request {
        name: String,
        index: usize,
        why: String,
    },
}

/// Whether the shaping can be applied one record at a time (else the trace is read whole).
pub fn streams(shaping: &Shaping, sessions: bool) -> bool {
    !sessions && shaping.loops <= 1 && shaping.overlay <= 1
}

/// Records per chunk of the in-memory plan (freed a chunk at a time as they are built).
const CHUNK: usize = 4096;

/// The shaped trace's records in plan order, in chunks (records the plan does not send are
/// freed now, the others a chunk at a time as the builder goes).
pub fn in_plan_order(trace: Trace, plan: &[PlannedSend]) -> Vec<Vec<Planned>> {
    let mut records: Vec<Option<Request>> = trace.requests.into_iter().map(Some).collect();
    plan.chunks(CHUNK)
        .map(|c| {
            c.iter()
                .filter_map(|p| {
                    let record = records.get_mut(p.index)?.take()?;
                    Some(Planned {
                        index: p.index,
                        at_ns: p.at_ns,
                        record,
                    })
                })
                .collect()
        })
        .collect()
}

/// Chunks as a [`Source`].
pub fn from_chunks(chunks: Vec<Vec<Planned>>) -> Source {
    Box::new(chunks.into_iter().flatten().map(Ok))
}

/// What shapes a streamed plan (the replay's flags).
#[derive(Clone)]
pub struct StageOptions {
    pub select: Selection,
    pub shaping: Shaping,
    pub speed: f64,
    /// Requests the arrival process re-times (`--ramp-up` spreads its rates over them).
    pub retimed: usize,
}

/// A trace stream selected, shaped and planned one record at a time, in the order
/// [`super::plan`] gives the same trace read whole.
pub struct Stage {
    input: TraceStream,
    name: String,
    o: StageOptions,
    skipped: Skipped,
    window: Option<Filtering>,
    gaps: Option<GapCap>,
    retime: Option<Retimer>,
    last_in: u64,
    /// Records read from the input.
    read: usize,
    origin: Option<u64>,
    shaped: usize,
    index: usize,
    done: bool,
}

impl Stage {
    pub fn new(input: TraceStream, name: String, o: StageOptions) -> Result<Stage, PlanError> {
        let s = &o.shaping;
        let window = s
            .window_us
            .map(|w| {
                let f = Filters {
                    window_us: Some(w),
                    ..Default::default()
                };
                Filtering::new(&f)
            })
            .transpose()
            .map_err(PlanError::Shaping)?;
        let retime = s
            .arrivals
            .as_ref()
            .map(|a| Retimer::new(a, s.seed, o.retimed))
            .transpose()
            .map_err(PlanError::Shaping)?;
        Ok(Stage {
            input,
            name,
            skipped: Skipped::default(),
            window,
            gaps: s.max_gap_us.map(GapCap::new),
            retime,
            last_in: 0,
            read: 0,
            origin: None,
            shaped: 0,
            index: 0,
            done: false,
            o,
        })
    }

    /// The next record past the selection and the window, in arrival order.
    fn selected(&mut self) -> Option<Result<Request, PlanError>> {
        loop {
            let r = match self.input.next()? {
                Ok(r) => r,
                Err(source) => {
                    let name = self.name.clone();
                    return Some(Err(PlanError::Read { name, source }));
                }
            };
            self.read += 1;
            if !self.skipped.keep(&r, &self.o.select) {
                continue;
            }
            let r = match &mut self.window {
                Some(w) => match w.keep(r) {
                    Some(r) => r,
                    None => continue,
                },
                None => r,
            };
            if r.arrival_us < self.last_in {
                let name = self.name.clone();
                return Some(Err(PlanError::OutOfOrder { name }));
            }
            self.last_in = r.arrival_us;
            return Some(Ok(r));
        }
    }

    /// The next record as shaped (gaps capped, re-timed), before the limit and the shard.
    fn shaped(&mut self) -> Option<Result<Request, PlanError>> {
        let mut r = match self.selected()? {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        if let Some(g) = &mut self.gaps {
            r.arrival_us = g.arrival(r.arrival_us);
        }
        if let Some(t) = &mut self.retime {
            match t.next_arrival() {
                Ok(a) => r.arrival_us = a,
                Err(e) => return Some(Err(PlanError::Shaping(e))),
            }
        }
        Some(Ok(r))
    }

    /// How many records reach the arrival process (the count `--ramp-up` spreads over).
    pub fn count_retimed(mut self) -> Result<usize, PlanError> {
        let mut n = 0;
        while let Some(r) = self.selected() {
            r?;
            n += 1;
        }
        Ok(n)
    }

    /// Reads the rest of the input to count what the selection leaves out (as a whole read
    /// would): those counts, and how many records the input holds.
    pub fn finish(mut self) -> Result<(Skipped, usize), PlanError> {
        self.done = true;
        while let Some(r) = self.input.next() {
            let r = r.map_err(|source| PlanError::Read {
                name: self.name.clone(),
                source,
            })?;
            self.read += 1;
            self.skipped.keep(&r, &self.o.select);
        }
        Ok((self.skipped, self.read))
    }

    fn step(&mut self) -> Option<Result<Planned, PlanError>> {
        loop {
            if self.o.shaping.limit.is_some_and(|n| self.shaped >= n) {
                return None;
            }
            let r = match self.shaped()? {
                Ok(r) => r,
                Err(e) => return Some(Err(e)),
            };
            let origin = *self.origin.get_or_insert(r.arrival_us);
            let k = self.shaped;
            self.shaped += 1;
            if let Some((i, n)) = self.o.shaping.shard {
                if shape::shard_of(&r, k, n) != i {
                    continue;
                }
            }
            let rel_us = r.arrival_us - origin;
            let at_ns = (rel_us as f64 * 1000.0 / self.o.speed).round() as u64;
            self.index += 1;
            return Some(Ok(Planned {
                index: self.index - 1,
                at_ns,
                record: r,
            }));
        }
    }
}

impl Iterator for Stage {
    type Item = Result<Planned, PlanError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = self.step();
        if !matches!(next, Some(Ok(_))) {
            self.done = true;
        }
        next
    }
}

/// Whether the arrival process needs the request count first.
pub fn needs_count(shaping: &Shaping) -> bool {
    matches!(shaping.arrivals, Some(Arrivals::Ramp { .. }))
}

/// What the replay knows of its plan before the clock: counts, span, routes, and the checks
/// that every planned request can be built (folded one planned send at a time).
#[derive(Default)]
pub struct Survey {
    /// The trace's name (errors name it).
    name: String,
    pub planned: usize,
    /// Planned sends that are not side requests.
    pub measured: usize,
    pub span_ns: u64,
    /// `METHOD path` → requests planned.
    pub by_endpoint: BTreeMap<String, u64>,
    apis: (bool, bool),
    /// A planned request has no recorded body (its prompt is synthesised).
    pub synthesised: bool,
    /// The largest hash id planned (probes use fresh ids above it).
    pub max_hash_id: Option<u64>,
    /// A planned workload request has a recorded response.
    pub recorded: bool,
    /// `--scrape-metrics`' theoretical prefix-cache hits.
    pub theory: Option<PrefixCache>,
    pub dry: DryRun,
}

impl Survey {
    /// Empty, for the trace named `name`; `theory` counts `--scrape-metrics`' theoretical hits.
    pub fn new(name: String, theory: Option<PrefixCache>) -> Survey {
        Survey {
            name,
            theory,
            ..Default::default()
        }
    }

    /// Folds in planned send `p`; an error names why its request cannot be built.
    pub fn add(
        &mut self,
        p: &Planned,
        opts: &BodyOptions,
        prompts: &Prompts,
    ) -> Result<(), PlanError> {
        let r = &p.record;
        let head = request::head(r, opts, prompts).map_err(|why| PlanError::Request {
            name: self.name.clone(),
            index: p.index,
            why,
        })?;
        self.planned += 1;
        self.measured += usize::from(!head.aux);
        self.span_ns = self.span_ns.max(p.at_ns);
        *self
            .by_endpoint
            .entry(format!("{} {}", head.method, head.path))
            .or_default() += 1;
        match head.api {
            Api::Completions => self.apis.0 = true,
            Api::Chat => self.apis.1 = true,
        }
        self.synthesised |= r.body.is_none();
        if let Some(&m) = r.hash_ids.iter().max() {
            self.max_hash_id = Some(self.max_hash_id.map_or(m, |x| x.max(m)));
        }
        self.recorded |= !head.aux && r.response.is_some();
        if let Some(t) = &mut self.theory {
            t.add(r);
        }
        self.dry.add(p.at_ns, r.input_tokens, r.output_tokens);
        Ok(())
    }

    /// The result's `endpoint`: the one API every planned request used, or `mixed`.
    pub fn endpoint(&self) -> String {
        match self.apis {
            (true, true) => "mixed",
            (false, true) => "chat",
            _ => "completions",
        }
        .into()
    }
}

/// What the `--dry-run` summary adds to the survey's counts, folded over the planned sends in
/// offset order.
#[derive(Default)]
pub struct DryRun {
    /// Offsets of the sends in the last second.
    second: VecDeque<u64>,
    peak: usize,
    input_tokens: u64,
    output_tokens: u64,
}

impl DryRun {
    pub fn add(&mut self, at_ns: u64, input_tokens: u64, output_tokens: u64) {
        while self
            .second
            .front()
            .is_some_and(|&f| at_ns - f >= 1_000_000_000)
        {
            self.second.pop_front();
        }
        self.second.push_back(at_ns);
        self.peak = self.peak.max(self.second.len());
        self.input_tokens += input_tokens;
        self.output_tokens += output_tokens;
    }

    /// The summary of `planned` sends spanning `span_ns`.
    pub fn render(&self, planned: usize, span_ns: u64) -> String {
        let dur_s = span_ns as f64 / 1e9;
        let mean = if dur_s > 0.0 {
            planned as f64 / dur_s
        } else {
            0.0
        };
        let row = |k: &str, v: String| format!("{k:<40} {v:<10}\n");
        [
            row("Planned requests:", planned.to_string()),
            row("Schedule duration (s):", format!("{dur_s:.2}")),
            row("Mean request rate (req/s):", format!("{mean:.2}")),
            row(
                "Peak request rate (req/s, 1 s window):",
                self.peak.to_string(),
            ),
            row("Total input tokens:", self.input_tokens.to_string()),
            row("Total output tokens:", self.output_tokens.to_string()),
        ]
        .concat()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dry_run_summary_counts() {
        let mut d = DryRun::default();
        for (at, i, o) in [(0, 10, 1), (500_000_000, 20, 2), (2_000_000_000, 30, 3)] {
            d.add(at, i, o);
        }
        let s = d.render(3, 2_000_000_000);
        for want in [
            "Planned requests:                        3",
            "Peak request rate (req/s, 1 s window):   2",
            "Total input tokens:                      60",
            "Schedule duration (s):                   2.00",
        ] {
            assert!(s.contains(want), "{s}");
        }
    }
}
