//! retrace: record, replay, compare and simulate LLM inference traffic.
//!
//! Module map (see ARCHITECTURE.md for the invariants):
//! - [`trace`]: the data model and on-disk formats (native `*.trace.zst`, importers, exporters,
//!   filters, statistics); pure and synchronous.
//! - [`sse`]: incremental SSE splitter; pure.
//! - [`openai`]: request and stream-chunk shapes we read; pure.
//! - [`chunkmemo`]: a stream's chunks read by comparison with the previous one (record, replay); pure.
//! - [`h1wire`]: HTTP/1.1 heads (parse, rewrite for the next hop) and chunked framing; pure.
//! - [`prom`]: Prometheus text exposition parser (scraping servers' `/metrics`); pure.
//! - [`metrics`]: per-request samples → vLLM-exact statistics and HdrHistograms; pure.
//! - [`replay`]: schedule (pure), driver (absolute deadlines), client (one request → one sample),
//!   result file and console report.
//! - [`synth`]: deterministic token blocks from hash ids (prompt synthesis); pure.
//! - [`report`]: `compare` and `report`: load results/traces, significance, workload, `--fail-on`,
//!   text/markdown/json and self-contained HTML.
//! - [`inspect`], [`convert`]: the commands of the same names.
//! - [`whatif`]: `synth`, what-if traces (AIPerf's transforms, a fitted model); pure but its entry.
//! - [`mock`]: the simulated vLLM-compatible engine (`retrace mock`, replay's default target).
//! - [`record`]: the recording proxy (`retrace record`).
//! - [`cli`]: command-line definitions (clap); no logic.
//!
//! [`run`] matches each subcommand to its module.

pub mod bytescan;
pub mod chunkmemo;
pub mod cli;
pub mod convert;
pub mod fdlimit;
pub mod fileid;
pub mod h1wire;
pub mod inspect;
pub mod metrics;
pub mod mock;
pub mod netio;
pub mod openai;
pub mod partial;
pub mod prom;
pub mod record;
pub mod replay;
pub mod report;
pub mod rxstamp;
pub mod signal;
pub mod sse;
pub mod synth;
pub mod thread_timing;
pub mod tls;
pub mod trace;
pub mod userinfo;
pub mod whatif;

use anyhow::Context;
use std::io::Write;
use std::process::ExitCode;

/// Runs one parsed command line.
pub fn run(cli: cli::Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        cli::Command::Replay(a) => {
            let (html, result_json) = (a.report_html.clone(), a.result_json.clone());
            let out = match replay::run(a) {
                Ok(Some(out)) => out,
                Ok(None) => return Ok(ExitCode::SUCCESS),
                Err(e) => match e.downcast_ref::<replay::NothingToSend>() {
                    Some(n) => {
                        eprintln!("retrace: {n} (exit {})", replay::EXIT_NOTHING_TO_SEND);
                        return Ok(ExitCode::from(replay::EXIT_NOTHING_TO_SEND));
                    }
                    None => return Err(e),
                },
            };
            report::write_replay_report(html.as_deref(), &out.result, result_json.as_deref())?;
            print!("{}", out.report);
            return Ok(out.exit_code());
        }
        cli::Command::Inspect(a) => {
            let out = inspect::run(&a)?;
            std::io::stdout().lock().write_all(out.as_bytes())?;
        }
        cli::Command::Convert(a) => {
            abandon_on_signal("convert", &a.output)?;
            let msg = convert::run(&a)?;
            eprintln!("{msg}");
        }
        cli::Command::Synth(a) => {
            abandon_on_signal("synth", &a.output)?;
            let msg = whatif::run(&a)?;
            eprintln!("{msg}");
        }
        cli::Command::Compare(a) => return report::run_compare(&a),
        cli::Command::Report(a) => return report::run_report(&a),
        cli::Command::Merge(a) => return report::run_merge(&a),
        cli::Command::Mock(a) => return mock::run(a),
        cli::Command::Record(a) => return record::main(&a),
    }
    Ok(ExitCode::SUCCESS)
}

/// `convert` and `synth` stopped by SIGINT or SIGTERM: their partial output is removed and
/// they exit 130 or 143 ([`signal::exit_on_signal`]).
fn abandon_on_signal(command: &'static str, output: &std::path::Path) -> anyhow::Result<()> {
    let out = match output.to_str() {
        Some("-") => "its output on stdout is cut short".to_string(),
        _ => format!("{} not written", output.display()),
    };
    signal::exit_on_signal(move |s| format!("retrace {command}: {s}: stopped; {out}"))
        .context("handling SIGINT and SIGTERM")
}
