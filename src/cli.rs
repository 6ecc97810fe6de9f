//! Command-line interface: one clap `Args` struct per subcommand; doc comments are the help text.
//! No logic lives here.

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
}

/// Example: `retrace inspect traces/mooncake_conversation_1k.jsonl --cache-blocks 10000`
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// Trace file (native, Mooncake, Azure, BurstGPT, session JSON, vLLM custom JSONL).
    pub file: PathBuf,
}
