//! retrace: record, replay, compare and simulate LLM inference traffic.
//!
//! Module map, from the ground up (see ARCHITECTURE.md for the flows and the rules):
//! - [`sys`]: operating-system helpers (sockets, receive timestamps, TLS, signals, files).
//! - [`wire`]: wire formats, pure: HTTP/1.1 framing, SSE, OpenAI shapes, Prometheus text.
//! - [`trace`]: the data model and on-disk formats (native `*.trace.zst`, importers, exporters,
//!   filters, statistics); pure and synchronous.
//! - [`metrics`]: per-request samples → vLLM-exact statistics and HdrHistograms; pure.
//! - [`result`]: the replay result file (`retrace.replay/1`), its sidecar and its value bounds.
//! - [`replay`]: the plan (what is sent when, with which body), the HTTP transport, the
//!   driver (absolute deadlines) and the console report.
//! - [`record`]: the recording proxy (`retrace record`).
//! - [`mock`]: the simulated vLLM-compatible engine (`retrace mock`, replay's default target).
//! - [`report`]: `compare`, `report` and `merge`.
//! - [`capacity`]: steps of a trace at scaled speeds, searched for the highest within an SLO.
//! - [`inspect`], [`convert`], [`synth`]: the commands of the same names.
//! - [`cli`]: command-line definitions (clap).
//!
//! [`run`] matches each subcommand to its module.

pub mod capacity;
pub mod cli;
pub mod convert;
pub mod inspect;
pub mod metrics;
pub mod mock;
pub mod record;
pub mod replay;
pub mod report;
pub mod result;
pub mod synth;
pub mod sys;
pub mod trace;
pub mod wire;

use anyhow::Context;
use std::io::Write;
use std::process::ExitCode;

/// Runs one parsed command line.
pub fn run(cli: cli::Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        cli::Command::Replay(a) => {
            let (html, result_json) = (a.report_html.clone(), a.result_json.clone());
            let out = match replay::run(a.config()?) {
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
            print!("{}", replay::console::shadows(&out, result_json.as_deref()));
            return Ok(out.exit_code());
        }
        cli::Command::Inspect(a) => {
            let out = inspect::run(&a.options())?;
            std::io::stdout().lock().write_all(out.as_bytes())?;
        }
        cli::Command::Convert(a) => {
            let opts = a.options()?;
            abandon_on_signal("convert", &opts.output)?;
            let msg = convert::run(&opts)?;
            eprintln!("{msg}");
        }
        cli::Command::Synth(a) => {
            let opts = a.options()?;
            abandon_on_signal("synth", &opts.output)?;
            let msg = synth::run(&opts)?;
            eprintln!("{msg}");
        }
        cli::Command::Capacity(a) => return capacity::run(a.options()?),
        cli::Command::Compare(a) if a.is_shadow() => {
            return report::run_shadow_compare(&a.shadow_options()?)
        }
        cli::Command::Compare(a) => return report::run_compare(&a.options()?),
        cli::Command::Report(a) => return report::run_report(&a.options()?),
        cli::Command::Merge(a) => return report::run_merge(&a.options()),
        cli::Command::Mock(a) => return mock::run(&a.listen, a.config()?),
        cli::Command::Record(a) => return record::run(&a.listen, a.config()?),
    }
    Ok(ExitCode::SUCCESS)
}

/// `convert` and `synth` stopped by SIGINT or SIGTERM: their partial output is removed and
/// they exit 130 or 143 ([`sys::signal::exit_on_signal`]).
fn abandon_on_signal(command: &'static str, output: &std::path::Path) -> anyhow::Result<()> {
    let out = match output.to_str() {
        Some("-") => "its output on stdout is cut short".to_string(),
        _ => format!("{} not written", output.display()),
    };
    sys::signal::exit_on_signal(move |s| format!("retrace {command}: {s}: stopped; {out}"))
        .context("handling SIGINT and SIGTERM")
}
