//! Opening a `weights.bump` with its sidecars, checking the manifest and
//! hashing the file, shared by `inspect`, `load` and `demo`.

use crate::error::{err, CliError};
use crate::format::shown;
use crate::output::progress;
use ckalloc::weights::{CheckOptions, CheckedManifest, ManifestBinding, WeightsError, WeightsFile};
use std::path::{Path, PathBuf};

/// What `inspect` and `load` refuse beyond the rules every file keeps.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct CheckArgs {
    /// Refuse what is otherwise a warning: a gap between tensors wider than the
    /// file's alignment, a manifest_hash that cannot be checked, a dtype table
    /// that disagrees while nothing protects the writer's name.
    #[arg(long)]
    pub strict: bool,
    /// Refuse a manifest that a verified BUMPWGT5 manifest_hash does not bind to
    /// the file (every BUMPWGT3/BUMPWGT4 file, a .map without its JSON).
    #[arg(long)]
    pub require_manifest_hash: bool,
}

impl CheckArgs {
    pub fn options(self) -> CheckOptions {
        CheckOptions::new()
            .strict(self.strict)
            .require_manifest_hash(self.require_manifest_hash)
    }
}

/// The directory holding a weights file's sidecars.
pub fn sidecar_dir(weights: &Path) -> PathBuf {
    match weights.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A weights error as one line naming `path` once: the errors about a
/// file or directory already carry its path, the others do not.
pub fn error_line(path: &Path, e: &WeightsError) -> String {
    match e {
        WeightsError::Io { .. }
        | WeightsError::NotARegularFile { .. }
        | WeightsError::FileChanged { .. }
        | WeightsError::ManifestHashMismatch { .. }
        | WeightsError::SidecarTooLarge { .. }
        | WeightsError::ManifestRequired { .. } => e.to_string(),
        e => format!("{}: {e}", shown(path)),
    }
}

/// [`error_line`] as a [`CliError`].
pub fn file_error(path: &Path, e: WeightsError) -> CliError {
    err(error_line(path, &e))
}

/// Open `weights.bump` (read with `pread`; no sidecars); errors name the file once.
pub fn open_file(path: &Path) -> Result<WeightsFile, CliError> {
    WeightsFile::open(path).map_err(|e| file_error(path, e))
}

/// Open `weights.bump`, read its sidecars and check the manifest against
/// the file (`WeightsFile::check_manifest`); errors name the file. A file
/// without a manifest is refused with the library's `ManifestRequired` error.
pub fn open_checked(
    path: &Path,
    check: CheckArgs,
) -> Result<(WeightsFile, CheckedManifest), CliError> {
    let file = open_file(path)?;
    let checked = file
        .load_manifest(sidecar_dir(path))
        .and_then(|m| file.check_manifest(m, check.options()))
        .map_err(|e| file_error(path, e))?;
    Ok((file, checked))
}

/// Hash `file`, opened from `path`, with a progress bar; `Ok(None)` when
/// verified, `Ok(Some(line))` when the checksum does not match, `Err` when
/// the file cannot be read (or changed while read); both name the file once.
pub fn verify_checksum(
    path: &Path,
    file: &WeightsFile,
    json: bool,
) -> Result<Option<String>, CliError> {
    let bar = progress("sha256", json);
    let r = file.verify_checksum_with(|done, total| bar.update(done, total));
    bar.finish();
    match r {
        Ok(()) => Ok(None),
        Err(e @ WeightsError::BadChecksum { .. }) => Ok(Some(error_line(path, &e))),
        Err(e) => Err(file_error(path, e)),
    }
}

/// What binds the manifest to the file, in a few words for a closing line.
pub fn binding_words(b: ManifestBinding) -> &'static str {
    match b {
        ManifestBinding::ManifestHash => "manifest bound by its manifest_hash",
        ManifestBinding::HashUnchecked => {
            "manifest NOT checked against the recorded manifest_hash (no weights_manifest.json)"
        }
        _ => "manifest not bound to the file (no manifest hash recorded)",
    }
}
