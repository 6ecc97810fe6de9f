//! Trace files read as a stream of records in arrival order, with bounded memory.
//!
//! [`open`] detects the format from the file's first bytes and returns a [`TraceStream`]: the
//! header, the import report (complete before the first record, so a bad row fails before
//! anything is used) and the records one by one. Every streaming reader makes two passes over
//! the file: the first parses everything once and keeps only what the report and the order need,
//! the second yields the records.
//! - Native: frame by frame, merged by arrival across frames ([`native::NativeStream`]).
//! - Mooncake JSONL, Azure and BurstGPT CSV: row by row when the file is in time order (the
//!   first pass also finds the earliest timestamp the CSV formats count from); a file out of
//!   time order is sorted in memory in the second pass (counted as `reordered`).
//! - Session JSON and vLLM custom JSONL are read whole (one JSON document; text prompts).

use super::mooncake::{ImportReport, ReadOptions};
use super::{azure, custom, detect, native, sessions, Request, Trace, TraceError, TraceHeader};
use crate::trace::import::ImportOptions;
use std::io::{BufReader, Read};
use std::path::Path;

/// One parsed row: its line, and its timestamp (µs, the importer's own origin) with the request
/// (its arrival is set from the timestamp), or why the row is malformed.
pub(crate) type Row = (u64, Result<(i64, Request), String>);

/// How a row's timestamp becomes an arrival.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Rebase {
    /// The timestamp is the arrival.
    Keep,
    /// Offsets from the earliest row.
    FromEarliest,
    /// Offsets from the earliest row, whose wall-clock time becomes `t0_unix_us`.
    FromEarliestWallClock,
}

/// A line-oriented importer's rows in file order.
pub(crate) struct Rows<'a> {
    pub header: TraceHeader,
    pub rebase: Rebase,
    pub iter: Box<dyn Iterator<Item = Result<Row, TraceError>> + Send + 'a>,
}

pub type Records = Box<dyn Iterator<Item = Result<Request, TraceError>> + Send>;

/// A trace file's records in arrival order, read as they are used.
pub struct TraceStream {
    pub header: TraceHeader,
    /// Rows, skipped rows, reordering and damage: known before the first record.
    pub report: ImportReport,
    /// The first record's arrival, when known before it is read (native files: from the first
    /// pass), so that a merge can leave a stream unread until its time comes.
    pub earliest: Option<u64>,
    records: Records,
}

impl Iterator for TraceStream {
    type Item = Result<Request, TraceError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.records.next()
    }
}

impl TraceStream {
    /// A stream of `records` under `header`.
    pub fn new(header: TraceHeader, report: ImportReport, records: Records) -> TraceStream {
        TraceStream {
            header,
            report,
            earliest: None,
            records,
        }
    }

    /// The whole trace in memory.
    pub fn collect_trace(self) -> Result<(Trace, ImportReport), TraceError> {
        let requests = self.records.collect::<Result<Vec<_>, _>>()?;
        let trace = Trace {
            header: self.header,
            requests,
        };
        Ok((trace, self.report))
    }
}

/// Bytes read from the start of a file to detect its format.
const SNIFF_BYTES: u64 = 1 << 20;

/// Opens a trace file of any supported format as a stream (first pass done).
pub fn open(path: &Path, opts: &ImportOptions) -> Result<TraceStream, TraceError> {
    let name = path.display().to_string();
    let io = |e| TraceError::Io {
        path: name.clone(),
        source: e,
    };
    let file = || std::fs::File::open(path).map_err(io);
    let format = match opts.format {
        Some(f) => f,
        None => {
            let mut head = Vec::new();
            file()?
                .take(SNIFF_BYTES)
                .read_to_end(&mut head)
                .map_err(io)?;
            detect::detect(&name, &head)?
        }
    };
    let ro = ReadOptions {
        skip_bad: opts.skip_bad,
    };
    let buffered = || file().map(|f| BufReader::with_capacity(1 << 16, f));
    use detect::Format;
    match format {
        Format::Native => native_stream(path),
        Format::Mooncake => {
            stream_rows(&name, &ro, || Ok(super::mooncake::rows(&name, buffered()?)))
        }
        Format::Azure => stream_rows(&name, &ro, || azure::azure_rows(&name, buffered()?)),
        Format::Burstgpt => stream_rows(&name, &ro, || azure::burstgpt_rows(&name, buffered()?)),
        Format::Sessions | Format::Custom => {
            let data = std::fs::read(path).map_err(io)?;
            let (t, rep) = match format {
                Format::Sessions => sessions::read(&name, &data, &ro)?,
                _ => custom::read(&name, &data, &ro)?,
            };
            Ok(in_memory(t, rep))
        }
    }
}

/// A trace already in memory, as a stream.
pub fn in_memory(trace: Trace, report: ImportReport) -> TraceStream {
    TraceStream {
        earliest: trace.requests.iter().map(|r| r.arrival_us).min(),
        header: trace.header,
        report,
        records: Box::new(trace.requests.into_iter().map(Ok)),
    }
}

fn native_stream(path: &Path) -> Result<TraceStream, TraceError> {
    let s = native::NativeStream::open(path)?;
    let rep = s.report();
    if !rep.is_clean() {
        tracing::warn!("{}: {}", path.display(), rep.summary());
    }
    let report = import_report(rep);
    Ok(TraceStream {
        header: s.header().clone(),
        report,
        earliest: s.earliest(),
        records: Box::new(s),
    })
}

/// A native read report as an importer's.
pub fn import_report(rep: &native::ReadReport) -> ImportReport {
    ImportReport {
        rows: rep.records,
        reordered: rep.reordered,
        damage: (!rep.is_clean()).then(|| rep.summary()),
        ..Default::default()
    }
}

/// Walks rows with the skip rule: a malformed row fails the read or, with `skip_bad`, is counted
/// and left out. `keep` gets each good row.
fn walk(
    path: &str,
    rows: Rows<'_>,
    opts: &ReadOptions,
    rep: &mut ImportReport,
    mut keep: impl FnMut(i64, Request),
) -> Result<(), TraceError> {
    for row in rows.iter {
        match row? {
            (_, Ok((at, r))) => keep(at, r),
            (line, Err(msg)) if opts.skip_bad => rep.bad_row(line, msg),
            (line, Err(msg)) => {
                return Err(TraceError::Row {
                    path: path.to_string(),
                    line,
                    msg,
                })
            }
        }
    }
    Ok(())
}

/// The origin arrivals count from, and the header with it.
fn origin(rebase: Rebase, earliest: Option<i64>, header: &mut TraceHeader) -> i64 {
    let earliest = earliest.unwrap_or(0);
    match rebase {
        Rebase::Keep => 0,
        Rebase::FromEarliest => earliest,
        Rebase::FromEarliestWallClock => {
            header.t0_unix_us = Some(earliest);
            earliest
        }
    }
}

fn arrival(at: i64, base: i64) -> u64 {
    at.saturating_sub(base).max(0) as u64
}

/// A whole line-oriented trace in memory: rows kept, rebased and sorted (stable) by arrival.
pub(crate) fn collect_rows(
    path: &str,
    rows: Rows<'_>,
    opts: &ReadOptions,
) -> Result<(Trace, ImportReport), TraceError> {
    let (mut header, rebase) = (rows.header.clone(), rows.rebase);
    let mut rep = ImportReport::default();
    let mut raw = Vec::new();
    walk(path, rows, opts, &mut rep, |at, r| raw.push((at, r)))?;
    let base = origin(rebase, raw.iter().map(|r| r.0).min(), &mut header);
    let requests = raw
        .into_iter()
        .map(|(at, r)| Request {
            arrival_us: arrival(at, base),
            ..r
        })
        .collect::<Vec<_>>();
    rep.rows = requests.len() as u64;
    let mut trace = Trace { header, requests };
    rep.reordered = trace.sort_by_arrival();
    Ok((trace, rep))
}

/// Two passes over a line-oriented file: the first checks every row and finds the earliest
/// timestamp and whether the rows are in time order; the second yields them (sorted in memory
/// when they were not in order).
fn stream_rows(
    path: &str,
    opts: &ReadOptions,
    open: impl Fn() -> Result<Rows<'static>, TraceError>,
) -> Result<TraceStream, TraceError> {
    let first = open()?;
    let (mut header, rebase) = (first.header.clone(), first.rebase);
    let mut rep = ImportReport::default();
    let (mut rows, mut reordered) = (0u64, 0u64);
    let (mut earliest, mut last) = (i64::MAX, i64::MIN);
    walk(path, first, opts, &mut rep, |at, _| {
        rows += 1;
        reordered += u64::from(at < last);
        last = at;
        earliest = earliest.min(at);
    })?;
    (rep.rows, rep.reordered) = (rows, reordered);
    let base = origin(rebase, (rows > 0).then_some(earliest), &mut header);
    if reordered > 0 {
        // Out of time order: sorted in memory (the one case a text trace is held whole).
        let (trace, _) = collect_rows(path, open()?, opts)?;
        return Ok(in_memory(trace, rep));
    }
    // The first pass checked every row: the second leaves out the same bad ones silently.
    let records = open()?.iter.filter_map(move |row| match row {
        Ok((_, Ok((at, r)))) => Some(Ok(Request {
            arrival_us: arrival(at, base),
            ..r
        })),
        Ok((_, Err(_))) => None,
        Err(e) => Some(Err(e)),
    });
    Ok(TraceStream {
        header,
        report: rep,
        earliest: (rows > 0).then(|| arrival(earliest, base)),
        records: Box::new(records),
    })
}
