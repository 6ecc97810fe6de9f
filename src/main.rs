//! The `retrace` binary: parse the command line, run it, turn errors into exit codes.

use clap::Parser;
use std::io::IsTerminal;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = retrace::cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RETRACE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .without_time()
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match retrace::run(cli) {
        Ok(code) => code,
        Err(e) => {
            // A closed stdout (e.g. `| head`) is not an error.
            if e.chain()
                .filter_map(|c| c.downcast_ref::<std::io::Error>())
                .any(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            {
                return ExitCode::SUCCESS;
            }
            eprintln!("retrace: error: {}", chain_text(&e));
            ExitCode::from(2)
        }
    }
}

/// The error and its causes joined by `: `, a cause whose text an outer message already holds
/// (`{path}: {source}` errors) printed once.
fn chain_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain().map(ToString::to_string) {
        if !out.contains(&cause) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&cause);
        }
    }
    out
}
