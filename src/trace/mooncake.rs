//! Mooncake JSONL (FAST'25 traces): reader and writer.
//!
//! One JSON object per line with exactly `timestamp` (integer ms from trace start), `input_length`,
//! `output_length` and `hash_ids` (one id per 512-token block, ceil). The writer emits those four
//! keys in that order, with ids compacted to 0..N-1 in order of first appearance, so the file loads
//! in `vllm bench serve --dataset-name timed_trace`, AIPerf's `mooncake_trace` and SGLang's
//! `mooncake` loaders. Reading keeps ids as they are (they are already dense).

use super::hash::IdCompactor;
use super::rows::{check_ids, ImportReport, ReadOptions, Rebase, Rows, MAX_TOKENS};
use super::{Request, Trace, TraceError, TraceHeader};
use serde::Deserialize;
use std::io::{BufRead, Write};

/// Mooncake's block size.
pub(crate) const BLOCK_SIZE: u32 = 512;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RowIn {
    timestamp: serde_json::Number,
    input_length: u64,
    output_length: u64,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// Parses one Mooncake row of `block_size` tokens per hash id. Public for fuzzing.
pub(crate) fn parse_row(line: &str, block_size: u32) -> Result<Request, String> {
    // serde would read a JSON array positionally as the row's fields.
    if !line.trim_start().starts_with('{') {
        return Err("a row must be a JSON object".into());
    }
    let row: RowIn = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let ts = if let Some(u) = row.timestamp.as_u64() {
        u as f64
    } else {
        row.timestamp.as_f64().ok_or("timestamp is not a number")?
    };
    if !ts.is_finite() || ts < 0.0 {
        return Err(format!("timestamp {ts} is negative or not finite"));
    }
    if ts > 1e15 {
        return Err(format!("timestamp {ts} ms is absurd"));
    }
    if row.input_length > MAX_TOKENS || row.output_length > MAX_TOKENS {
        return Err(format!(
            "input_length {} / output_length {} over the limit of {MAX_TOKENS} tokens",
            row.input_length, row.output_length
        ));
    }
    let blocks = super::blocks(row.input_length, block_size, true);
    check_ids(row.hash_ids.len(), blocks, row.input_length)?;
    Ok(Request {
        arrival_us: (ts * 1000.0).round() as u64,
        input_tokens: row.input_length,
        output_tokens: row.output_length,
        hash_ids: row.hash_ids,
        ..Default::default()
    })
}

/// Reads Mooncake JSONL. `path` names the source in errors.
pub fn read<R: BufRead + Send>(
    path: &str,
    input: R,
    opts: &ReadOptions,
) -> Result<(Trace, ImportReport), TraceError> {
    super::rows::collect_rows(path, rows(path, input, opts.block_size), opts)
}

/// Mooncake JSONL as rows in file order (blank lines skipped), `block_size` tokens per hash id
/// (default [`BLOCK_SIZE`]).
pub(crate) fn rows<'a, R: BufRead + Send + 'a>(
    path: &str,
    input: R,
    block_size: Option<u32>,
) -> Rows<'a> {
    let name = path.to_string();
    let bs = block_size.unwrap_or(BLOCK_SIZE);
    let iter = input.lines().enumerate().filter_map(move |(k, line)| {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                return Some(Err(TraceError::Io {
                    path: name.clone(),
                    source: e,
                }))
            }
        };
        if line.trim().is_empty() {
            return None;
        }
        let row = parse_row(&line, bs).map(|r| (r.arrival_us as i64, r));
        Some(Ok((k as u64 + 1, row)))
    });
    Rows {
        header: TraceHeader::imported(bs, true, format!("mooncake:{path}")),
        rebase: Rebase::Keep,
        iter: Box::new(iter),
    }
}

/// Writes Mooncake JSONL: timestamps in ms from the first request (rounded), ids compacted.
pub fn write<W: Write>(trace: &Trace, out: W) -> std::io::Result<()> {
    let mut w = MooncakeWriter::new(out);
    for r in &trace.requests {
        w.push(r)?;
    }
    w.finish().map(drop)
}

/// Most distinct hash ids a Mooncake export numbers (8 Mi, a table of about 272 MiB): the ids
/// are compacted to 0..N-1 in memory, so a trace with more is refused (native output keeps
/// ids as they are and holds none).
pub(crate) const MAX_EXPORT_IDS: usize = 1 << 23;

/// [`write`] one request at a time; a request past [`MAX_EXPORT_IDS`] distinct ids is refused
/// (`InvalidData`).
pub(crate) struct MooncakeWriter<W: Write> {
    out: W,
    ids: IdCompactor,
    t0: Option<u64>,
    hs: Vec<u64>,
}

impl<W: Write> MooncakeWriter<W> {
    pub(crate) fn new(out: W) -> Self {
        MooncakeWriter {
            out,
            ids: IdCompactor::new(),
            t0: None,
            hs: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, r: &Request) -> std::io::Result<()> {
        let (out, hs) = (&mut self.out, &mut self.hs);
        let t0 = *self.t0.get_or_insert(r.arrival_us);
        hs.clear();
        for &h in &r.hash_ids {
            let Some(id) = self.ids.id_within(h, MAX_EXPORT_IDS) else {
                let msg = format!(
                    "more than {MAX_EXPORT_IDS} distinct hash ids: a Mooncake export numbers ids in memory, at most that many (write native, .trace.zst, instead)"
                );
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, msg));
            };
            hs.push(id);
        }
        // Python's json.dumps layout (", " and ": "), as the published traces are written.
        let ts = (r.arrival_us.saturating_sub(t0) + 500) / 1000;
        write!(
            out,
            "{{\"timestamp\": {ts}, \"input_length\": {}, \"output_length\": {}, \"hash_ids\": [",
            r.input_tokens, r.output_tokens
        )?;
        for (k, h) in hs.iter().enumerate() {
            if k > 0 {
                out.write_all(b", ")?;
            }
            write!(out, "{h}")?;
        }
        out.write_all(b"]}\n")
    }

    pub(crate) fn finish(mut self) -> std::io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rows_and_reports_bad_lines() {
        let data = "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0, 1]}\n\
                    {\"timestamp\": 3, \"input_length\": \"x\", \"output_length\": 5, \"hash_ids\": []}\n";
        let e = read("t.jsonl", data.as_bytes(), &ReadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t.jsonl:2:"), "{e}");
        let (t, rep) = read(
            "t.jsonl",
            data.as_bytes(),
            &ReadOptions {
                skip_bad: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(t.requests.len(), 1);
        assert_eq!(rep.skipped, 1);
        assert_eq!(rep.bad[0].0, 2);
    }

    #[test]
    fn absurd_and_negative_values_and_arrays_are_errors() {
        for row in [
            r#"{"timestamp": -5, "input_length": 1, "output_length": 1, "hash_ids": []}"#,
            r#"{"timestamp": 0, "input_length": 1000000000000, "output_length": 1, "hash_ids": []}"#,
            r#"{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [], "x": 1}"#,
            r#"{"timestamp": 0, "input_length": 999999999, "output_length": 1, "hash_ids": []}"#,
            r#"[1, 2, 3, []]"#,
            r#"[1,2,3]"#,
        ] {
            assert!(parse_row(row, BLOCK_SIZE).is_err(), "{row}");
        }
    }

    #[test]
    fn more_hash_ids_than_the_input_length_allows_are_an_error() {
        let ids = |n: u64| (0..n).map(|k| k.to_string()).collect::<Vec<_>>().join(",");
        let row = |input: u64, n: u64| {
            format!(
                r#"{{"timestamp": 0, "input_length": {input}, "output_length": 1, "hash_ids": [{}]}}"#,
                ids(n)
            )
        };
        // 1 token is one block: at most 2 * 1 + 16 ids.
        assert!(parse_row(&row(1, 18), BLOCK_SIZE).is_ok());
        let e = parse_row(&row(1, 19), BLOCK_SIZE).unwrap_err();
        assert!(
            e.contains("19 hash ids for input length 1 (at most 18)"),
            "{e}"
        );
        assert!(parse_row(&row(1024, 20), BLOCK_SIZE).is_ok());
        let data = format!("{}\n{}\n", row(600, 2), row(1, 20));
        let e = read("t.jsonl", data.as_bytes(), &ReadOptions::default()).unwrap_err();
        assert!(e.to_string().starts_with("t.jsonl:2: 20 hash ids"), "{e}");
    }

    #[test]
    fn rows_are_bounded_by_the_block_size_they_are_read_with() {
        // A 1729-token prompt in blocks of `bs` tokens: ceil(1729 / bs) ids.
        for bs in [16u32, 32, 64, 128, 512] {
            let ids: Vec<String> = (0..1729u32.div_ceil(bs)).map(|k| k.to_string()).collect();
            let data = format!(
                "{{\"timestamp\": 0, \"input_length\": 1729, \"output_length\": 1, \"hash_ids\": [{}]}}\n",
                ids.join(",")
            );
            let opts = ReadOptions {
                block_size: Some(bs),
                ..Default::default()
            };
            let (t, _) =
                read("m.jsonl", data.as_bytes(), &opts).unwrap_or_else(|e| panic!("{bs}: {e}"));
            assert_eq!(t.header.block_size, bs);
            assert_eq!(t.requests[0].hash_ids.len(), ids.len());
            // Read at Mooncake's 512, the small blocks are too many ids for the prompt.
            let at_512 = read("m.jsonl", data.as_bytes(), &ReadOptions::default());
            assert_eq!(at_512.is_ok(), bs >= 128, "{bs}");
        }
    }

    #[test]
    fn unsorted_rows_are_sorted_and_counted() {
        let data = "{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0]}\n\
                    {\"timestamp\": 2, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n";
        let (t, rep) = read("t", data.as_bytes(), &ReadOptions::default()).unwrap();
        assert_eq!(rep.reordered, 1);
        assert_eq!(t.requests[0].arrival_us, 2000);
    }
}
