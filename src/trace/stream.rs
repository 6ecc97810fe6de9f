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

use super::detect::{self, ImportOptions};
use super::rows::{arrival, collect_rows, origin, walk, ImportReport, ReadOptions, Rows};
use super::{agentic, azure, custom, native, Request, Trace, TraceError, TraceHeader};
use std::io::{BufReader, Read};
use std::path::Path;

pub(crate) type Records = Box<dyn Iterator<Item = Result<Request, TraceError>> + Send>;

/// A trace file's records in arrival order, read as they are used.
pub struct TraceStream {
    pub(crate) header: TraceHeader,
    /// Rows, skipped rows, reordering and damage: known before the first record.
    pub(crate) report: ImportReport,
    /// The first record's arrival, when known before it is read (native files: from the first
    /// pass), so that a merge can leave a stream unread until its time comes.
    pub(crate) earliest: Option<u64>,
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
    pub(crate) fn new(header: TraceHeader, report: ImportReport, records: Records) -> TraceStream {
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
    let ro = opts.read_options();
    let buffered = || file().map(|f| BufReader::with_capacity(1 << 16, f));
    use detect::Format;
    match format {
        Format::Native => native_stream(path, opts.block_size),
        Format::Mooncake => stream_rows(&name, &ro, || {
            Ok(super::mooncake::rows(&name, buffered()?, opts.block_size))
        }),
        Format::Azure => stream_rows(&name, &ro, || azure::azure_rows(&name, buffered()?)),
        Format::Burstgpt => stream_rows(&name, &ro, || azure::burstgpt_rows(&name, buffered()?)),
        Format::Sessions | Format::Custom => {
            let data = super::rows::read_whole(path).map_err(io)?;
            let (t, rep) = match format {
                Format::Sessions => agentic::read(&name, &data, &ro)?,
                _ => custom::read(&name, &data, &ro)?,
            };
            Ok(in_memory(t, rep))
        }
    }
}

/// A trace already in memory, as a stream.
pub(crate) fn in_memory(trace: Trace, report: ImportReport) -> TraceStream {
    TraceStream {
        earliest: trace.requests.iter().map(|r| r.arrival_us).min(),
        header: trace.header,
        report,
        records: Box::new(trace.requests.into_iter().map(Ok)),
    }
}

fn native_stream(path: &Path, block_size: Option<u32>) -> Result<TraceStream, TraceError> {
    let s = native::NativeStream::open_as(path, block_size)?;
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
pub(crate) fn import_report(rep: &native::ReadReport) -> ImportReport {
    ImportReport {
        rows: rep.records,
        reordered: rep.reordered,
        damage: (!rep.is_clean()).then(|| rep.summary()),
        ..Default::default()
    }
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
