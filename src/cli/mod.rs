//! Command-line interface: one clap `Args` struct per subcommand (doc comments are the help
//! text), the value parsers (`values`), the input flags `convert` and `synth` share (`input`),
//! and each `Args`' conversion to the options its engine runs with. The engines know nothing of
//! clap.

mod capacity;
mod convert;
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

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once; boxing buys nothing
pub enum Command {
    /// Summarise a trace: rates, length distributions, prefix reuse, recorded latency.
    Inspect(InspectArgs),
    /// Replay a trace against an OpenAI-compatible server (the embedded mock by default) at its
    /// own timing, with vLLM-exact latency metrics.
    Replay(ReplayArgs),
    /// How many times a trace's own load a server takes within an SLO: steps of the trace at
    /// scaled speeds, searched.
    Capacity(CapacityArgs),
    /// Convert a trace between formats (native, Mooncake JSONL), with optional filters.
    Convert(ConvertArgs),
    /// Write a what-if trace from a recording: AIPerf's transforms (speedup, prefix and prompt
    /// length multipliers, prefix roots, max ISL/OSL) or, with --fit, a fitted model sampled anew.
    Synth(SynthArgs),
    /// Compare two runs (retrace results, vllm bench serve results, AIPerf exports, or traces): per-metric change
    /// with significance, paired per-request TTFT, workload, and `--fail-on` gating for CI.
    Compare(CompareArgs),
    /// Write one self-contained HTML report of a run (timeline, CDFs, throughput, breakdown).
    Report(ReportArgs),
    /// Merge replay result files (e.g. the shards of `replay --shard I/N`) into one result.
    ///
    /// Example: `retrace merge shard-0.json shard-1.json shard-2.json -o all.json`
    ///
    /// Histograms are added (lossless), counts and tokens summed, `duration` is the longest
    /// input's (shards run concurrently), per-request arrays concatenated. Statistics are
    /// recomputed from the per-request data when every input was `--detailed` (then they equal one
    /// process's), else from the merged histograms (`merged_from_histograms: true`). Inputs must
    /// share trace, seed, speed, endpoint, model and prompt mode. Details: docs/scale-out.md.
    /// AIPerf per-request exports (`profile_export.jsonl`) merge into one such export: every
    /// record, ordered by send time (docs/compare.md).
    Merge(MergeArgs),
    /// Run a simulated vLLM-compatible inference engine (no GPU): batching, prefix cache, faults.
    ///
    /// Example: `retrace mock --listen 127.0.0.1:8000 --model mock-llama --fixed-timing 50,10`
    ///
    /// Serves /v1/completions, /v1/chat/completions, /v1/models, /tokenize, /health and /metrics
    /// in vLLM 0.32's shapes (and /detokenize, /reset_prefix_cache). Without --fixed-timing a continuous-batching scheduler times each
    /// step with a cost model chosen by --profile: `llama8b` (default; a lone 137-token prompt
    /// gets ~70 ms TTFT, ~8 ms TPOT; a 7k-token prompt ~0.4 s) or `fast`
    /// (≈200k prefill tokens/s: Mooncake-size prompts at trace speed; replay's embedded target),
    /// e.g. `retrace mock --profile fast`. The --request-overhead-ms, --step-overhead-ms,
    /// --prefill-token-ms, --seq-ms,
    /// --context-token-ms and --max-num-batched-tokens flags override the profile. Faults by
    /// seeded rates (--fault-*) or per request with the header `x-mock-fault` (e.g.
    /// `status=503`, `stall-first=500`, `reset-after=3`). Details: docs/mock.md.
    Mock(MockArgs),
    /// Record live traffic: a transparent proxy in front of an OpenAI-compatible server.
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
