//! A file written as `PATH.partial` and renamed to PATH once complete: readers never see half a
//! file, an old file at PATH stays whole until the new one replaces it, and a write that is
//! abandoned (an error, a failed run) removes its partial file. The partial files open in the
//! process are listed, so that one interrupted by a signal removes them before it exits
//! ([`exit`]).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// The partial files this process has open. Creating, renaming and removing one happen under
/// its lock, so [`exit`] sees every one and none is renamed after it.
static OPEN: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn open_files() -> MutexGuard<'static, Vec<PathBuf>> {
    OPEN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes every partial file this process has open and exits with `code` (a signal stopped a
/// command that cannot finish its output).
pub(crate) fn exit(code: u8) -> ! {
    let open = open_files();
    for p in open.iter() {
        let _ = std::fs::remove_file(p);
    }
    // The lock is held to the end: no partial file is created or renamed after this.
    std::process::exit(i32::from(code))
}

/// Takes `path` off the list of open partial files.
fn forget(open: &mut Vec<PathBuf>, path: &Path) {
    if let Some(i) = open.iter().position(|p| p == path) {
        open.swap_remove(i);
    }
}

/// `PATH.partial`, open for writing; [`Partial::commit`] renames it to PATH.
#[derive(Debug)]
pub(crate) struct Partial {
    partial: PathBuf,
    path: PathBuf,
    committed: bool,
}

impl Partial {
    /// Creates `path.partial` (truncating a leftover one).
    pub(crate) fn create(path: &Path) -> std::io::Result<(Partial, File)> {
        Partial::create_as(path, "partial")
    }

    /// Creates `path.SUFFIX` (truncating a leftover one), to be renamed to `path`.
    pub(crate) fn create_as(path: &Path, suffix: &str) -> std::io::Result<(Partial, File)> {
        let mut partial = path.as_os_str().to_owned();
        partial.push(".");
        partial.push(suffix);
        let partial = PathBuf::from(partial);
        let mut open = open_files();
        let file = File::create(&partial)?;
        open.push(partial.clone());
        drop(open);
        let p = Partial {
            partial,
            path: path.to_path_buf(),
            committed: false,
        };
        Ok((p, file))
    }

    /// The file being written (`path.partial`).
    pub(crate) fn partial_path(&self) -> &Path {
        &self.partial
    }

    /// Syncs `file` (the one [`Partial::create`] opened) and renames it to PATH.
    pub(crate) fn commit(mut self, file: File) -> std::io::Result<()> {
        file.sync_all()?;
        drop(file);
        let mut open = open_files();
        std::fs::rename(&self.partial, &self.path)?;
        forget(&mut open, &self.partial);
        self.committed = true;
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.committed {
            let mut open = open_files();
            let _ = std::fs::remove_file(&self.partial);
            forget(&mut open, &self.partial);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn committed_replaces_the_old_file_and_abandoned_leaves_it_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.json");
        std::fs::write(&path, "old").unwrap();
        let (p, mut f) = Partial::create(&path).unwrap();
        f.write_all(b"half").unwrap();
        drop((p, f));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old");
        assert!(!dir.path().join("out.json.partial").exists());
        let (p, mut f) = Partial::create(&path).unwrap();
        f.write_all(b"new").unwrap();
        p.commit(f).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert!(!dir.path().join("out.json.partial").exists());
    }
}
