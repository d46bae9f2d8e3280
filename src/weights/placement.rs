//! Where an output file is written before it gets its name: unnamed
//! (`O_TMPFILE`) where the filesystem allows, else under a temporary name
//! unique in the process and on the machine ([`PendingFile`]).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::WeightsError;

/// An output file being written. Where the filesystem supports it the file
/// is unnamed (`O_TMPFILE`, see `open(2)`) until [`commit`](Self::commit)
/// links it in: a process killed or interrupted while writing leaves no file
/// behind. Elsewhere it is a named temporary file `.NAME.tmp-PID-N` in the
/// same directory (N counts the process's temporary names, and the file is
/// created with `O_EXCL`, so two writers never share one), removed on drop
/// unless committed.
pub(super) struct PendingFile {
    pub(super) file: File,
    dir: PathBuf,
    name: &'static str,
    /// The temporary name of a named (fallback) file.
    temp: Option<PathBuf>,
}

/// Counts the temporary names this process made.
static TEMP_NAMES: AtomicU64 = AtomicU64::new(0);

/// `dir/.NAME.KIND-PID-N`: a name no other writer of this process uses, and
/// no writer of another process (whose pid differs).
fn temp_name(dir: &Path, name: &str, kind: &str) -> PathBuf {
    let n = TEMP_NAMES.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(".{name}.{kind}-{}-{n}", std::process::id()))
}

/// Try `make` with fresh temporary names until one is not taken.
fn with_fresh_name<T>(
    dir: &Path,
    name: &str,
    kind: &str,
    op: &'static str,
    mut make: impl FnMut(&Path) -> std::io::Result<T>,
) -> Result<(T, PathBuf), WeightsError> {
    loop {
        let p = temp_name(dir, name, kind);
        match make(&p) {
            Ok(v) => return Ok((v, p)),
            // A file left by a process that had this pid before: next name.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(WeightsError::io(&p, op, e)),
        }
    }
}

impl PendingFile {
    pub(super) fn create(dir: &Path, name: &'static str) -> Result<PendingFile, WeightsError> {
        let (file, temp) = match crate::sys::open_unnamed_in(dir) {
            Ok(f) => (f, None),
            Err(e) if crate::sys::unnamed_unsupported(&e) => {
                let (f, p) = with_fresh_name(dir, name, "tmp", "create", |p| {
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(p)
                })?;
                (f, Some(p))
            }
            Err(e) => return Err(WeightsError::io(dir, "create an unnamed file in", e)),
        };
        Ok(PendingFile {
            file,
            dir: dir.to_path_buf(),
            name,
            temp,
        })
    }

    /// Give the complete file the name `dest`, replacing an existing `dest`
    /// atomically (`rename(2)`): a reader sees the old file or the new one.
    pub(super) fn commit(mut self, dest: &Path) -> Result<(), WeightsError> {
        let rename = |from: &Path| {
            std::fs::rename(from, dest).map_err(|e| {
                let _ = std::fs::remove_file(from);
                WeightsError::io(dest, "rename", e)
            })
        };
        if let Some(temp) = self.temp.take() {
            return rename(&temp);
        }
        // `linkat` never replaces: link straight to `dest` when it is free,
        // else to a fresh name that `rename` then moves over `dest`.
        match crate::sys::link_unnamed(&self.file, dest) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(WeightsError::io(dest, "link", e)),
        }
        // A fresh name: never one another writer is about to rename.
        let ((), link) = with_fresh_name(&self.dir, self.name, "new", "link", |p| {
            crate::sys::link_unnamed(&self.file, p)
        })?;
        rename(&link)
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if let Some(p) = &self.temp {
            let _ = std::fs::remove_file(p);
        }
    }
}
