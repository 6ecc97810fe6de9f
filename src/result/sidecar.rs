//! The sidecar file of a large `--detailed` result (`RUN.requests.jsonl` beside `RUN.json`, named
//! by the result's `requests_file`): one JSON object per measured request, appended as each
//! finishes, holding its `index` (schedule position) and its element of every per-request array
//! under the array's name ([`crate::result::RequestRow`]). [`Writer`] streams the rows through
//! [`crate::sys::partial`]; [`read`] puts them back as the result's index-aligned arrays ([`Columns`]).
//! The indices of a file are 0..N-1: rows written with gaps (a halted run measured only some of
//! its requests) are renumbered in index order when the file is finished.
//! Format: docs/result-format.md.

use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// Above this many measured requests a `--detailed` result's per-request arrays go to the
/// sidecar file; at or below it they stay inline (one file, vLLM's layout).
pub(crate) const THRESHOLD: usize = 100_000;

/// The result's key naming the sidecar file (a file name, beside the result file).
pub const KEY: &str = "requests_file";

/// The arrays a sidecar row may hold (other keys are ignored).
pub(crate) const ARRAYS: [&str; 17] = [
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "latencies",
    "start_times",
    "queue_times",
    "errors",
    "server_queue_times",
    "server_ttfts",
    "server_input_lens",
    "server_cached_tokens",
    "intended_times",
    "drifts",
    "client_queue_times",
    "recorded_errors",
    "non_streamed",
];

/// The smallest row, `{"index":0}` and its newline.
const MIN_ROW_BYTES: u64 = 12;

/// The longest line read as a row. A real row holds one request's scalars (a few hundred bytes)
/// and its ITLs, about 12 bytes each: 16 MiB holds over a million, far above any real output.
pub(crate) const MAX_ROW_BYTES: usize = 16 << 20;

/// The most rows read from a sidecar (a stated bound above any real run; reading takes about
/// 1 KiB of memory a row). A sidecar holds exactly the result's `num_prompts` rows.
pub(crate) const MAX_ROWS: usize = 1 << 24;

/// The sidecar of the result file `result`: `run.json` → `run.requests.jsonl`.
pub fn path_for(result: &Path) -> PathBuf {
    result.with_extension("requests.jsonl")
}

/// A sidecar that cannot be read, named with the line at fault.
#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: line {line}: {msg}")]
    Line {
        path: String,
        line: usize,
        msg: String,
    },
    #[error("{path}: {msg}")]
    File { path: String, msg: String },
    /// The result's `requests_file` names no plain file beside it.
    #[error("{result}: key `{KEY}`: {msg}")]
    Refused { result: String, msg: String },
}

/// The sidecar the result file `result` names (`requests_file`: `name`), which must be a bare
/// file name (no `/`, not `.` or `..`, not empty) of a regular file in the result's directory:
/// never a path elsewhere, a symbolic link, a device or a FIFO (checked without opening it).
pub(crate) fn beside(result: &Path, name: &str) -> Result<PathBuf, SidecarError> {
    let refuse = |msg: String| SidecarError::Refused {
        result: result.display().to_string(),
        msg,
    };
    let shown = crate::trace::clip(name);
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(refuse(format!(
            "`{shown}` is not a bare file name: the sidecar is a file beside the result"
        )));
    }
    let path = result.parent().unwrap_or(Path::new("")).join(name);
    let meta = std::fs::symlink_metadata(&path)
        .map_err(|e| refuse(format!("`{shown}`: cannot read {}: {e}", path.display())))?;
    if !meta.file_type().is_file() {
        let kind = file_kind(&meta.file_type());
        return Err(refuse(format!(
            "`{shown}` is {kind}: the sidecar must be a regular file beside the result"
        )));
    }
    Ok(path)
}

/// What a file that is not a regular file is, for messages.
fn file_kind(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Rows by index → index-aligned arrays, null where a row lacks a key.
pub(crate) struct Columns {
    n: usize,
    cols: BTreeMap<String, Vec<Value>>,
}

impl Columns {
    pub(crate) fn new(n: usize) -> Columns {
        Columns {
            n,
            cols: BTreeMap::new(),
        }
    }

    /// RequestRow `index` (< n).
    pub(crate) fn put(&mut self, index: usize, row: Map<String, Value>) {
        let n = self.n;
        for (k, v) in row {
            let col = self.cols.entry(k).or_insert_with(|| vec![Value::Null; n]);
            if let Some(slot) = col.get_mut(index) {
                *slot = v;
            }
        }
    }

    pub(crate) fn into_map(self) -> Map<String, Value> {
        self.cols
            .into_iter()
            .map(|(k, v)| (k, Value::Array(v)))
            .collect()
    }
}

/// The sidecar being written (`PATH.partial` until [`Writer::finish`]).
pub(crate) struct Writer {
    partial: crate::sys::partial::Partial,
    out: BufWriter<std::fs::File>,
    path: PathBuf,
    name: String,
    error: Option<std::io::Error>,
    rows: usize,
    /// The indices written, a bit each.
    seen: Vec<u64>,
}

#[derive(Serialize)]
struct Line<'a, T> {
    index: usize,
    #[serde(flatten)]
    row: &'a T,
}

impl Writer {
    pub(crate) fn create(path: &Path) -> std::io::Result<Writer> {
        let (partial, file) = crate::sys::partial::Partial::create(path)?;
        let name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        Ok(Writer {
            partial,
            out: BufWriter::with_capacity(1 << 16, file),
            path: path.to_path_buf(),
            name,
            error: None,
            rows: 0,
            seen: Vec::new(),
        })
    }

    /// Appends request `index`'s row; the first write error is kept for [`Writer::finish`].
    pub(crate) fn write(&mut self, index: usize, row: &impl Serialize) {
        if self.error.is_some() {
            return;
        }
        let line = serde_json::to_writer(&mut self.out, &Line { index, row })
            .map_err(std::io::Error::from)
            .and_then(|()| self.out.write_all(b"\n"));
        match line {
            Ok(()) => self.rows += 1,
            Err(e) => self.error = Some(e),
        }
        let word = index / 64;
        if self.seen.len() <= word {
            self.seen.resize(word + 1, 0);
        }
        self.seen[word] |= 1 << (index % 64);
    }

    /// Rows written so far.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Flushes and renames the file (its rows renumbered first when their indices have gaps);
    /// its name, for the result's [`KEY`].
    pub(crate) fn finish(self) -> std::io::Result<String> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        let top = self
            .seen
            .iter()
            .rposition(|w| *w != 0)
            .map_or(0, |k| 64 * k + 64 - self.seen[k].leading_zeros() as usize);
        if top == self.rows {
            self.partial.commit(file)?;
        } else {
            drop(file);
            renumber(&self.partial, &self.path, &self.seen)?;
        }
        Ok(self.name)
    }
}

/// Writes the rows of `from` to `path` (through a partial file of its own), each row's index
/// replaced by its rank among the indices `seen`.
fn renumber(from: &crate::sys::partial::Partial, path: &Path, seen: &[u64]) -> std::io::Result<()> {
    let mut before = Vec::with_capacity(seen.len());
    let mut n = 0usize;
    for w in seen {
        before.push(n);
        n += w.count_ones() as usize;
    }
    let rank =
        |i: usize| before[i / 64] + (seen[i / 64] & ((1u64 << (i % 64)) - 1)).count_ones() as usize;
    let src = std::io::BufReader::new(std::fs::File::open(from.partial_path())?);
    let (to, file) = crate::sys::partial::Partial::create_as(path, "renumbered.partial")?;
    let mut out = BufWriter::with_capacity(1 << 16, file);
    const HEAD: &str = "{\"index\":";
    for line in src.lines() {
        let line = line?;
        let rest = line.strip_prefix(HEAD).unwrap_or_default();
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let index = rest[..digits]
            .parse::<usize>()
            .ok()
            .filter(|i| i / 64 < seen.len());
        let Some(i) = index else {
            let bad = format!("{}: a row without its index", from.partial_path().display());
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, bad));
        };
        writeln!(out, "{HEAD}{}{}", rank(i), &rest[digits..])?;
    }
    to.commit(out.into_inner().map_err(|e| e.into_error())?)
}

/// The arrays of the `n` requests in the sidecar `path`. A line that is not a row or is longer
/// than [`MAX_ROW_BYTES`], an index out of range or given twice, a request missing, more than
/// [`MAX_ROWS`] requests, a file too short to hold `n` rows, or one that is not a regular file is
/// an error naming the file (and the line).
pub(crate) fn read(path: &Path, n: usize) -> Result<Map<String, Value>, SidecarError> {
    let name = path.display().to_string();
    let io = |source| SidecarError::Io {
        path: name.clone(),
        source,
    };
    let file = open_regular(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        let msg = format!("is {}, not a regular file", file_kind(&meta.file_type()));
        return Err(SidecarError::File { path: name, msg });
    }
    let len = meta.len();
    if n > MAX_ROWS {
        let msg = format!("the result's {n} requests are more than the {MAX_ROWS} rows read");
        return Err(SidecarError::File { path: name, msg });
    }
    if n as u64 > len / MIN_ROW_BYTES {
        let msg = format!("{len} bytes cannot hold the result's {n} requests");
        return Err(SidecarError::File { path: name, msg });
    }
    let mut cols = Columns::new(n);
    let mut seen = vec![false; n];
    let mut reader = std::io::BufReader::new(file);
    let mut line = Vec::new();
    for k in 0.. {
        let bad = |msg: String| SidecarError::Line {
            path: name.clone(),
            line: k + 1,
            msg,
        };
        line.clear();
        let limit = MAX_ROW_BYTES as u64 + 1;
        if (&mut reader)
            .take(limit)
            .read_until(b'\n', &mut line)
            .map_err(io)?
            == 0
        {
            break;
        }
        if line.len() > MAX_ROW_BYTES {
            let mib = MAX_ROW_BYTES >> 20;
            return Err(bad(format!("longer than {mib} MiB: not a request's row")));
        }
        if line.trim_ascii().is_empty() {
            continue;
        }
        let mut row = match serde_json::from_slice(&line) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(bad("not a JSON object".into())),
            Err(e) => return Err(bad(format!("not JSON: {e}"))),
        };
        let index = row.remove("index").and_then(|v| v.as_u64());
        let i = match index.and_then(|i| usize::try_from(i).ok()) {
            Some(i) if i < n => i,
            Some(i) => return Err(bad(format!("index {i}: the result has {n} requests"))),
            None => return Err(bad("no `index` (the request's position)".into())),
        };
        if std::mem::replace(&mut seen[i], true) {
            return Err(bad(format!("index {i} given twice")));
        }
        row.retain(|k, _| ARRAYS.contains(&k.as_str()));
        cols.put(i, row);
    }
    if let Some(i) = seen.iter().position(|s| !s) {
        let got = seen.iter().filter(|s| **s).count();
        let msg = format!("holds {got} of the result's {n} requests (index {i} missing)");
        return Err(SidecarError::File { path: name, msg });
    }
    Ok(cols.into_map())
}

/// `path` opened for reading without following a symbolic link and without waiting for a
/// writer (a FIFO opens at once; [`read`] then refuses it as not a regular file).
fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

/// Moves the per-request arrays ([`ARRAYS`]) of `result` into a sidecar at `path` (`retrace
/// merge`'s output); the file's name, for the result's [`KEY`].
pub fn write_arrays(path: &Path, result: &mut Value) -> std::io::Result<String> {
    let Some(obj) = result.as_object_mut() else {
        return Err(std::io::Error::other("the result is not an object"));
    };
    let cols: Vec<(&str, Vec<Value>)> = ARRAYS
        .iter()
        .filter_map(|k| match obj.remove(*k) {
            Some(Value::Array(a)) => Some((*k, a)),
            _ => None,
        })
        .collect();
    let n = cols.iter().map(|(_, a)| a.len()).max().unwrap_or(0);
    let mut w = Writer::create(path)?;
    for i in 0..n {
        let row: Map<String, Value> = cols
            .iter()
            .map(|(k, a)| (k.to_string(), a.get(i).cloned().unwrap_or(Value::Null)))
            .collect();
        w.write(i, &row);
    }
    w.finish()
}
