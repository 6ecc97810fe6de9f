//! Shared helpers for integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// Path of a file relative to the repository root.
pub fn repo(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Parses a retrace command line (without the program name).
pub fn cli(args: &[&str]) -> retrace::cli::Cli {
    use clap::Parser;
    let mut v = vec!["retrace"];
    v.extend_from_slice(args);
    retrace::cli::Cli::parse_from(v)
}
