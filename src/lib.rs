//! retrace: record, replay, compare and simulate LLM inference traffic.
//!
//! Module map (see ARCHITECTURE.md for the invariants):
//! - [`trace`]: the data model and on-disk formats (native `*.trace.zst`, importers, exporters); pure.
//! - [`sse`]: incremental SSE splitter; pure.
//! - [`openai`]: request and stream-chunk shapes we read; pure.
//! - [`metrics`]: per-request samples → vLLM-exact statistics and HdrHistograms; pure.
//! - [`replay`]: schedule (pure), driver (absolute deadlines), client (one request → one sample),
//!   result file and console report.
//! - [`synth`]: deterministic token blocks from hash ids (prompt synthesis); pure.
//! - [`mock`]: the simulated vLLM-compatible engine (`retrace mock`, replay's default target).
//! - [`cli`]: command-line definitions (clap); no logic.
//!
//! [`run`] matches each subcommand to its module.

pub mod cli;
pub mod metrics;
pub mod mock;
pub mod openai;
pub mod replay;
pub mod sse;
pub mod synth;
pub mod trace;

use std::process::ExitCode;

/// Runs one parsed command line.
pub fn run(cli: cli::Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        cli::Command::Inspect(_a) => anyhow::bail!("inspect is not built yet"),
        cli::Command::Replay(a) => replay::run(a),
        cli::Command::Mock(a) => mock::run(a),
    }
}
