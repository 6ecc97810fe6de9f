//! Azure LLM inference traces (2023 and the 2024 one-week files), and BurstGPT: CSV readers.
//!
//! Azure: header `TIMESTAMP,ContextTokens,GeneratedTokens`; TIMESTAMP is wall-clock text with up
//! to 7 fractional digits and no zone (read as UTC); arrival offsets are taken from the earliest
//! row, whose time becomes the header's `t0_unix_us`. BurstGPT: columns found by name
//! (`Timestamp` in seconds from the trace start, `Model`, `Request tokens`, `Response tokens`,
//! optional `Session ID`, `Log Type`). Neither format has prefix hashes, so requests carry none.
//! Rows out of order are sorted (stable) and counted; malformed rows fail with their line number
//! or, with `skip_bad`, are counted and skipped.

use super::rows::{ImportReport, ReadOptions, MAX_TOKENS};
use super::rows::{LineRow, Rebase, Rows};
use super::{Request, Session, Trace, TraceError, TraceHeader};
use chrono::NaiveDateTime;
use std::io::Read;

fn row_err(path: &str, line: u64, msg: String) -> TraceError {
    TraceError::Row {
        path: path.to_string(),
        line,
        msg,
    }
}

fn tokens(field: &str, name: &str) -> Result<u64, String> {
    let t = field.trim();
    let v: u64 = match t.parse::<u64>() {
        Ok(v) => v,
        // Some exports write counts as floats ("123.0").
        Err(_) => match t.parse::<f64>() {
            Ok(f) if f >= 0.0 && f.fract() == 0.0 && f <= MAX_TOKENS as f64 => f as u64,
            _ => return Err(format!("{name} `{t}` is not a non-negative integer")),
        },
    };
    if v > MAX_TOKENS {
        return Err(format!(
            "{name} {v} is over the limit of {MAX_TOKENS} tokens"
        ));
    }
    Ok(v)
}

/// Parses an Azure TIMESTAMP into µs since the Unix epoch (UTC assumed).
pub(crate) fn parse_azure_time(s: &str) -> Result<i64, String> {
    let t = NaiveDateTime::parse_from_str(s.trim(), "%Y-%m-%d %H:%M:%S%.f")
        .map_err(|e| format!("TIMESTAMP `{}`: {e}", s.trim()))?;
    Ok(t.and_utc().timestamp_micros())
}

/// A CSV reader past its header, the header, and the positions of the `names` columns (matched
/// case-insensitively), or an error naming them.
fn open<R: Read, const N: usize>(
    path: &str,
    data: R,
    names: [&str; N],
) -> Result<(csv::Reader<R>, csv::StringRecord, [usize; N]), TraceError> {
    let mut rd = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(false)
        .trim(csv::Trim::All)
        .from_reader(data);
    let hdr = rd
        .headers()
        .cloned()
        .map_err(|e| row_err(path, 1, e.to_string()))?;
    let mut cols = [0; N];
    for (slot, name) in cols.iter_mut().zip(names) {
        *slot = hdr
            .iter()
            .position(|h| h.eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                let msg = format!("expected columns {}; `{name}` is missing", names.join(", "));
                row_err(path, 1, msg)
            })?;
    }
    Ok((rd, hdr, cols))
}

/// Each data row parsed by `parse`, with its line number.
fn csv_rows<'a, R: Read + Send + 'a>(
    rd: csv::Reader<R>,
    mut parse: impl FnMut(&csv::StringRecord) -> Result<(i64, Request), String> + Send + 'a,
) -> Box<dyn Iterator<Item = Result<LineRow, TraceError>> + Send + 'a> {
    Box::new(rd.into_records().enumerate().map(move |(k, rec)| {
        let row = rec.map_err(|e| e.to_string()).and_then(|r| parse(&r));
        Ok((k as u64 + 2, row))
    }))
}

/// Reads an Azure LLM inference trace CSV.
pub(crate) fn read_azure(
    path: &str,
    data: &[u8],
    opts: &ReadOptions,
) -> Result<(Trace, ImportReport), TraceError> {
    super::rows::collect_rows(path, azure_rows(path, data)?, opts)
}

/// Azure rows in file order; arrivals are offsets from the earliest row, whose time is the
/// header's `t0_unix_us`.
pub(crate) fn azure_rows<'a, R: Read + Send + 'a>(
    path: &str,
    data: R,
) -> Result<Rows<'a>, TraceError> {
    let names = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"];
    let (rd, _, [ct, cc, cg]) = open(path, data, names)?;
    let iter = csv_rows(rd, move |r| {
        let f = |i: usize| r.get(i).unwrap_or("");
        let req = Request {
            input_tokens: tokens(f(cc), "ContextTokens")?,
            output_tokens: tokens(f(cg), "GeneratedTokens")?,
            ..Default::default()
        };
        Ok((parse_azure_time(f(ct))?, req))
    });
    Ok(Rows {
        header: TraceHeader::imported(512, true, format!("azure:{path}")),
        rebase: Rebase::FromEarliestWallClock,
        iter,
    })
}

/// Reads a BurstGPT CSV.
pub(crate) fn read_burstgpt(
    path: &str,
    data: &[u8],
    opts: &ReadOptions,
) -> Result<(Trace, ImportReport), TraceError> {
    super::rows::collect_rows(path, burstgpt_rows(path, data)?, opts)
}

/// BurstGPT rows in file order (session turns numbered in file order); arrivals are offsets
/// from the earliest row, as the other importers do.
pub(crate) fn burstgpt_rows<'a, R: Read + Send + 'a>(
    path: &str,
    data: R,
) -> Result<Rows<'a>, TraceError> {
    let names = ["Timestamp", "Request tokens", "Response tokens"];
    let (rd, hdr, [ct, ci, co]) = open(path, data, names)?;
    let col = |name: &str| hdr.iter().position(|h| h.eq_ignore_ascii_case(name));
    let (cm, cs) = (col("Model"), col("Session ID"));
    let mut turns: std::collections::HashMap<String, u32> = Default::default();
    let iter = csv_rows(rd, move |r| {
        let f = |i: usize| r.get(i).unwrap_or("").to_string();
        let ts: f64 = f(ct)
            .parse()
            .map_err(|_| format!("Timestamp `{}` is not a number", f(ct)))?;
        if !ts.is_finite() || !(0.0..=1e10).contains(&ts) {
            return Err(format!("Timestamp {ts} is negative or absurd"));
        }
        let mut req = Request {
            input_tokens: tokens(&f(ci), "Request tokens")?,
            output_tokens: tokens(&f(co), "Response tokens")?,
            model: cm.map(f).filter(|m| !m.is_empty()),
            ..Default::default()
        };
        if let Some(sid) = cs.map(f).filter(|s| !s.is_empty()) {
            let turn = turns.entry(sid.clone()).or_insert(0);
            req.session = Some(Session {
                id: sid,
                turn: *turn,
                think_us: None,
            });
            *turn += 1;
        }
        Ok(((ts * 1e6).round() as i64, req))
    });
    Ok(Rows {
        header: TraceHeader::imported(512, true, format!("burstgpt:{path}")),
        rebase: Rebase::FromEarliest,
        iter,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn azure_rows_are_offsets_from_first() {
        let csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,2\n2023-11-16 18:15:47.0000000,20,3";
        let (t, rep) = read_azure("a.csv", csv.as_bytes(), &ReadOptions::default()).unwrap();
        assert_eq!(rep.rows, 2);
        assert_eq!(t.requests[1].arrival_us, 319_410);
        assert_eq!(t.requests[1].input_tokens, 20);
        assert!(t.header.t0_unix_us.unwrap() > 1_700_000_000_000_000);
    }

    #[test]
    fn azure_bad_row_names_line() {
        let csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,2\nnot a time,1,1\n";
        let e = read_azure("a.csv", csv.as_bytes(), &ReadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("a.csv:3:"), "{e}");
        let (_, rep) = read_azure(
            "a.csv",
            csv.as_bytes(),
            &ReadOptions {
                skip_bad: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!((rep.rows, rep.skipped), (1, 1));
    }

    #[test]
    fn burstgpt_reads_columns_by_name() {
        let csv = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,Conversation log\n4.5,GPT-4,1000,0,1000,API log\n";
        let (t, rep) = read_burstgpt("b.csv", csv.as_bytes(), &ReadOptions::default()).unwrap();
        assert_eq!(rep.reordered, 1);
        assert_eq!(t.requests[0].model.as_deref(), Some("GPT-4"));
        assert_eq!(t.requests[0].arrival_us, 0);
        assert_eq!(t.requests[1].arrival_us, 500_000);
        let bad = "Timestamp,Model,Request tokens,Response tokens\n-1,x,1,1\n";
        assert!(read_burstgpt("b.csv", bad.as_bytes(), &ReadOptions::default()).is_err());
    }
}
