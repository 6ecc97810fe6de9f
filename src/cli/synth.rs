//! `retrace synth`'s command line and its [`synth::SynthOptions`].

use super::input::InputFormat;
use super::values::{parse_duration_us, parse_flag};
use crate::convert::OutFormat;
use crate::synth::{self, fit, transforms::Transforms, Mode};
use std::path::PathBuf;

/// Write a what-if trace from a recording: AIPerf's transforms (speedup, prefix and prompt length
/// multipliers, prefix roots, max ISL/OSL) or, with --fit, a fitted model sampled anew.
///
/// Without --fit the input's requests are transformed one by one (AIPerf 0.13's synthesis
/// options); with --fit a model of the input (prefix tree, sessions, arrivals, lengths) is
/// learned and a new trace sampled from it, with new hash ids. Deterministic from --seed.
/// Details and the differences from AIPerf: docs/synth.md. Stopped by SIGINT or SIGTERM, it
/// leaves no output (nor its `.partial` file) and exits 130 or 143.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  # the same trace at 1/16 of its lengths, outputs at most 256 tokens
  retrace synth traces/mooncake_conversation_1k.jsonl -o small.jsonl \\
    --scale-lengths 0.0625 --max-osl 256
  # ten minutes of new traffic sampled from a model fitted to the trace
  retrace synth traces/mooncake_conversation_1k.jsonl -o fit.trace.zst \\
    --fit --duration 10m")]
pub struct SynthArgs {
    /// Input trace (any format `inspect` reads).
    pub(crate) input: PathBuf,
    /// Output file (format from the name as `convert` picks it, or --to); `-` writes to stdout.
    #[arg(short, long, help_heading = "Input and output")]
    pub(crate) output: PathBuf,
    #[command(flatten)]
    pub(crate) input_format: InputFormat,
    /// Output format.
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
    /// Seed of every random choice (same input and seed, same output).
    #[arg(
        long,
        value_name = "S",
        default_value_t = 0,
        help_heading = "Input and output",
        hide_short_help = true
    )]
    pub(crate) seed: u64,
    /// Arrivals (and think times) divided by X: 2 is twice the rate.
    #[arg(
        long,
        value_name = "X",
        default_value_t = 1.0,
        help_heading = "Transforms"
    )]
    pub(crate) speedup: f64,
    /// Shared prefix paths X times as long (in blocks).
    #[arg(
        long,
        value_name = "X",
        default_value_t = 1.0,
        help_heading = "Transforms",
        hide_short_help = true
    )]
    pub(crate) prefix_len_multiplier: f64,
    /// Requests spread over K independent copies of the prefix tree (reuse falls).
    #[arg(
        long,
        value_name = "K",
        default_value_t = 1,
        help_heading = "Transforms",
        hide_short_help = true
    )]
    pub(crate) prefix_root_multiplier: u32,
    /// Unique (unshared) part of each prompt X times as long.
    #[arg(
        long,
        value_name = "X",
        default_value_t = 1.0,
        help_heading = "Transforms",
        hide_short_help = true
    )]
    pub(crate) prompt_len_multiplier: f64,
    /// Every input length and the block size times X, hash ids kept: the same prefix tree at
    /// another token scale (block size × X must be a whole number).
    #[arg(long, value_name = "X", conflicts_with_all = ["prefix_len_multiplier", "prompt_len_multiplier"], help_heading = "Transforms")]
    pub(crate) scale_lengths: Option<f64>,
    /// Drop requests whose input length (after the multipliers) is above N.
    #[arg(long, value_name = "N", help_heading = "Transforms")]
    pub(crate) max_isl: Option<u64>,
    /// Cap output lengths at N.
    #[arg(long, value_name = "N", help_heading = "Transforms")]
    pub(crate) max_osl: Option<u64>,
    /// Learn a model of the input and sample a new trace from it (new hash ids).
    #[arg(long, help_heading = "Fitted model")]
    pub(crate) fit: bool,
    /// With --fit: requests to write (default: the input's count; at most 10^8).
    #[arg(
        long,
        value_name = "N",
        requires = "fit",
        help_heading = "Fitted model",
        hide_short_help = true
    )]
    pub(crate) requests: Option<u64>,
    /// With --fit: span of the output (e.g. `2h`); with --rate or alone the count follows.
    #[arg(
        long,
        value_name = "D",
        requires = "fit",
        help_heading = "Fitted model"
    )]
    pub(crate) duration: Option<String>,
    /// With --fit: mean arrival rate in requests/s (default: the input's).
    #[arg(
        long,
        value_name = "R",
        requires = "fit",
        help_heading = "Fitted model"
    )]
    pub(crate) rate: Option<f64>,
    /// With --fit: K times the independent users (sessions and prefix roots), at K times the rate.
    #[arg(
        long,
        value_name = "K",
        default_value_t = 1.0,
        requires = "fit",
        help_heading = "Fitted model",
        hide_short_help = true
    )]
    pub(crate) scale_users: f64,
    /// zstd level for native output (1-22).
    #[arg(long, default_value_t = 19, value_parser = clap::value_parser!(i32).range(1..=22), help_heading = "Input and output", hide_short_help = true)]
    pub(crate) level: i32,
}

impl SynthArgs {
    /// The options `synth` runs with; `--duration` parsed.
    pub fn options(&self) -> anyhow::Result<synth::SynthOptions> {
        Ok(synth::SynthOptions {
            input: self.input.clone(),
            output: self.output.clone(),
            import: self.input_format.import(self.skip_bad),
            to: self.to,
            level: self.level,
            mode: self.mode()?,
        })
    }

    fn mode(&self) -> anyhow::Result<Mode> {
        if !self.fit {
            return Ok(Mode::Transform(Transforms {
                speedup: self.speedup,
                prefix_len: self.prefix_len_multiplier,
                prefix_root: self.prefix_root_multiplier,
                prompt_len: self.prompt_len_multiplier,
                scale_lengths: self.scale_lengths,
                max_isl: self.max_isl,
                max_osl: self.max_osl,
                seed: self.seed,
            }));
        }
        let size = fit::Size {
            requests: self.requests,
            duration_us: parse_flag("--duration", self.duration.as_deref(), parse_duration_us)?,
            rate: self.rate,
            scale_users: self.scale_users,
        };
        Ok(Mode::Fit {
            size,
            seed: self.seed,
        })
    }
}
