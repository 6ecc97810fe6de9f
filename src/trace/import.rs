//! Reading any supported trace file into the data model: format detection and dispatch.
//!
//! [`read_path`] detects the format from content (see [`super::detect`]) unless forced, and hands
//! the bytes to the matching importer. It does not filter or transform (see [`super::filter`]).

use super::rows::ImportReport;
use super::{agentic, azure, custom, mooncake, native, Trace, TraceError};
use std::io::BufReader;
use std::path::Path;

pub use super::detect::{Format, ImportOptions};

/// Reads a trace file in any supported format.
/// The whole trace in memory: [`super::stream::open`], collected.
pub fn read_path(path: &Path, opts: &ImportOptions) -> Result<(Trace, ImportReport), TraceError> {
    super::stream::open(path, opts)?.collect_trace()
}

/// Reads trace bytes in any supported format; `name` names the source in errors.
pub fn read_bytes(
    name: &str,
    data: &[u8],
    opts: &ImportOptions,
) -> Result<(Trace, ImportReport), TraceError> {
    let format = match opts.format {
        Some(f) => f,
        None => super::detect::detect(name, data)?,
    };
    let ro = opts.read_options();
    match format {
        Format::Native => {
            let (t, rep) = native::read_bytes_as(name, data, opts.block_size)?;
            if !rep.is_clean() {
                tracing::warn!("{name}: {}", rep.summary());
            }
            Ok((t, super::stream::import_report(&rep)))
        }
        Format::Mooncake => mooncake::read(name, BufReader::new(data), &ro),
        Format::Azure => azure::read_azure(name, data, &ro),
        Format::Burstgpt => azure::read_burstgpt(name, data, &ro),
        Format::Sessions => agentic::read(name, data, &ro),
        Format::Custom => custom::read(name, data, &ro),
    }
}
