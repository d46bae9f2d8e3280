//! [`ArenaError`] and [`FallbackReason`].

use crate::huge::HugeError;
use std::fmt;
use std::io;
use std::path::PathBuf;

/// Why building, materializing or rewinding a [`BumpArena`](super::BumpArena)
/// failed. Every variant names the values involved; a failed build leaves
/// nothing mapped and no file open.
#[derive(Debug)]
#[non_exhaustive]
pub enum ArenaError {
    /// `total_size` was 0.
    ZeroSize,
    /// `total_size` bytes (plus the alignment slack of up to 2 MiB) cannot be
    /// rounded up to 2 MiB without overflowing, or exceed `isize::MAX`.
    TooLarge {
        /// The requested total size in bytes.
        total_size: usize,
    },
    /// The layout breaks `weights_base <= activations_base <= total_size`.
    BadLayout {
        /// Offset of the weights region in bytes.
        weights_base: usize,
        /// Offset of the runtime region in bytes.
        activations_base: usize,
        /// Total size in bytes.
        total_size: usize,
    },
    /// The weights file could not be opened.
    OpenWeights {
        /// The path given.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// `fstat` on the open weights file failed.
    StatWeights {
        /// The path given.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The weights path is not a regular file (a directory, FIFO, device...).
    NotRegularFile {
        /// The path given.
        path: PathBuf,
    },
    /// The weights file does not cover the weights region: its size rounded
    /// up to a page must be at least `activations_base` (C-Kernel-Engine's rule).
    WeightsFileTooSmall {
        /// The path given.
        path: PathBuf,
        /// The file's size in bytes.
        file_size: u64,
        /// The end of the weights region in bytes.
        activations_base: usize,
        /// The page size in bytes used for rounding.
        page_size: usize,
    },
    /// Mixed mode was required but no weights file was given; or
    /// [`materialize_weights`](super::BumpArena::materialize_weights) was
    /// called on an arena built without one.
    NoWeightsFile,
    /// `CK_BUMP_FORCE_MIXED` is set (under [`ModePolicy::Auto`](super::ModePolicy::Auto)),
    /// which skips anonymous mode, but no weights file was given for mixed
    /// mode. Unset the variable, give a weights file, or (from Rust) build
    /// with `ModePolicy::AnonOnly`, which the variable does not reach.
    ForcedMixedWithoutFile,
    /// The anonymous arena could not be mapped (the huge-page tier ladder
    /// failed: `RLIMIT_AS`, `RLIMIT_DATA`, overcommit, or a required tier).
    Anon {
        /// The requested total size in bytes.
        total_size: usize,
        /// The error of the huge-page layer.
        source: HugeError,
    },
    /// Mixed mode: an `mmap`/`madvise` step failed. The reservation is
    /// released.
    MixedMap {
        /// Which step failed (`"reserve"`, `"prefix"`, `"weights"`,
        /// `"runtime"`).
        step: &'static str,
        /// Arena offset of the range in bytes.
        offset: usize,
        /// Length of the range in bytes.
        len: usize,
        /// The OS error.
        source: io::Error,
    },
    /// Mixed mode: the options of the runtime region failed: a required
    /// tier it could not get ([`HugeError::TierUnavailable`]), NUMA binding,
    /// prefault or `mlock`.
    MixedOptions {
        /// The error of the huge-page layer.
        source: HugeError,
    },
    /// Mixed mode is only implemented on Linux.
    MixedUnsupported,
    /// Reading the weights file failed (a short read, `EIO`...): during
    /// materialization, or while filling the weights' partial first or last
    /// page in mixed mode.
    ReadWeights {
        /// File (and arena) offset of the failed read in bytes.
        offset: u64,
        /// Length of the failed read in bytes.
        len: usize,
        /// The OS error; `UnexpectedEof` for a file that became shorter.
        source: io::Error,
    },
    /// The weights file's size changed since it was checked.
    WeightsFileChanged {
        /// The size checked at build time in bytes.
        expected: u64,
        /// The size now in bytes.
        found: u64,
    },
    /// Under `ModePolicy::Auto` both `CK_BUMP_FORCE_MIXED` and
    /// `CK_BUMP_DISABLE_MIXED` are set, which leaves no mode to try (C-Kernel-Engine
    /// fails the same way).
    ModesDisabledByEnv,
    /// Under `ModePolicy::Auto` the anonymous arena failed and so did the
    /// mixed-mode fallback.
    BothModesFailed {
        /// Why anonymous mode failed.
        anon: Box<ArenaError>,
        /// Why mixed mode failed.
        mixed: Box<ArenaError>,
    },
    /// The manifest given with `ArenaBuilder::manifest` does not fit the
    /// arena: an entry outside `[weights_base, activations_base)`.
    #[cfg(feature = "weights")]
    Manifest {
        /// The check that failed.
        source: crate::weights::WeightsError,
    },
    /// The manifest given with `ArenaBuilder::manifest` was checked against
    /// another file than the arena's weights file (device and inode, length
    /// or header checksum differ).
    #[cfg(feature = "weights")]
    ManifestOfAnotherFile {
        /// The file the manifest was checked against.
        manifest_file: Option<PathBuf>,
        /// The arena's weights file.
        weights_file: PathBuf,
    },
    /// A [`Checkpoint`](super::Checkpoint) from another arena, or one that
    /// lies above the current bump pointer (it was taken before a reset or
    /// an earlier rewind).
    BadCheckpoint {
        /// Runtime bytes in use when the checkpoint was taken.
        checkpoint_used: usize,
        /// Runtime bytes in use now.
        used: usize,
        /// Whether the checkpoint comes from this arena.
        same_arena: bool,
    },
}

impl fmt::Display for ArenaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArenaError::ZeroSize => write!(f, "bump arena of total_size 0 bytes"),
            ArenaError::TooLarge { total_size } => write!(
                f,
                "bump arena of total_size {total_size} bytes: rounding up to 2 MiB overflows or \
                 exceeds isize::MAX"
            ),
            ArenaError::BadLayout {
                weights_base,
                activations_base,
                total_size,
            } => write!(
                f,
                "invalid bump layout: weights_base {weights_base}, activations_base \
                 {activations_base}, total_size {total_size} (need weights_base <= \
                 activations_base <= total_size)"
            ),
            ArenaError::OpenWeights { path, source } => {
                write!(f, "cannot open weights file {}: {source}", path.display())
            }
            ArenaError::StatWeights { path, source } => {
                write!(
                    f,
                    "fstat of weights file {} failed: {source}",
                    path.display()
                )
            }
            ArenaError::NotRegularFile { path } => {
                write!(f, "weights file {} is not a regular file", path.display())
            }
            ArenaError::WeightsFileTooSmall {
                path,
                file_size,
                activations_base,
                page_size,
            } => write!(
                f,
                "weights file {} has {file_size} bytes, too small for activations_base \
                 {activations_base} (its size rounded up to {page_size}-byte pages must reach it)",
                path.display()
            ),
            ArenaError::NoWeightsFile => write!(
                f,
                "no weights file: mixed mode and materialization need one (builder \
                 .weights_file(path))"
            ),
            ArenaError::ForcedMixedWithoutFile => write!(
                f,
                "CK_BUMP_FORCE_MIXED is set, which skips anonymous mode, but no weights file \
                 was given for mixed mode; unset the variable or give a weights file"
            ),
            ArenaError::Anon { total_size, source } => write!(
                f,
                "anonymous bump arena of {total_size} bytes failed: {source}"
            ),
            ArenaError::MixedMap {
                step,
                offset,
                len,
                source,
            } => write!(
                f,
                "mixed-mode {step} mapping of {len} bytes at arena offset {offset} failed: {source}"
            ),
            ArenaError::MixedOptions { source } => {
                write!(f, "mixed-mode runtime region options failed: {source}")
            }
            ArenaError::MixedUnsupported => {
                write!(f, "mixed file-backed mode is only available on Linux")
            }
            ArenaError::ReadWeights {
                offset,
                len,
                source,
            } => write!(
                f,
                "reading {len} bytes of the weights file at offset {offset} failed: {source}"
            ),
            ArenaError::WeightsFileChanged { expected, found } => write!(
                f,
                "weights file changed size: {expected} bytes when checked, {found} bytes now"
            ),
            ArenaError::ModesDisabledByEnv => write!(
                f,
                "CK_BUMP_FORCE_MIXED skips anonymous mode and CK_BUMP_DISABLE_MIXED skips mixed \
                 mode: no mode left to try"
            ),
            ArenaError::BothModesFailed { anon, mixed } => write!(
                f,
                "anonymous mode failed ({anon}) and the mixed-mode fallback failed ({mixed})"
            ),
            #[cfg(feature = "weights")]
            ArenaError::Manifest { source } => {
                write!(f, "manifest does not fit the arena: {source}")
            }
            #[cfg(feature = "weights")]
            ArenaError::ManifestOfAnotherFile {
                manifest_file,
                weights_file,
            } => write!(
                f,
                "the manifest was checked against {}, not the weights file {}",
                manifest_file.as_ref().map_or_else(
                    || "bytes in memory".to_string(),
                    |p| crate::Escaped::new(&p.to_string_lossy()).to_string()
                ),
                crate::Escaped::new(&weights_file.to_string_lossy())
            ),
            ArenaError::BadCheckpoint {
                checkpoint_used,
                used,
                same_arena,
            } => {
                if *same_arena {
                    write!(
                        f,
                        "checkpoint at {checkpoint_used} used bytes lies above the bump pointer \
                         ({used} used bytes): it was taken before a reset or an earlier rewind"
                    )
                } else {
                    write!(f, "checkpoint belongs to another arena")
                }
            }
        }
    }
}

impl std::error::Error for ArenaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ArenaError::OpenWeights { source, .. }
            | ArenaError::StatWeights { source, .. }
            | ArenaError::MixedMap { source, .. }
            | ArenaError::ReadWeights { source, .. } => Some(source),
            ArenaError::Anon { source, .. } | ArenaError::MixedOptions { source } => Some(source),
            ArenaError::BothModesFailed { mixed, .. } => Some(&**mixed),
            #[cfg(feature = "weights")]
            ArenaError::Manifest { source } => Some(source),
            _ => None,
        }
    }
}

/// Why a [`BumpArena`](super::BumpArena) built under `ModePolicy::Auto` is in
/// mixed mode instead of anonymous mode.
#[derive(Debug)]
#[non_exhaustive]
pub enum FallbackReason {
    /// `CK_BUMP_FORCE_MIXED` is set, so anonymous mode was not tried.
    ForcedByEnv,
    /// Anonymous mode was tried and failed with this error.
    AnonFailed(ArenaError),
}

impl fmt::Display for FallbackReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FallbackReason::ForcedByEnv => write!(f, "CK_BUMP_FORCE_MIXED is set"),
            FallbackReason::AnonFailed(e) => write!(f, "{e}"),
        }
    }
}
