//! Command-line interface: one clap `Args` struct per subcommand; doc comments are the help text.
//! No logic lives here.

use crate::trace::import::Format;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// Record, replay, compare and simulate LLM inference traffic (vLLM, SGLang, OpenAI-compatible).
#[derive(Debug, Parser)]
#[command(name = "retrace", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Summarise a trace: rates, length distributions, prefix reuse, recorded latency.
    Inspect(InspectArgs),
    /// Convert a trace between formats (native, Mooncake JSONL), with optional filters.
    Convert(ConvertArgs),
}

/// Summarise a trace.
///
/// Example: `retrace inspect traces/mooncake_conversation_1k.jsonl --cache-blocks 10000`
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// Trace file (native, Mooncake, Azure, BurstGPT, session JSON, vLLM custom JSONL).
    pub file: PathBuf,
    /// Print JSON (schema: docs/inspect-json.md) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also report the prefix hit rate with an LRU cache of this many blocks.
    #[arg(long, value_name = "N")]
    pub cache_blocks: Option<u64>,
    /// Force the input format instead of detecting it.
    #[arg(long, value_enum)]
    pub from: Option<Format>,
    /// Skip (and count) malformed rows instead of stopping at the first.
    #[arg(long)]
    pub skip_bad: bool,
}

/// Output formats `convert` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutFormat {
    /// retrace's native `*.trace.zst`.
    Native,
    /// Mooncake JSONL (ids compacted to 0..N-1; loads in vllm bench serve timed_trace, AIPerf, SGLang).
    Mooncake,
}

/// Convert a trace between formats.
///
/// Example: `retrace convert ../mooncake_trace.jsonl -o mooncake.trace.zst --window 0s..600s --speed 2`
#[derive(Debug, clap::Args)]
pub struct ConvertArgs {
    /// Input trace (any format `inspect` reads).
    pub input: PathBuf,
    /// Output file; `-` writes to stdout.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Input format (detected from content when absent).
    #[arg(long, value_enum)]
    pub from: Option<Format>,
    /// Output format (from the output name when absent: `.jsonl` → mooncake, else native).
    #[arg(long, value_enum)]
    pub to: Option<OutFormat>,
    /// Skip (and count) malformed rows instead of stopping at the first.
    #[arg(long)]
    pub skip_bad: bool,
    /// Keep arrivals in START..END of trace time (e.g. `60s..600s`, `..90s`); offsets restart at START.
    #[arg(long, value_name = "START..END")]
    pub window: Option<String>,
    /// Keep only the first N requests (after --window).
    #[arg(long, value_name = "N")]
    pub head: Option<usize>,
    /// Keep one request in K (after --head).
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub sample: usize,
    /// Bake in a speed factor: arrival offsets are divided by X (2 = twice as fast).
    #[arg(long, value_name = "X", default_value_t = 1.0)]
    pub speed: f64,
    /// Re-block hash ids to N tokens per id, a whole multiple of the trace's block size (e.g. a
    /// recording hashed at 16 exported as Mooncake's 512).
    #[arg(long, value_name = "N")]
    pub block_size: Option<u32>,
    /// zstd level for native output (1-22).
    #[arg(long, default_value_t = 19, value_parser = clap::value_parser!(i32).range(1..=22))]
    pub level: i32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }
}
