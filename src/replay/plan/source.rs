//! The plan's records in send order, as the body builder reads them, and the survey of them
//! that is taken before the clock ([`Survey`]).
//!
//! One order of steps, written once: [`Selected`] (the selection, `--window`), then `--loop`
//! and `--overlay` when asked, then [`Stage`] (`--max-gap`, the arrival process, `--limit`,
//! `--shard`, the offsets). Streamed, the trace files are read twice through it, once for the
//! survey and once by the builder, so no record is held beyond the builder's window;
//! `--ramp-up` spreads its rates over the request count, so it reads the files once more first
//! to count them. `--loop`, `--overlay` and `--sessions` need the whole trace: then it is
//! planned in memory ([`plan_whole`]).

use crate::metrics::Api;
use crate::replay::http::request::{self, BodyOptions, Prompts};
use crate::replay::plan::shaping::Shaping;
use crate::trace::filter::{Filtering, Filters};
use crate::trace::select::{Selection, Skipped};
use crate::trace::shape::{self, Arrivals, GapCap, Retimer};
use crate::trace::stats::CacheSim;
use crate::trace::{Request, Trace, TraceError, TraceHeader};
use std::collections::{BTreeMap, VecDeque};

/// One planned send: the record, its position in the plan (from 0) and its offset from t0.
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
    Read { name: String, source: TraceError },
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
pub(crate) fn streams(shaping: &Shaping, sessions: bool) -> bool {
    !sessions && shaping.loops <= 1 && shaping.overlay <= 1 && shaping.loop_distinct.is_none()
}

/// Records per chunk of the in-memory plan (freed a chunk at a time as they are built).
const CHUNK: usize = 4096;

/// An in-memory plan as a [`Source`], in chunks, so that the plan's own memory is freed a chunk
/// at a time as the builder goes.
pub fn from_sends(sends: Vec<Planned>) -> Source {
    let mut chunks = Vec::with_capacity(sends.len().div_ceil(CHUNK));
    let mut rest = sends.into_iter();
    loop {
        let c: Vec<Planned> = rest.by_ref().take(CHUNK).collect();
        if c.is_empty() {
            break;
        }
        chunks.push(c);
    }
    Box::new(chunks.into_iter().flatten().map(Ok))
}

/// The first steps of the order, one record at a time: the selection, then `--window`. Yields
/// the records kept, in arrival order (a record out of order is an error).
pub(crate) struct Selected<I> {
    input: I,
    name: String,
    select: Selection,
    skipped: Skipped,
    window: Option<Filtering>,
    last_in: u64,
    /// Records read from the input.
    read: usize,
}

impl<I: Iterator<Item = Result<Request, TraceError>>> Selected<I> {
    /// `name` is the trace's, for errors.
    pub(crate) fn new(
        input: I,
        name: String,
        select: Selection,
        window_us: Option<(u64, u64)>,
    ) -> Result<Self, PlanError> {
        let window = window_us
            .map(|w| {
                Filtering::new(&Filters {
                    window_us: Some(w),
                    ..Default::default()
                })
            })
            .transpose()
            .map_err(PlanError::Shaping)?;
        Ok(Selected {
            input,
            name,
            select,
            skipped: Skipped::default(),
            window,
            last_in: 0,
            read: 0,
        })
    }

    fn read_error(&self, source: TraceError) -> PlanError {
        let name = self.name.clone();
        PlanError::Read { name, source }
    }

    /// Reads the rest of the input to count what the selection leaves out (as if every record
    /// had been read): those counts, and how many records the input holds.
    pub(crate) fn finish(mut self) -> Result<(Skipped, usize), PlanError> {
        while let Some(r) = self.input.next() {
            let r = r.map_err(|e| self.read_error(e))?;
            self.read += 1;
            self.skipped.keep(&r, &self.select);
        }
        Ok((self.skipped, self.read))
    }
}

impl<I: Iterator<Item = Result<Request, TraceError>>> Iterator for Selected<I> {
    type Item = Result<Request, PlanError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let r = match self.input.next()? {
                Ok(r) => r,
                Err(e) => return Some(Err(self.read_error(e))),
            };
            self.read += 1;
            if !self.skipped.keep(&r, &self.select) {
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
}

/// The last steps of the order, one record at a time: `--max-gap`, the arrival process,
/// `--limit`, then `--shard`, each send offset from the first shaped arrival and scaled by
/// `--speed`. Its input is [`Selected`] (streamed), or the selected records after `--loop` and
/// `--overlay` (whole).
pub(crate) struct Stage<I> {
    input: I,
    gaps: Option<GapCap>,
    retime: Option<Retimer>,
    limit: Option<usize>,
    shard: Option<(u32, u32)>,
    speed: f64,
    /// [`Shaping::until_ns`]: the plan ends at the first send due at or after it.
    until_ns: Option<u64>,
    origin: Option<u64>,
    shaped: usize,
    index: usize,
    done: bool,
}

impl<I: Iterator<Item = Result<Request, PlanError>>> Stage<I> {
    /// `retimed` is how many records reach the arrival process (`--ramp-up` spreads its rates
    /// over them).
    pub(crate) fn new(
        input: I,
        s: &Shaping,
        speed: f64,
        retimed: usize,
    ) -> Result<Self, PlanError> {
        let retime = s
            .arrivals
            .as_ref()
            .map(|a| Retimer::new(a, s.seed, retimed))
            .transpose()
            .map_err(PlanError::Shaping)?;
        Ok(Stage {
            input,
            gaps: s.max_gap_us.map(GapCap::new),
            retime,
            limit: s.limit,
            shard: s.shard,
            speed,
            until_ns: s.until_ns,
            origin: None,
            shaped: 0,
            index: 0,
            done: false,
        })
    }

    /// The input, as far as it was read.
    pub(crate) fn into_inner(self) -> I {
        self.input
    }

    /// The next record as shaped (gaps capped, re-timed), before the limit and the shard.
    fn shaped(&mut self) -> Option<Result<Request, PlanError>> {
        let mut r = match self.input.next()? {
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

    fn step(&mut self) -> Option<Result<Planned, PlanError>> {
        loop {
            if self.limit.is_some_and(|n| self.shaped >= n) {
                return None;
            }
            let r = match self.shaped()? {
                Ok(r) => r,
                Err(e) => return Some(Err(e)),
            };
            let origin = *self.origin.get_or_insert(r.arrival_us);
            let k = self.shaped;
            self.shaped += 1;
            if let Some((i, n)) = self.shard {
                if shape::shard_of(&r, k, n) != i {
                    continue;
                }
            }
            let rel_us = r.arrival_us - origin;
            let at_ns = (rel_us as f64 * 1000.0 / self.speed).round() as u64;
            if self.until_ns.is_some_and(|u| at_ns >= u) {
                return None;
            }
            self.index += 1;
            return Some(Ok(Planned {
                index: self.index - 1,
                at_ns,
                record: r,
            }));
        }
    }
}

impl<I: Iterator<Item = Result<Request, PlanError>>> Iterator for Stage<I> {
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

/// The whole-trace plan (`--loop`, `--overlay` and `--sessions` need it): the selection and
/// the window as streamed, then the copies made in memory, then the same [`Stage`]. Returns
/// every planned send and what the selection left out.
pub(crate) fn plan_whole<I: Iterator<Item = Result<Request, TraceError>>>(
    mut selected: Selected<I>,
    header: TraceHeader,
    shaping: &Shaping,
    speed: f64,
) -> Result<(Vec<Planned>, Skipped, usize), PlanError> {
    let (mut requests, mut bytes) = (Vec::new(), 0u64);
    for r in selected.by_ref() {
        let r = r?;
        bytes = bytes.saturating_add(held_bytes(&r));
        requests.push(r);
        if bytes > MAX_WHOLE_BYTES {
            break;
        }
    }
    check_whole(
        requests.len() as u64,
        bytes,
        trace_span_us(&requests),
        shaping,
        speed,
    )?;
    let (left_out, read) = selected.finish()?;
    let mut trace = Trace { header, requests };
    shape::repeat(&mut trace, shaping.loops, shaping.loop_distinct);
    shape::overlay(&mut trace, shaping.overlay, shaping.overlay_distinct);
    let n = trace.requests.len();
    let records = trace.requests.into_iter().map(Ok);
    let mut sends = Vec::with_capacity(n);
    for p in Stage::new(records, shaping, speed, n)? {
        sends.push(p?);
    }
    Ok((sends, left_out, read))
}

/// Most bytes a whole-trace plan holds (512 MiB): `--loop`, `--overlay` and `--sessions` keep
/// the trace, its copies and their planned sends in memory ([`held_bytes`] a request), so a
/// larger plan is refused before any copy is made, leaving room within a 1 GiB process. The
/// streamed plan has no such bound.
pub(crate) const MAX_WHOLE_BYTES: u64 = 512 << 20;

/// What one request of a whole-trace plan holds: the copy made of it and its planned send (the
/// record moves into the send, but the copies' buffer lives until the plan is made), and its
/// hash ids, body, response events and names.
fn held_bytes(r: &Request) -> u64 {
    let fixed = std::mem::size_of::<Request>() + std::mem::size_of::<Planned>();
    let response = r.response.as_deref().map_or(0, |x| {
        std::mem::size_of::<crate::trace::Response>()
            + x.events.len() * std::mem::size_of::<crate::trace::Event>()
            + x.choice_tokens.len() * 4
            + x.body.as_ref().map_or(0, Vec::len)
            + x.error.as_ref().map_or(0, String::len)
    });
    let names = [&r.model, &r.method]
        .iter()
        .map(|s| s.as_ref().map_or(0, String::len))
        .sum::<usize>()
        + r.session.as_ref().map_or(0, |s| s.id.len() + 8);
    (fixed + r.hash_ids.len() * 8 + r.body.as_ref().map_or(0, Vec::len) + response + names) as u64
}

/// [`Trace::span_us`] of `requests` (first to last arrival), as `shape::repeat` measures it.
fn trace_span_us(requests: &[Request]) -> u64 {
    let at = requests.iter().map(|r| r.arrival_us);
    at.clone().max().unwrap_or(0) - at.min().unwrap_or(0)
}

/// Refuses, before the copies are made, a whole-trace plan whose `--loop` copies alone run past
/// the longest schedule (30 days), or one of more than [`MAX_WHOLE_BYTES`] (`bytes` for one copy
/// of the `n` requests read, or a part of them when that alone was over).
fn check_whole(
    n: u64,
    bytes: u64,
    span_us: u64,
    shaping: &Shaping,
    speed: f64,
) -> Result<(), PlanError> {
    // `shape::repeat`'s period: the span and one mean gap.
    let gap = if n > 1 { span_us / (n - 1) } else { 1_000_000 };
    let period_us = span_us.saturating_add(gap.max(1));
    let looped_s = period_us as f64 * f64::from(shaping.loops.max(1)) / 1e6 / speed;
    let max_s = crate::replay::MAX_SCHEDULE.as_secs_f64();
    if shaping.loops > 1 && looped_s > max_s {
        return Err(PlanError::Shaping(format!(
            "--loop {}: the schedule would run for {:.0} days (more than {})",
            shaping.loops,
            looped_s / 86_400.0,
            max_s / 86_400.0
        )));
    }
    let copies = u64::from(shaping.loops.max(1)) * u64::from(shaping.overlay.max(1));
    let held = bytes.saturating_mul(copies);
    if held > MAX_WHOLE_BYTES {
        let over = if bytes > MAX_WHOLE_BYTES {
            "more than "
        } else {
            ""
        };
        return Err(PlanError::Shaping(format!(
            "--loop {} / --overlay {} (or --sessions) over {over}{n} requests would hold {over}{} MiB of requests in memory, more than {} MiB: replay a --window of the trace, or fewer copies",
            shaping.loops.max(1),
            shaping.overlay.max(1),
            held >> 20,
            MAX_WHOLE_BYTES >> 20,
        )));
    }
    Ok(())
}

/// Whether the arrival process needs the request count first.
pub(crate) fn needs_count(shaping: &Shaping) -> bool {
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
    pub(crate) measured: usize,
    pub(crate) span_ns: u64,
    /// `METHOD path` → requests planned.
    pub(crate) by_endpoint: BTreeMap<String, u64>,
    apis: (bool, bool),
    /// A planned request has no recorded body (its prompt is synthesised).
    pub(crate) synthesised: bool,
    /// Planned requests whose synthesised prompt is text from the target
    /// ([`Prompts::from_target`]).
    pub(crate) target_text: usize,
    /// The largest hash id planned (probes use fresh ids above it).
    pub(crate) max_hash_id: Option<u64>,
    /// A planned workload request has a recorded response.
    pub(crate) recorded: bool,
    /// `--scrape-metrics`' theoretical prefix-cache hits.
    pub(crate) theory: Option<CacheSim>,
    pub(crate) dry: DryRun,
}

impl Survey {
    /// Empty, for the trace named `name`; `theory` counts `--scrape-metrics`' theoretical hits.
    pub(crate) fn new(name: String, theory: Option<CacheSim>) -> Survey {
        Survey {
            name,
            theory,
            ..Default::default()
        }
    }

    /// Folds in planned send `p`; an error names why its request cannot be built.
    pub(crate) fn add(
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
        let synthesised = r.body.is_none() && r.is_workload();
        self.target_text += usize::from(synthesised && prompts.text_from_target(head.api));
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
    pub(crate) fn endpoint(&self) -> String {
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
pub(crate) struct DryRun {
    /// Offsets of the sends in the last second.
    second: VecDeque<u64>,
    peak: usize,
    input_tokens: u64,
    output_tokens: u64,
}

impl DryRun {
    /// The plan's output tokens (`max_tokens` as sent).
    pub(crate) fn output_tokens(&self) -> u64 {
        self.output_tokens
    }

    pub(crate) fn add(&mut self, at_ns: u64, input_tokens: u64, output_tokens: u64) {
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
    pub(crate) fn render(&self, planned: usize, span_ns: u64) -> String {
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

    /// The offsets `Stage` plans for arrivals `ms` under `--speed` and `--limit`.
    fn offsets(ms: &[u64], speed: f64, limit: Option<usize>) -> Vec<u64> {
        let records = ms.iter().map(|&m| {
            Ok(Request {
                arrival_us: m * 1000,
                ..Default::default()
            })
        });
        let s = Shaping {
            limit,
            ..Default::default()
        };
        let stage = Stage::new(records, &s, speed, ms.len()).unwrap();
        stage.map(|p| p.unwrap().at_ns).collect()
    }

    #[test]
    fn offsets_run_from_the_first_arrival_divided_by_speed_and_limit_keeps_the_first() {
        let at = offsets(&[1000, 1500, 3000], 1.0, None);
        assert_eq!(at, [0, 500_000_000, 2_000_000_000]);
        let at = offsets(&[0, 1000, 3000], 4.0, None);
        assert_eq!(at, [0, 250_000_000, 750_000_000]);
        assert_eq!(offsets(&[0, 10], 0.5, None), [0, 20_000_000]);
        assert_eq!(offsets(&[0, 5, 9], 1.0, Some(2)), [0, 5_000_000]);
        assert!(offsets(&[0], 1.0, Some(0)).is_empty());
        assert!(offsets(&[], 1.0, None).is_empty());
    }

    #[test]
    fn until_ends_the_plan_at_the_first_send_due_at_or_after_it() {
        let records = [0u64, 1000, 2000, 3000].map(|m| {
            Ok(Request {
                arrival_us: m * 1000,
                ..Default::default()
            })
        });
        let s = Shaping {
            until_ns: Some(1_000_000_000),
            ..Default::default()
        };
        let stage = Stage::new(records.into_iter(), &s, 2.0, 4).unwrap();
        let at: Vec<u64> = stage.map(|p| p.unwrap().at_ns).collect();
        assert_eq!(at, [0, 500_000_000], "at speed 2, the sends due before 1 s");
    }

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
