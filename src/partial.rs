//! A file written as `PATH.partial` and renamed to PATH once complete: readers never see half a
//! file, an old file at PATH stays whole until the new one replaces it, and a write that is
//! abandoned (an error, a failed run) removes its partial file.

use std::fs::File;
use std::path::{Path, PathBuf};

/// `PATH.partial`, open for writing; [`Partial::commit`] renames it to PATH.
#[derive(Debug)]
pub struct Partial {
    partial: PathBuf,
    path: PathBuf,
    committed: bool,
}

impl Partial {
    /// Creates `path.partial` (truncating a leftover one).
    pub fn create(path: &Path) -> std::io::Result<(Partial, File)> {
        let mut partial = path.as_os_str().to_owned();
        partial.push(".partial");
        let partial = PathBuf::from(partial);
        let file = File::create(&partial)?;
        let p = Partial {
            partial,
            path: path.to_path_buf(),
            committed: false,
        };
        Ok((p, file))
    }

    /// Syncs `file` (the one [`Partial::create`] opened) and renames it to PATH.
    pub fn commit(mut self, file: File) -> std::io::Result<()> {
        file.sync_all()?;
        drop(file);
        std::fs::rename(&self.partial, &self.path)?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.partial);
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
