//! Opening a `weights.bump` with its sidecars and hashing it, shared by
//! `inspect`, `load` and `demo`.

use crate::util::{err, progress, CliError};
use ckalloc::weights::{Manifest, WeightsError, WeightsFile};
use std::path::{Path, PathBuf};

/// The directory holding a weights file's sidecars.
pub fn sidecar_dir(weights: &Path) -> PathBuf {
    match weights.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A `WeightsFile::open` error as one line naming `path` once: the I/O and
/// not-a-regular-file errors already carry the path, the format errors do not.
pub fn open_error(path: &Path, e: WeightsError) -> CliError {
    match e {
        WeightsError::Io { .. } | WeightsError::NotARegularFile { .. } => err(e),
        e => err(format!("{}: {e}", path.display())),
    }
}

/// Open `weights.bump` (no sidecars); errors name the file once.
pub fn open_file(path: &Path) -> Result<WeightsFile, CliError> {
    WeightsFile::open(path).map_err(|e| open_error(path, e))
}

/// Open `weights.bump` and its sidecars; errors name the file. A file without
/// a manifest is refused with the library's `ManifestRequired` error.
pub fn open(path: &Path) -> Result<(WeightsFile, Manifest), CliError> {
    let file = open_file(path)?;
    let manifest = file
        .load_manifest(sidecar_dir(path))
        .map_err(|e| err(e.to_string()))?;
    Ok((file, manifest))
}

/// Hash the file with a progress bar; `Ok(None)` when verified, `Ok(Some(msg))`
/// when the checksum does not match.
pub fn verify_checksum(file: &WeightsFile, json: bool) -> Result<Option<String>, CliError> {
    let bar = progress(0, "sha256", json);
    let r = file.verify_checksum_with(|done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    match r {
        Ok(()) => Ok(None),
        Err(e @ WeightsError::BadChecksum { .. }) => Ok(Some(e.to_string())),
        Err(e) => Err(err(e.to_string())),
    }
}
