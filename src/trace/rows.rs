//! What the line-oriented importers share: their options and report, the bound on token
//! counts, and rows (parsed lines) turned into arrivals, whether the trace is streamed
//! ([`super::stream`]) or collected whole ([`collect_rows`]).

use super::{Request, Trace, TraceError, TraceHeader};

/// Largest token count accepted (10^7): no model's context comes near it, and a larger length
/// would make a replay build a prompt of gigabytes. Larger values are absurd, not data.
pub const MAX_TOKENS: u64 = 10_000_000;

/// Largest file read whole into memory (256 MiB): a JSON document (a result, a session trace,
/// an AIPerf export) is parsed at several times its size, so a larger one is refused before it
/// is read, and line formats are streamed instead.
pub(crate) const MAX_WHOLE_FILE: u64 = 256 << 20;

/// The bytes of `path`, read whole: at most [`MAX_WHOLE_FILE`] (a larger file, or a pipe that
/// passes it, is an `InvalidData` error saying so; nothing past the bound is held).
pub(crate) fn read_whole(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(path)?;
    let size = f.metadata().map_or(0, |m| m.len());
    if size > MAX_WHOLE_FILE {
        return Err(too_large(size));
    }
    let mut data = Vec::with_capacity(size as usize);
    f.take(MAX_WHOLE_FILE + 1).read_to_end(&mut data)?;
    if data.len() as u64 > MAX_WHOLE_FILE {
        return Err(too_large(data.len() as u64));
    }
    Ok(data)
}

fn too_large(size: u64) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!(
            "{} MiB or more, past the {} MiB a file read whole may hold",
            size >> 20,
            MAX_WHOLE_FILE >> 20
        ),
    )
}

/// The most hash ids a prompt of `blocks` blocks may carry: twice its blocks (room for
/// re-blocked tails), plus 16. Every reader refuses a record with more (an encoded run would
/// otherwise let a few bytes declare millions of ids), so the native writer will not write one.
pub(crate) fn id_limit(blocks: u64) -> u64 {
    blocks.saturating_mul(2).saturating_add(16)
}

/// An error when `ids` hash ids are more than a prompt of `blocks` blocks may carry.
pub(crate) fn check_ids(ids: usize, blocks: u64, input_tokens: u64) -> Result<(), String> {
    let limit = id_limit(blocks);
    match ids as u64 > limit {
        true => Err(format!(
            "{ids} hash ids for input length {input_tokens} (at most {limit})"
        )),
        false => Ok(()),
    }
}

/// Options shared by the line-oriented importers.
#[derive(Debug, Clone, Default)]
pub struct ReadOptions {
    /// Skip (and count) malformed rows instead of failing.
    pub(crate) skip_bad: bool,
    /// The command has `--skip-bad`: a malformed row's error names it.
    pub(crate) offer_skip_bad: bool,
    /// Tokens per hash id to read the trace with, over what the file says or its format's
    /// default ([`super::detect::ImportOptions::block_size`]).
    pub(crate) block_size: Option<u32>,
}

/// What an importer skipped or adjusted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImportReport {
    pub(crate) rows: u64,
    /// (line, message) of each skipped row (kept up to 100; `skipped` counts all).
    pub(crate) bad: Vec<(u64, String)>,
    pub(crate) skipped: u64,
    /// Rows out of time order, sorted (stable) by arrival afterwards.
    pub(crate) reordered: u64,
    /// For native traces: what was lost to truncation or corruption (see `native::ReadReport`).
    pub(crate) damage: Option<String>,
}

impl ImportReport {
    pub(crate) fn bad_row(&mut self, line: u64, msg: String) {
        self.skipped += 1;
        if self.bad.len() < 100 {
            self.bad.push((line, super::clip_quoted(&msg)));
        }
    }

    /// Rows read, the malformed ones skipped (`--skip-bad`) among them, so the counts add up:
    /// `8 rows read (2 malformed, skipped)`.
    pub(crate) fn read_summary(&self) -> String {
        let read = self.rows.saturating_add(self.skipped);
        match self.skipped {
            0 => format!("{read} rows read"),
            n => format!("{read} rows read ({n} malformed, skipped)"),
        }
    }
}

/// One parsed row: its line, and its timestamp (µs, the importer's own origin) with the request
/// (its arrival is set from the timestamp), or why the row is malformed.
pub(crate) type LineRow = (u64, Result<(i64, Request), String>);

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
    pub(crate) header: TraceHeader,
    pub(crate) rebase: Rebase,
    pub(crate) iter: Box<dyn Iterator<Item = Result<LineRow, TraceError>> + Send + 'a>,
}

/// Walks rows with the skip rule: a malformed row fails the read or, with `skip_bad`, is counted
/// and left out. `keep` gets each good row.
pub(crate) fn walk(
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
            (line, Err(msg)) => return Err(row_error(path, line, msg, opts)),
        }
    }
    Ok(())
}

/// The error of malformed row `line`: it names `--skip-bad` when the command has the flag.
pub(crate) fn row_error(path: &str, line: u64, msg: String, opts: &ReadOptions) -> TraceError {
    let msg = match opts.offer_skip_bad {
        true => format!("{msg} (--skip-bad skips and counts malformed rows)"),
        false => msg,
    };
    TraceError::Row {
        path: path.to_string(),
        line,
        msg,
    }
}

/// The origin arrivals count from, and the header with it.
pub(crate) fn origin(rebase: Rebase, earliest: Option<i64>, header: &mut TraceHeader) -> i64 {
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

pub(crate) fn arrival(at: i64, base: i64) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_past_the_whole_file_budget_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.json");
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(MAX_WHOLE_FILE + 1).unwrap(); // sparse: nothing written
        let e = read_whole(&p).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("past the 256 MiB"), "{e}");
        f.set_len(10).unwrap();
        assert_eq!(read_whole(&p).unwrap(), vec![0u8; 10]);
    }
}
