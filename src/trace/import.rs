//! Reading any supported trace file into the data model: format detection and dispatch.
//!
//! [`read_path`] detects the format from content (see [`super::detect`]) unless forced, and hands
//! the file to the matching importer. It does not filter or transform (see `convert`).

use super::mooncake::{self, ImportReport, ReadOptions};
use super::{native, Trace, TraceError};
use std::io::BufReader;
use std::path::Path;

/// Trace file formats retrace reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Native,
    Mooncake,
}

/// Options for [`read_path`].
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Force a format instead of detecting it.
    pub format: Option<Format>,
    /// Skip (and count) malformed rows instead of failing.
    pub skip_bad: bool,
}

/// Reads a trace file in any supported format.
pub fn read_path(path: &Path, opts: &ImportOptions) -> Result<(Trace, ImportReport), TraceError> {
    let name = path.display().to_string();
    let io = |e| TraceError::Io {
        path: name.clone(),
        source: e,
    };
    let data = std::fs::read(path).map_err(io)?;
    let format = match opts.format {
        Some(f) => f,
        None => super::detect::detect(&name, &data)?,
    };
    match format {
        Format::Native => {
            let (t, rep) = native::read_bytes(&name, &data)?;
            let ir = ImportReport {
                rows: t.requests.len() as u64,
                ..Default::default()
            };
            if !rep.is_clean() {
                tracing::warn!("{name}: {}", rep.summary());
            }
            Ok((t, ir))
        }
        Format::Mooncake => mooncake::read(
            &name,
            BufReader::new(data.as_slice()),
            &ReadOptions {
                skip_bad: opts.skip_bad,
            },
        ),
    }
}
