//! `retrace convert`'s command line and its [`convert::ConvertOptions`].

use super::input::InputFormat;
use super::values::{parse_flag, parse_window};
use crate::convert::{self, OutFormat};
use crate::trace::filter::Filters;
use std::path::PathBuf;

/// Convert a trace between formats (native, Mooncake JSONL), with optional filters, or merge
/// the recordings of several proxies into one.
///
/// Fleet: `retrace convert proxy-a.trace.zst proxy-b.trace.zst -o fleet.trace.zst` merges
/// recordings by wall clock (same block size and hash key, or a clear refusal).
///
/// Stopped by SIGINT or SIGTERM, it leaves no output (nor its `.partial` file) and exits 130 or
/// 143.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  retrace convert traces/azure_conv_100.csv -o azure.trace.zst
  # ten minutes of a native trace, twice as fast, as Mooncake JSONL
  retrace convert traces/mooncake_conversation.trace.zst -o slice.jsonl \\
    --window 600s..1200s --speed 2")]
pub struct ConvertArgs {
    /// Input trace (any format `inspect` reads); several recordings are merged by wall clock.
    #[arg(required = true, num_args = 1..)]
    pub(crate) inputs: Vec<PathBuf>,
    /// Output file; `-` writes to stdout.
    #[arg(short, long, help_heading = "Input and output")]
    pub(crate) output: PathBuf,
    #[command(flatten)]
    pub(crate) input_format: InputFormat,
    /// Output format (from the output name when absent: `.jsonl` → mooncake, else native).
    #[arg(
        long,
        value_enum,
        help_heading = "Input and output",
        hide_short_help = true
    )]
    pub(crate) to: Option<OutFormat>,
    /// Skip (and count) malformed rows instead of stopping at the first.
    #[arg(long, help_heading = "Input and output", hide_short_help = true)]
    pub(crate) skip_bad: bool,
    /// Keep arrivals in START..END of trace time (e.g. `60s..600s`, `..90s`); offsets restart at START.
    #[arg(long, value_name = "START..END", help_heading = "Filters")]
    pub(crate) window: Option<String>,
    /// Keep only the first N requests (after --window).
    #[arg(long, value_name = "N", help_heading = "Filters")]
    pub(crate) head: Option<usize>,
    /// Keep one request in K (after --head).
    #[arg(
        long,
        value_name = "K",
        default_value_t = 1,
        help_heading = "Filters",
        hide_short_help = true
    )]
    pub(crate) sample: usize,
    /// Bake in a speed factor: arrival offsets are divided by X (2 = twice as fast).
    #[arg(
        long,
        value_name = "X",
        default_value_t = 1.0,
        help_heading = "Filters"
    )]
    pub(crate) speed: f64,
    /// Re-block hash ids to N tokens per id, a whole multiple of the trace's block size (e.g. a
    /// recording hashed at 16 exported as Mooncake's 512).
    #[arg(
        long,
        value_name = "N",
        help_heading = "Filters",
        hide_short_help = true
    )]
    pub(crate) block_size: Option<u32>,
    /// zstd level for native output (1-22).
    #[arg(long, default_value_t = 19, value_parser = clap::value_parser!(i32).range(1..=22), help_heading = "Input and output", hide_short_help = true)]
    pub(crate) level: i32,
}

impl ConvertArgs {
    /// The options `convert` runs with; `--window` parsed.
    pub fn options(&self) -> anyhow::Result<convert::ConvertOptions> {
        Ok(convert::ConvertOptions {
            inputs: self.inputs.clone(),
            output: self.output.clone(),
            import: self.input_format.import(self.skip_bad),
            to: self.to,
            filters: Filters {
                window_us: parse_flag("--window", self.window.as_deref(), parse_window)?,
                head: self.head,
                sample_every: self.sample,
                speed: self.speed,
            },
            block_size: self.block_size,
            level: self.level,
        })
    }
}
