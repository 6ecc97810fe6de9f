//! `retrace inspect`'s command line and its [`inspect::InspectOptions`].

use crate::inspect;
use crate::trace::import::{Format, ImportOptions};
use crate::trace::stats::StatsOptions;
use std::path::PathBuf;

/// Summarise a trace: rates, length distributions, prefix reuse, recorded latency.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  retrace inspect traces/mooncake_conversation_1k.jsonl --cache-blocks 10000
  # a session trace, as JSON (schema: docs/inspect-json.md)
  retrace inspect traces/kv_cache_tester_trace_0012.json --json")]
pub struct InspectArgs {
    /// Trace file (native, Mooncake, Azure, BurstGPT, session JSON, vLLM custom JSONL); several
    /// recordings (a rotated set, or several proxies) are merged by wall clock as they are read.
    #[arg(required = true, num_args = 1..)]
    pub(crate) files: Vec<PathBuf>,
    /// Print JSON (schema: docs/inspect-json.md) instead of text.
    #[arg(long, help_heading = "Options")]
    pub(crate) json: bool,
    /// Also report the prefix hit rate with an LRU cache of this many blocks (at most 4194304).
    #[arg(long, value_name = "N", help_heading = "Options")]
    pub(crate) cache_blocks: Option<u64>,
    /// Prefix statistics at N tokens per block instead of the trace's (re-chunked hash ids;
    /// docs/synth.md says how).
    #[arg(
        long,
        value_name = "N",
        help_heading = "Options",
        hide_short_help = true
    )]
    pub(crate) block_size: Option<u32>,
    /// Force the input format instead of detecting it.
    #[arg(long, value_enum, help_heading = "Options", hide_short_help = true)]
    pub(crate) from: Option<Format>,
    /// Tokens per hash id of the input (default: what the file says; 512 for Mooncake).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..), help_heading = "Options", hide_short_help = true)]
    pub(crate) trace_block_size: Option<u32>,
    /// Skip (and count) malformed rows instead of stopping at the first.
    #[arg(long, help_heading = "Options", hide_short_help = true)]
    pub(crate) skip_bad: bool,
}

impl InspectArgs {
    /// The options `inspect` runs with.
    pub fn options(&self) -> inspect::InspectOptions {
        inspect::InspectOptions {
            files: self.files.clone(),
            import: ImportOptions {
                format: self.from,
                skip_bad: self.skip_bad,
                offer_skip_bad: true,
                block_size: self.trace_block_size,
            },
            json: self.json,
            stats: StatsOptions {
                cache_blocks: self.cache_blocks,
                block_size: self.block_size,
            },
        }
    }
}
