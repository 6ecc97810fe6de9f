//! Command-line interface: one clap `Args` struct per subcommand (doc comments are the help
//! text), the value parsers (`values`), the input flags `convert` and `synth` share (`input`),
//! and each `Args`' conversion to the options its engine runs with. The engines know nothing of
//! clap.

mod capacity;
mod convert;
#[cfg(test)]
mod help_tests;
mod input;
mod inspect;
mod mock;
mod record;
mod replay;
mod report;
mod synth;
mod values;

pub(crate) use capacity::CapacityArgs;
pub(crate) use convert::ConvertArgs;
pub(crate) use inspect::InspectArgs;
pub(crate) use mock::MockArgs;
pub(crate) use record::RecordArgs;
pub(crate) use replay::ReplayArgs;
pub(crate) use report::{CompareArgs, MergeArgs, ReportArgs};
pub(crate) use synth::SynthArgs;

use clap::{Parser, Subcommand};

/// Record, replay, compare and simulate LLM inference traffic (vLLM, SGLang, OpenAI-compatible).
#[derive(Debug, Parser)]
#[command(name = "retrace", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The commands. Each one's help text is its arguments struct's doc comment (its first line the
/// summary `retrace --help` lists) and ends with examples (`after_help`).
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once; boxing buys nothing
pub enum Command {
    Inspect(InspectArgs),
    Replay(ReplayArgs),
    Capacity(CapacityArgs),
    Convert(ConvertArgs),
    Synth(SynthArgs),
    Compare(CompareArgs),
    Report(ReportArgs),
    Merge(MergeArgs),
    Mock(MockArgs),
    Record(Box<RecordArgs>),
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
