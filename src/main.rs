//! The `retrace` binary: parse the command line, run it, turn errors into exit codes.

use clap::Parser;
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
            eprintln!("retrace: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
