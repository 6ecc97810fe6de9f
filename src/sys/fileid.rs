//! Which of several paths name the same file: the same device and inode (a hard link, a symbolic
//! link, `./a` beside `a`), so that a file given twice is never read, and counted, twice.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The file `path` names (symbolic links followed): its device and inode; `None` when it cannot
/// be looked up.
pub(crate) fn id(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The first path (`later`) naming the same file as an earlier one (`earlier`), as indexes
/// `(earlier, later)`. A path that cannot be looked up is skipped: its reader reports it.
pub(crate) fn first_repeat<P: AsRef<Path>>(paths: &[P]) -> Option<(usize, usize)> {
    let ids: Vec<Option<(u64, u64)>> = paths.iter().map(|p| id(p.as_ref())).collect();
    ids.iter().enumerate().find_map(|(later, id)| {
        let id = id.as_ref()?;
        let earlier = ids[..later].iter().position(|e| e.as_ref() == Some(id))?;
        Some((earlier, later))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_or_another_spelling_of_a_path_is_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, "x").unwrap();
        std::fs::write(&b, "x").unwrap();
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        let dotted = dir.path().join(".").join("b");
        let missing = dir.path().join("none");
        assert_eq!(first_repeat(&[&a, &b, &missing, &missing]), None);
        assert_eq!(first_repeat(&[&a, &b, &link]), Some((0, 2)));
        assert_eq!(first_repeat(&[&a, &b, &dotted]), Some((1, 2)));
    }
}
