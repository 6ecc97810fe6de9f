//! The input flags `convert` and `synth` share: `--from` and `--trace-block-size` (their
//! `--skip-bad` follows each command's own `--to` in `--help`, so it stays with the command).

use crate::trace::import::{Format, ImportOptions};

/// The input trace's format and block size.
#[derive(Debug, clap::Args)]
pub(crate) struct InputFormat {
    /// Input format (detected from content when absent).
    #[arg(
        long,
        value_enum,
        help_heading = "Input and output",
        hide_short_help = true
    )]
    pub(crate) from: Option<Format>,
    /// Tokens per hash id of the input (default: what the file says; 512 for Mooncake).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..), help_heading = "Input and output", hide_short_help = true)]
    pub(crate) trace_block_size: Option<u32>,
}

impl InputFormat {
    /// The options the input is read with; `skip_bad` is `--skip-bad`.
    pub(crate) fn import(&self, skip_bad: bool) -> ImportOptions {
        ImportOptions {
            format: self.from,
            skip_bad,
            offer_skip_bad: true,
            block_size: self.trace_block_size,
        }
    }
}
