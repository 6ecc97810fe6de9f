//! The `convert` command: stream any supported trace through the filters into native or
//! Mooncake, one record at a time (several recordings merged by wall clock as they are read).

use crate::trace::filter::{self, Filters};
use crate::trace::import::ImportOptions;
use crate::trace::{mooncake, native};
use crate::trace::{Request, TraceHeader};
use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Output formats `convert` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutFormat {
    /// retrace's native `*.trace.zst`.
    Native,
    /// Mooncake JSONL (ids compacted to 0..N-1; loads in vllm bench serve timed_trace, AIPerf, SGLang).
    Mooncake,
}

/// What `convert` reads, keeps and writes.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    /// Input traces; several recordings are merged by wall clock.
    pub(crate) inputs: Vec<PathBuf>,
    /// Output file; `-` is stdout.
    pub(crate) output: PathBuf,
    pub(crate) import: ImportOptions,
    /// Output format (`None`: from the output's name).
    pub(crate) to: Option<OutFormat>,
    /// Window, head, sampling and speed, in that order.
    pub(crate) filters: Filters,
    /// Re-block hash ids to this many tokens per id.
    pub(crate) block_size: Option<u32>,
    /// zstd level of native output.
    pub(crate) level: i32,
}

/// Runs `convert`; returns a one-line summary for stderr.
pub fn run(args: &ConvertOptions) -> Result<String> {
    let speed = args.filters.speed;
    if !(speed.is_finite() && speed > 0.0) {
        anyhow::bail!("--speed must be a positive number, got {speed}");
    }
    if args.filters.sample_every == 0 {
        anyhow::bail!("--sample must be at least 1");
    }
    let input_name = crate::trace::fleet::names(&args.inputs);
    let mut input = crate::trace::fleet::open_all(&args.inputs, &args.import)?;
    let read = input.report.read_summary();
    let mut filters = filter::Filtering::new(&args.filters).map_err(anyhow::Error::msg)?;
    let reblock = match args.block_size {
        Some(bs) => {
            let rb = filter::Reblock::new(&input.header, bs)
                .map_err(|e| anyhow::anyhow!("--block-size: {e}"))?;
            input.header.block_size = bs;
            Some(rb)
        }
        None => None,
    };
    let to = out_format(args.to, &args.output);
    let out_name = args.output.display().to_string();
    let header = input.header.clone();
    let mut left = LeftOut::default();
    let mooncake = to == OutFormat::Mooncake;
    let records = std::iter::from_fn(|| loop {
        if filters.done() {
            return None;
        }
        let r = match input.next()? {
            Ok(r) => r,
            Err(e) => return Some(Err(e.into())),
        };
        let Some(mut r) = filters.keep(r) else {
            continue;
        };
        if let Some(rb) = &reblock {
            rb.apply(&mut r);
        }
        if !mooncake || left.is_mooncake_row(&r) {
            return Some(Ok(r));
        }
    });
    let written = write_records(header, records, &args.output, to, args.level, &input_name)?;
    Ok(format!(
        "{input_name}: {read}, {written} written to {out_name}{}",
        left.summary()
    ))
}

/// What a Mooncake export left out: side requests; rows of zero input or output length, such
/// as recorded failures, which Mooncake readers refuse or would send as empty prompts.
#[derive(Default)]
struct LeftOut {
    auxiliary: u64,
    empty: u64,
}

impl LeftOut {
    /// Mooncake rows are generations with a prompt and an output.
    fn is_mooncake_row(&mut self, r: &crate::trace::Request) -> bool {
        if !r.is_workload() {
            self.auxiliary += 1;
            return false;
        }
        if r.input_tokens == 0 || r.output_tokens == 0 {
            self.empty += 1;
            return false;
        }
        true
    }

    fn summary(&self) -> String {
        match (self.auxiliary, self.empty) {
            (0, 0) => String::new(),
            (aux, empty) => format!(
                "; left out {aux} auxiliary requests and {empty} with zero input or output length"
            ),
        }
    }
}

/// `--to`, or what the output's name says (`.jsonl`/`.json` → Mooncake, else native).
fn out_format(to: Option<OutFormat>, output: &Path) -> OutFormat {
    to.unwrap_or_else(|| {
        let name = output.to_string_lossy();
        if name.ends_with(".jsonl") || name.ends_with(".json") {
            OutFormat::Mooncake
        } else {
            OutFormat::Native
        }
    })
}

/// [`write_out`] of `records` under `header`, written one at a time as they come: none is
/// kept. An error from `records` ends the output (no file is left, as for a failed input).
pub(crate) fn write_stream(
    header: TraceHeader,
    records: impl Iterator<Item = Result<Request>>,
    output: &Path,
    to: Option<OutFormat>,
    level: i32,
    source: &str,
) -> Result<(u64, String)> {
    let to = out_format(to, output);
    let mut left = LeftOut::default();
    let records = records.filter(|r| {
        to != OutFormat::Mooncake || r.as_ref().map_or(true, |r| left.is_mooncake_row(r))
    });
    let written = write_records(header, records, output, to, level, source)?;
    Ok((written, left.summary()))
}

/// Writes `records` under `header` to `output` (`-` is stdout) as `to`, one record at a time;
/// returns how many were written. Native frames are cut by size only, so the same records give
/// the same bytes however long they take to come.
fn write_records(
    mut header: TraceHeader,
    mut records: impl Iterator<Item = Result<Request>>,
    output: &Path,
    to: OutFormat,
    level: i32,
    source: &str,
) -> Result<u64> {
    let out_name = output.display().to_string();
    match to {
        OutFormat::Mooncake => {
            if header.block_size != mooncake::BLOCK_SIZE || !header.partial_tail_block {
                tracing::warn!(
                    "{}: blocks are {} tokens ({}); Mooncake readers assume 512 (ceil): re-block with --block-size 512 or pass the block size to them",
                    source,
                    header.block_size,
                    if header.partial_tail_block { "ceil" } else { "floor" }
                );
            }
            let mut write = |out: &mut dyn Write| -> Result<u64> {
                let mut w = mooncake::MooncakeWriter::new(std::io::BufWriter::new(out));
                let mut n = 0u64;
                for r in records.by_ref() {
                    w.push(&r?).with_context(|| format!("writing {out_name}"))?;
                    n += 1;
                }
                w.finish().with_context(|| format!("writing {out_name}"))?;
                Ok(n)
            };
            if out_name == "-" {
                return write(&mut std::io::stdout().lock());
            }
            // Written as PATH.partial: an input that fails half-way leaves no half file.
            let (partial, mut file) = crate::sys::partial::Partial::create(output)
                .with_context(|| format!("cannot create {out_name}"))?;
            let n = write(&mut file)?;
            partial
                .commit(file)
                .with_context(|| format!("writing {out_name}"))?;
            Ok(n)
        }
        OutFormat::Native => {
            header
                .meta
                .insert("converted_from".into(), source.to_string());
            let opts = native::WriteOptions {
                level,
                frame_age: None,
                ..Default::default()
            };
            if out_name == "-" {
                let out = std::io::BufWriter::new(std::io::stdout().lock());
                let mut w = native::TraceWriter::new(out, &header, opts)?;
                for r in records.by_ref() {
                    w.push(&r?)?;
                }
                let n = w.records();
                w.finish()?.flush()?;
                Ok(n)
            } else {
                Ok(native::write_file_from(output, &header, opts, records)?)
            }
        }
    }
}
