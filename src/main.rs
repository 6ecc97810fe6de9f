use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = retrace::cli::Cli::parse();
    match retrace::run(cli) {
        Ok(code) => code,
        Err(e) => {
            // A closed stdout (e.g. `| head`) is not an error.
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                if io.kind() == std::io::ErrorKind::BrokenPipe {
                    return ExitCode::SUCCESS;
                }
            }
            eprintln!("retrace: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
