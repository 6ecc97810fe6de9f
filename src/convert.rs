//! The `convert` command: read any supported trace, apply filters, write native or Mooncake.

use crate::cli::{ConvertArgs, OutFormat};
use crate::trace::filter::{self, Filters};
use crate::trace::import::{read_path, ImportOptions};
use crate::trace::{mooncake, native};
use anyhow::{Context, Result};
use std::io::Write;

/// Runs `convert`; returns a one-line summary for stderr.
pub fn run(args: &ConvertArgs) -> Result<String> {
    let window = args
        .window
        .as_deref()
        .map(filter::parse_window)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--window: {e}"))?;
    if !(args.speed.is_finite() && args.speed > 0.0) {
        anyhow::bail!("--speed must be a positive number, got {}", args.speed);
    }
    if args.sample == 0 {
        anyhow::bail!("--sample must be at least 1");
    }
    let opts = ImportOptions {
        format: args.from,
        skip_bad: args.skip_bad,
    };
    let input_name = args
        .inputs
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" ");
    let (mut trace, rep) = match args.inputs.as_slice() {
        [one] => read_path(one, &opts)?,
        many => {
            let mut traces = Vec::with_capacity(many.len());
            let mut rep = crate::trace::mooncake::ImportReport::default();
            for p in many {
                let (t, r) = read_path(p, &opts)?;
                rep.skipped += r.skipped;
                traces.push((p.display().to_string(), t));
            }
            (crate::trace::fleet::merge(traces)?, rep)
        }
    };
    let rows_in = trace.requests.len();
    filter::apply(
        &mut trace,
        &Filters {
            window_us: window,
            head: args.head,
            sample_every: args.sample,
            speed: args.speed,
        },
    )
    .map_err(anyhow::Error::msg)?;
    if let Some(bs) = args.block_size {
        filter::reblock(&mut trace, bs).map_err(|e| anyhow::anyhow!("--block-size: {e}"))?;
    }
    let out_name = args.output.display().to_string();
    let left_out = write_out(&mut trace, &args.output, args.to, args.level, &input_name)?;
    Ok(format!(
        "{}: {} rows read ({} skipped), {} written to {}{left_out}",
        input_name,
        rows_in,
        rep.skipped,
        trace.requests.len(),
        out_name
    ))
}

/// Writes `trace` to `output` (`-` is stdout) as `to`, or as the name says (`.jsonl`/`.json` →
/// Mooncake, else native); returns what a Mooncake export left out (`""` when nothing).
/// `source` names the input in warnings and in the native header's `converted_from`.
pub fn write_out(
    trace: &mut crate::trace::Trace,
    output: &std::path::Path,
    to: Option<OutFormat>,
    level: i32,
    source: &str,
) -> Result<String> {
    let to = to.unwrap_or_else(|| {
        let name = output.to_string_lossy();
        if name.ends_with(".jsonl") || name.ends_with(".json") {
            OutFormat::Mooncake
        } else {
            OutFormat::Native
        }
    });
    let out_name = output.display().to_string();
    let stdout = out_name == "-";
    let mut left_out = String::new();
    match to {
        OutFormat::Mooncake => {
            left_out = mooncake_rows_only(trace);
            if trace.header.block_size != mooncake::BLOCK_SIZE || !trace.header.partial_tail_block {
                tracing::warn!(
                    "{}: blocks are {} tokens ({}); Mooncake readers assume 512 (ceil): re-block with --block-size 512 or pass the block size to them",
                    source,
                    trace.header.block_size,
                    if trace.header.partial_tail_block { "ceil" } else { "floor" }
                );
            }
            if stdout {
                mooncake::write(trace, std::io::BufWriter::new(std::io::stdout().lock()))?;
            } else {
                let f = std::fs::File::create(output)
                    .with_context(|| format!("cannot create {out_name}"))?;
                mooncake::write(trace, std::io::BufWriter::new(f))
                    .with_context(|| format!("writing {out_name}"))?;
            }
        }
        OutFormat::Native => {
            trace
                .header
                .meta
                .insert("converted_from".into(), source.to_string());
            let opts = native::WriteOptions {
                level,
                ..Default::default()
            };
            if stdout {
                let bytes = native::write_bytes(trace, opts);
                std::io::stdout().lock().write_all(&bytes)?;
            } else {
                native::write_file(output, trace, opts)?;
            }
        }
    }
    Ok(left_out)
}

/// Mooncake rows are generations with a prompt and an output: keeps those and says what it
/// left out (side requests; rows of zero input or output length, such as recorded failures,
/// which Mooncake readers refuse or would send as empty prompts).
fn mooncake_rows_only(trace: &mut crate::trace::Trace) -> String {
    let aux = trace.drop_auxiliary();
    let before = trace.requests.len();
    trace
        .requests
        .retain(|r| r.input_tokens > 0 && r.output_tokens > 0);
    let empty = before - trace.requests.len();
    match (aux, empty) {
        (0, 0) => String::new(),
        _ => format!(
            "; left out {aux} auxiliary requests and {empty} with zero input or output length"
        ),
    }
}
