//! [`ArenaBuilder`]: the layout, the weights file and the mode policy of a
//! new [`BumpArena`], and the choice between anonymous and mixed mode.

use super::map::{self, Geometry, Storage};
use super::{ArenaError, ArenaMode, BumpArena, FallbackReason, Parts};
use crate::env;
use crate::huge::HugeOptions;
use crate::sys;
use std::path::{Path, PathBuf};

/// Which modes [`ArenaBuilder::build`] may use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ModePolicy {
    /// Anonymous first, mixed mode when that fails and a weights file is
    /// given; `CK_BUMP_FORCE_MIXED` skips anonymous mode and
    /// `CK_BUMP_DISABLE_MIXED` skips the fallback (each set unless empty,
    /// `0`, `false` or `no`, case-insensitive, as C-Kernel-Engine reads them;
    /// see [`env`](crate::env)). The default.
    #[default]
    Auto,
    /// Anonymous mode only; the environment is ignored.
    AnonOnly,
    /// Mixed mode only (needs a weights file); the environment is ignored.
    MixedOnly,
}

/// The open, checked weights file.
#[derive(Debug)]
pub(super) struct WeightsSource {
    pub(super) fd: sys::Fd,
    pub(super) path: PathBuf,
    pub(super) size: u64,
    /// Device and inode (compared with a checked manifest's file).
    #[cfg(feature = "weights")]
    pub(super) id: (u64, u64),
}

/// Builder for a [`BumpArena`]; see [`BumpArena::builder`].
#[derive(Clone, Debug)]
pub struct ArenaBuilder {
    total_size: usize,
    weights_file: Option<PathBuf>,
    weights_base: usize,
    activations_base: usize,
    policy: ModePolicy,
    huge: HugeOptions,
    release_on_reset: bool,
    dont_dump: bool,
    thread_chunks: bool,
    #[cfg(feature = "weights")]
    manifest: Option<crate::weights::CheckedManifest>,
}

impl BumpArena {
    /// Start building an arena of `total_size` bytes (offsets
    /// `0..total_size`). Defaults: no weights file, `weights_base` and
    /// `activations_base` 0, [`ModePolicy::Auto`], default [`HugeOptions`].
    pub fn builder(total_size: usize) -> ArenaBuilder {
        ArenaBuilder {
            total_size,
            weights_file: None,
            weights_base: 0,
            activations_base: 0,
            policy: ModePolicy::Auto,
            huge: HugeOptions::new(),
            release_on_reset: false,
            dont_dump: false,
            thread_chunks: true,
            #[cfg(feature = "weights")]
            manifest: None,
        }
    }
}

impl ArenaBuilder {
    /// The weights file whose bytes `[weights_base, activations_base)` the
    /// weights region holds (arena offset == file offset). It is opened once
    /// and checked through the open descriptor (`fstat`), so swapping the
    /// path afterwards changes nothing. Default: none.
    pub fn weights_file(mut self, path: impl AsRef<Path>) -> Self {
        self.weights_file = Some(path.as_ref().to_owned());
        self
    }

    /// Offset of the weights region in bytes. Default 0.
    pub fn weights_base(mut self, offset: usize) -> Self {
        self.weights_base = offset;
        self
    }

    /// Offset of the runtime region in bytes (the end of the weights). Default
    /// 0: no weights region, the whole arena is runtime region.
    pub fn activations_base(mut self, offset: usize) -> Self {
        self.activations_base = offset;
        self
    }

    /// Which modes to use. Default [`ModePolicy::Auto`].
    pub fn policy(mut self, policy: ModePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Huge-page options of the anonymous mapping (anon mode) or of the
    /// runtime region (mixed mode; the file pages are never huge).
    /// Requirements ([`require`](HugeOptions::require),
    /// [`populate`](HugeOptions::populate), [`mlock`](HugeOptions::mlock),
    /// [`numa_node`](HugeOptions::numa_node)) are honoured in every mode or
    /// the mode fails with a typed error (in mixed mode
    /// [`ArenaError::MixedOptions`], carrying
    /// [`HugeError::TierUnavailable`](crate::HugeError::TierUnavailable) for
    /// a tier); [`ModePolicy::Auto`] then reports both modes' failures.
    /// Preferences ([`hugetlb`](HugeOptions::hugetlb),
    /// [`allow_1gib`](HugeOptions::allow_1gib)) may fall back; the tier got
    /// is [`BumpArena::backing`]. In mixed mode the runtime region gets
    /// hugetlb (2 MiB) pages only when required, else THP or normal pages.
    /// The table of every option in each mode is in `docs/arena.md`.
    /// Default [`HugeOptions::new`].
    pub fn huge(mut self, opts: HugeOptions) -> Self {
        self.huge = opts;
        self
    }

    /// Give the runtime region's pages back to the kernel
    /// (`MADV_DONTNEED`) on [`BumpArena::reset`] and
    /// [`BumpArena::rewind_to`], and clear with a memset the bytes the
    /// kernel does not purge (the partial page at the bump pointer, up to
    /// 1 GiB with 1 GiB hugetlb pages; everything up to the high-water mark
    /// when `madvise` fails): every freed runtime byte reads zero
    /// afterwards. See [the zeroing guarantee](crate#memory-that-reads-zero).
    /// Default `false`.
    pub fn release_on_reset(mut self, yes: bool) -> Self {
        self.release_on_reset = yes;
        self
    }

    /// Leave the weights region out of core dumps (`MADV_DONTDUMP`, whole
    /// pages covering it). Default `false`.
    pub fn dont_dump(mut self, yes: bool) -> Self {
        self.dont_dump = yes;
        self
    }

    /// Give each thread that allocates through `&BumpArena` its own chunk
    /// of the runtime region (16 KiB doubling to 256 KiB, taken from the
    /// shared bump pointer), so an allocation is a thread-local bump with no
    /// atomic operation. Default `true`.
    ///
    /// The price: while several threads allocate, each holds the unused
    /// tail of its chunk (at most 256 KiB per thread, until
    /// [`BumpArena::reset`] or [`BumpArena::rewind_to`]; a thread that
    /// exits keeps it too, so every short-lived thread that allocates costs
    /// at least its first 16 KiB chunk), so a nearly full
    /// arena can refuse a request that a single shared pointer would have
    /// served, and [`BumpArena::used`] counts those tails. A single thread
    /// wastes nothing: its chunk grows in place and it sees exact figures.
    /// With `false` every allocation moves the shared pointer with one
    /// compare-and-swap and blocks of all threads are packed exactly.
    pub fn thread_chunks(mut self, yes: bool) -> Self {
        self.thread_chunks = yes;
        self
    }

    /// The tensor manifest of the weights file (for [`BumpArena::tensor`]),
    /// as [`WeightsFile::check_manifest`](crate::weights::WeightsFile::check_manifest)
    /// accepted it: every rule of the reader holds (offsets inside the tensor
    /// data, no overlaps, shapes, `runtime_offset == file_offset`, the
    /// `manifest_hash`, the dtype table). [`build`](Self::build) adds two
    /// checks of its own: every entry lies in `[weights_base,
    /// activations_base)` (arena offset == `file_offset`), and with a
    /// [`weights_file`](Self::weights_file) the manifest was checked against
    /// that file: the same length and header checksum, and the same device
    /// and inode when it was checked against a file on disk
    /// ([`ArenaError::ManifestOfAnotherFile`]). Default: none.
    #[cfg(feature = "weights")]
    pub fn manifest(mut self, manifest: crate::weights::CheckedManifest) -> Self {
        self.manifest = Some(manifest);
        self
    }

    /// Validate the layout, open and check the weights file, and map the
    /// arena in the mode the policy picks.
    ///
    /// # Errors
    /// [`ArenaError::ZeroSize`], [`ArenaError::TooLarge`],
    /// [`ArenaError::BadLayout`]; for a weights file
    /// [`ArenaError::OpenWeights`], [`ArenaError::StatWeights`],
    /// [`ArenaError::NotRegularFile`], [`ArenaError::WeightsFileTooSmall`];
    /// then the mapping errors of the mode(s) tried
    /// ([`ArenaError::Anon`], [`ArenaError::MixedMap`],
    /// [`ArenaError::BothModesFailed`], ...). Nothing stays mapped or open
    /// on error.
    pub fn build(self) -> Result<BumpArena, ArenaError> {
        let (total, wb, ab) = (self.total_size, self.weights_base, self.activations_base);
        if total == 0 {
            return Err(ArenaError::ZeroSize);
        }
        if wb > ab || ab > total {
            return Err(ArenaError::BadLayout {
                weights_base: wb,
                activations_base: ab,
                total_size: total,
            });
        }
        let geometry = Geometry::new(total, wb, ab)?;
        #[cfg(feature = "weights")]
        if let Some(m) = &self.manifest {
            manifest_fits(m, wb as u64, ab as u64)?;
        }
        let source = match &self.weights_file {
            Some(path) => Some(open_weights(path, &geometry)?),
            None => None,
        };
        #[cfg(feature = "weights")]
        if let (Some(m), Some(src)) = (&self.manifest, &source) {
            same_file(m, src)?;
        }

        let (storage, mode, fallback) = match self.policy {
            ModePolicy::AnonOnly => (map::anon(&geometry, &self.huge)?, ArenaMode::Anon, None),
            ModePolicy::MixedOnly => {
                let src = source.as_ref().ok_or(ArenaError::NoWeightsFile)?;
                let s = map::mixed(&geometry, &src.fd, src.size, &self.huge)?;
                (s, ArenaMode::MixedFileBacked, None)
            }
            ModePolicy::Auto => self.auto(
                &geometry,
                source.as_ref(),
                env::force_mixed(),
                env::disable_mixed(),
            )?,
        };

        let arena = BumpArena::from_parts(
            Parts {
                storage,
                total_size: total,
                weights_base: wb,
                activations_base: ab,
                mode,
                fallback,
                weights_file_size: source.as_ref().map(|s| s.size),
                // In mixed mode the descriptor is not needed after mapping.
                source: if mode == ArenaMode::Anon {
                    source
                } else {
                    None
                },
                materialized: mode == ArenaMode::MixedFileBacked || ab == wb,
                release_on_reset: self.release_on_reset,
                #[cfg(feature = "weights")]
                manifest: self.manifest,
            },
            self.thread_chunks,
        );
        if self.dont_dump && ab > wb {
            let page = sys::page_size();
            let start = wb & !(page - 1);
            let end = sys::round_up(ab, page).unwrap_or(ab);
            // Only a hint for core dumps: failure loses nothing.
            let _ = sys::madvise(
                arena.ptr_at_unchecked(start),
                end - start,
                sys::Advice::DontDump,
            );
        }
        Ok(arena)
    }

    fn auto(
        &self,
        geometry: &Geometry,
        source: Option<&WeightsSource>,
        force_mixed: bool,
        disable_mixed: bool,
    ) -> Result<(Storage, ArenaMode, Option<FallbackReason>), ArenaError> {
        let mut anon_err = None;
        if !force_mixed {
            match map::anon(geometry, &self.huge) {
                Ok(s) => return Ok((s, ArenaMode::Anon, None)),
                Err(e) => anon_err = Some(e),
            }
        }
        let Some(src) = source.filter(|_| !disable_mixed) else {
            return Err(match (anon_err, disable_mixed) {
                (Some(e), _) => e,
                (None, true) => ArenaError::ModesDisabledByEnv,
                (None, false) if force_mixed => ArenaError::ForcedMixedWithoutFile,
                (None, false) => ArenaError::NoWeightsFile,
            });
        };
        let mixed = map::mixed(geometry, &src.fd, src.size, &self.huge);
        match mixed {
            Ok(s) => {
                let why = match anon_err {
                    Some(e) => FallbackReason::AnonFailed(e),
                    None => FallbackReason::ForcedByEnv,
                };
                Ok((s, ArenaMode::MixedFileBacked, Some(why)))
            }
            Err(mixed) => Err(match anon_err {
                Some(anon) => ArenaError::BothModesFailed {
                    anon: Box::new(anon),
                    mixed: Box::new(mixed),
                },
                None => mixed,
            }),
        }
    }
}

/// Open the weights file and check it once through the descriptor.
pub(super) fn open_weights(path: &Path, geometry: &Geometry) -> Result<WeightsSource, ArenaError> {
    let fd = sys::open_readonly(path).map_err(|source| ArenaError::OpenWeights {
        path: path.to_owned(),
        source,
    })?;
    let st = sys::fstat(&fd).map_err(|source| ArenaError::StatWeights {
        path: path.to_owned(),
        source,
    })?;
    if !st.is_regular {
        return Err(ArenaError::NotRegularFile {
            path: path.to_owned(),
        });
    }
    if geometry.activations_base > geometry.weights_base {
        // C-Kernel-Engine's V3 rule: the file rounded up to a page must reach
        // activations_base. A mapped page that the file covers only in part
        // reads zeros past the end; a page wholly past the end would SIGBUS,
        // which this check rules out.
        let page = geometry.page as u64;
        let covered = st.size.checked_add(page - 1).map(|n| n & !(page - 1));
        if covered.is_none_or(|c| c < geometry.activations_base as u64) {
            return Err(ArenaError::WeightsFileTooSmall {
                path: path.to_owned(),
                file_size: st.size,
                activations_base: geometry.activations_base,
                page_size: geometry.page,
            });
        }
    }
    Ok(WeightsSource {
        fd,
        path: path.to_owned(),
        size: st.size,
        #[cfg(feature = "weights")]
        id: (st.dev, st.ino),
    })
}

/// `m` was checked against the file `src` is: the same device and inode
/// when `m` was checked against a file on disk, and always the same length
/// and header checksum (which also ties a manifest checked against bytes in
/// memory to the file).
#[cfg(feature = "weights")]
fn same_file(m: &crate::weights::CheckedManifest, src: &WeightsSource) -> Result<(), ArenaError> {
    let fp = m.fingerprint();
    let mut checksum = [0u8; 32];
    let same = m.identity().is_none_or(|id| (id.dev, id.ino) == src.id) && src.size == fp.len && {
        sys::pread_exact(&src.fd, &mut checksum, fp.checksum_offset).map_err(|source| {
            ArenaError::ReadWeights {
                offset: fp.checksum_offset,
                len: checksum.len(),
                source,
            }
        })?;
        checksum == fp.checksum
    };
    if same {
        return Ok(());
    }
    Err(ArenaError::ManifestOfAnotherFile {
        manifest_file: m.path().map(|p| p.to_path_buf()),
        weights_file: src.path.clone(),
    })
}

/// Every entry of `m` lies in the weights region `[wb, ab)`.
#[cfg(feature = "weights")]
fn manifest_fits(m: &crate::weights::CheckedManifest, wb: u64, ab: u64) -> Result<(), ArenaError> {
    let outside = m
        .manifest()
        .iter()
        .find(|e| e.file_offset < wb || e.end().is_none_or(|end| end > ab));
    match outside {
        Some(e) => Err(ArenaError::Manifest {
            source: crate::weights::WeightsError::EntryOutsideFile {
                name: e.name.clone(),
                file_offset: e.file_offset,
                size: e.size,
                region_start: wb,
                region_end: ab,
            },
        }),
        None => Ok(()),
    }
}
