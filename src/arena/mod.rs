//! [`BumpArena`]: one contiguous range for a model's weights and its runtime
//! buffers; the type's documentation describes the layout and modes.

mod builder;
mod chunk;
mod error;
mod local;
mod map;
mod materialize;
mod rewind;
mod shared;

pub use builder::{ArenaBuilder, ModePolicy};
pub use error::{ArenaError, FallbackReason};
pub use local::LocalArena;
pub use rewind::Checkpoint;

use builder::WeightsSource;

use crate::huge::Backing;
use crate::probe::{huge_page_coverage, HugeCoverage};
use map::{Geometry, Storage};
use std::fmt;
use std::io;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// How the arena's memory is backed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArenaMode {
    /// One anonymous huge-page mapping (`CK_BUMP_MODE_ANON`).
    Anon,
    /// Weights mapped read-only from the file, runtime region anonymous
    /// (`CK_BUMP_MODE_MIXED_FILE_BACKED`), Linux only.
    MixedFileBacked,
}

impl fmt::Display for ArenaMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ArenaMode::Anon => "anonymous",
            ArenaMode::MixedFileBacked => "mixed file-backed",
        })
    }
}

/// Huge-page coverage of each region of an arena (see
/// [`huge_page_coverage`]), measured per address range, not per VMA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArenaCoverage {
    /// The weights region `[weights_base, activations_base)`.
    pub weights: HugeCoverage,
    /// The runtime region `[activations_base, total_size)`.
    pub runtime: HugeCoverage,
}

static NEXT_ARENA_ID: AtomicU64 = AtomicU64::new(1);

/// Tokens tag per-thread chunks with an arena epoch (see `shared`); 0 marks
/// an empty slot.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

fn new_token() -> u64 {
    NEXT_TOKEN.fetch_add(1, Ordering::Relaxed)
}

/// One contiguous range for a model's weights and its runtime
/// buffers (activations, KV caches, scratch), after C-Kernel-Engine's
/// `ck_bump_alloc_t`.
///
/// # Layout
///
/// ```text
///  offset 0          weights_base                activations_base           total_size
///  |  header/prefix   |   weights region            |   runtime region           |
///  |  (zero, RW)      |   == file bytes at the      |   bump-allocated:          |
///  |                  |      same offsets           |   activations, KV, scratch |
///  +------------------+-----------------------------+----------------------------+
///  ^ as_ptr()                                       ^ the bump pointer starts here ->
///
///  anon mode:   [ one huge-page mapping (hugetlb, THP or 4 KiB pages), read-write      ]
///  mixed mode:  [ anon RW prefix | file pages, read-only,   | boundary page (anon,     ]
///               [ (first weights | MAP_PRIVATE (whole pages | pread) + anon RW         ]
///               [ page: pread)   | below activations_base)  |                          ]
///
///  mapping:  |<- shift ->|<------------------------ total_size ------------------->|..|
///            map start   base                 base + page_floor(activations_base)
///            (2 MiB                           is 2 MiB aligned, so the runtime
///             aligned)                        region fills whole THP extents
/// ```
///
/// Arena offset == file offset, so generated code can address a tensor as
/// `base + file_offset` and a runtime buffer as `base + runtime_offset`.
///
/// # Modes
///
/// * [`ArenaMode::Anon`]: the whole range is anonymous huge-page memory (the
///   tier ladder of [`HugeRegion`](crate::HugeRegion)); the weights must be
///   copied in with [`BumpArena::materialize_weights`].
/// * [`ArenaMode::MixedFileBacked`] (Linux): the range is reserved
///   `PROT_NONE`; the whole file pages of the weights are mapped read-only
///   `MAP_PRIVATE | MAP_FIXED` from the file (no copy, shared with the page
///   cache; a trial mapping elsewhere first, so a file that refuses to map
///   leaves no hole in the reservation); the rest is opened read-write in
///   place (`mprotect`); the partial first and last weights pages are
///   anonymous and filled with `pread` (so the prefix below `weights_base`
///   reads zero and is writable, as in anon mode); the runtime region is
///   anonymous with `MADV_HUGEPAGE` (2 MiB hugetlb pages when
///   [`HugeOptions::require`](crate::HugeOptions::require) asks for
///   [`Backing::Hugetlb`]). The file is never written.
/// * [`ModePolicy::Auto`] tries anonymous first and falls back to mixed mode
///   when a weights file is given, honouring `CK_BUMP_FORCE_MIXED` and
///   `CK_BUMP_DISABLE_MIXED` exactly as C-Kernel-Engine's `ck_bump_alloc_init`.
///
/// # Builder options
///
/// | option | default | meaning |
/// | --- | --- | --- |
/// | [`weights_file`](ArenaBuilder::weights_file) | none | the file whose bytes `[weights_base, activations_base)` fill the weights region; opened once, checked through the descriptor |
/// | [`weights_base`](ArenaBuilder::weights_base), [`activations_base`](ArenaBuilder::activations_base) | 0, 0 | the layout in bytes; `weights_base <= activations_base <= total_size` |
/// | [`policy`](ArenaBuilder::policy) | [`ModePolicy::Auto`] | which modes may be used |
/// | [`huge`](ArenaBuilder::huge) | [`HugeOptions::new`](crate::HugeOptions::new) | tiers, prefault, `mlock`, NUMA node of the anonymous mapping (mixed mode: of the runtime region); requirements hold in every mode or the build fails |
/// | [`release_on_reset`](ArenaBuilder::release_on_reset) | `false` | on reset and rewind the freed runtime bytes read zero: `MADV_DONTNEED` over whole pages, memset of the rest |
/// | [`dont_dump`](ArenaBuilder::dont_dump) | `false` | `MADV_DONTDUMP` over the weights pages |
/// | [`thread_chunks`](ArenaBuilder::thread_chunks) | `true` | each thread bumps in a chunk of its own (16 KiB doubling to 256 KiB) instead of one compare-and-swap per allocation |
/// | `manifest` (feature `weights`) | none | a [`CheckedManifest`](crate::weights::CheckedManifest) of the weights file: enables `tensor(name)`; entries must lie in the weights region |
///
/// # Allocation
///
/// `&BumpArena` is an [`Allocator`](allocator_api2::alloc::Allocator) that
/// any number of threads may share: each thread bumps inside its own chunk
/// of the runtime region (a thread-local bump pointer, no atomic operation)
/// and takes the next chunk from the shared bump pointer with one
/// compare-and-swap ([`ArenaBuilder::thread_chunks`]; with it off, every
/// allocation is one compare-and-swap on the shared pointer).
/// [`BumpArena::local`] gives a `!Sync` [`LocalArena`] handle that does the
/// same without the thread-local lookup, for one thread's hot loop. Both bump upward
/// in the runtime region; the most recent allocation can be freed, grown and
/// shrunk in place. [`BumpArena::reset`], [`BumpArena::checkpoint`] /
/// [`BumpArena::rewind_to`] take `&mut self`, which proves that nothing
/// allocated from `&arena` is alive.
///
/// # Fork, cgroups and truncation
///
/// * After `fork`, private pages are copied on write in whichever process
///   writes first; for hugetlb-backed arenas the copy needs a free huge page
///   and the writer gets `SIGBUS` when none is left.
/// * A cgroup memory limit strikes when a page is first touched, not at
///   `mmap`: `Auto` cannot fall back then (the process is OOM-killed). Use
///   [`HugeOptions::populate`](crate::HugeOptions::populate) to move that failure into
///   [`BumpArena::builder`]'s `build()`.
/// * In mixed mode the weights pages come from the file: if another process
///   truncates it, touching the dropped pages raises `SIGBUS` (no lock or
///   prefault prevents it). Use anonymous mode when the file may change.
///
/// # Thread safety
///
/// `BumpArena` is `Send + Sync`: any number of threads may allocate from
/// `&arena` at once. Dropping it unmaps the whole range.
///
/// # Example
///
/// ```
/// use allocator_api2::vec::Vec;
/// use ckalloc::BumpArena;
/// let arena = BumpArena::builder(8 << 20).build().unwrap();
/// let mut v: Vec<u32, _> = Vec::new_in(&arena);
/// v.extend([1, 2, 3]);
/// assert_eq!(v.iter().sum::<u32>(), 6);
/// assert!(arena.used() >= 12);
/// ```
pub struct BumpArena {
    /// Address of the next free runtime byte (shared bump pointer).
    cursor: AtomicUsize,
    /// `base + total_size`: no allocation ends past it.
    end: usize,
    /// Highest address the cursor reached since the last release: no byte
    /// above it was written since.
    hwm: AtomicUsize,
    /// Highest address the shared pointer reached (at chunk granularity)
    /// since the last release; the high-water mark of threads that hold no
    /// chunk of this arena.
    hwm_shared: AtomicUsize,
    /// `hwm` and `hwm_shared` before the last release (which lowers them to
    /// the bump pointer, so that the next release clears only what was
    /// written since): [`high_water_mark`](Self::high_water_mark) never
    /// decreases.
    peak: usize,
    peak_shared: usize,
    id: u64,
    /// Tag of this arena epoch's per-thread chunks, renewed by every `&mut`
    /// cursor move; `shared::NO_THREAD_CHUNKS` when they are disabled.
    token: u64,
    /// Index of this arena's entry in each thread's chunk table.
    slot: usize,
    /// Whether no other live arena uses `slot` (released on drop).
    holds_slot: bool,
    /// The mapping, the layout and the mode: everything but the bump
    /// pointer state.
    parts: Parts,
}

// SAFETY: the arena owns its mapping; shared access hands out disjoint
// blocks through the atomic cursor, and every mutation of shared state is an
// atomic operation or needs `&mut self`. The file descriptor is a plain
// integer owned by the arena.
unsafe impl Send for BumpArena {}
// SAFETY: as above: `&BumpArena` only reads immutable fields, the weights
// region (through `&[u8]`) and the atomics.
unsafe impl Sync for BumpArena {}

/// What a new arena is made of; [`BumpArena::from_parts`] adds the bump
/// pointer state.
struct Parts {
    storage: Storage,
    total_size: usize,
    weights_base: usize,
    activations_base: usize,
    mode: ArenaMode,
    fallback: Option<FallbackReason>,
    weights_file_size: Option<u64>,
    source: Option<WeightsSource>,
    materialized: bool,
    release_on_reset: bool,
    #[cfg(feature = "weights")]
    manifest: Option<crate::weights::CheckedManifest>,
}

impl BumpArena {
    /// The one constructor: a fresh id, a thread-chunk slot and token (when
    /// per-thread chunks are on), and every bump pointer at the start of the
    /// runtime region.
    fn from_parts(p: Parts, thread_chunks: bool) -> BumpArena {
        let id = NEXT_ARENA_ID.fetch_add(1, Ordering::Relaxed);
        let (slot, holds_slot, token) = if thread_chunks {
            let (slot, holds) = shared::claim_slot(id);
            (slot, holds, new_token())
        } else {
            (id as usize % shared::SLOTS, false, shared::NO_THREAD_CHUNKS)
        };
        let base = p.storage.base.as_ptr() as usize;
        let runtime_start = base + p.activations_base;
        BumpArena {
            cursor: AtomicUsize::new(runtime_start),
            end: base + p.total_size,
            hwm: AtomicUsize::new(runtime_start),
            hwm_shared: AtomicUsize::new(runtime_start),
            peak: runtime_start,
            peak_shared: runtime_start,
            id,
            token,
            slot,
            holds_slot,
            parts: p,
        }
    }
}

impl fmt::Debug for BumpArena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BumpArena")
            .field("base", &self.parts.storage.base)
            .field("total_size", &self.parts.total_size)
            .field("weights_base", &self.parts.weights_base)
            .field("activations_base", &self.parts.activations_base)
            .field("mode", &self.parts.mode)
            .field("backing", &self.parts.storage.backing)
            .field("used", &self.used())
            .finish()
    }
}

impl BumpArena {
    /// C-Kernel-Engine's `ck_bump_alloc_init`: an arena of `total_size` bytes with
    /// the weights region `[weights_base, activations_base)`, under
    /// [`ModePolicy::Auto`] (so `CK_BUMP_*` apply), with the weights file for
    /// materialization and the mixed-mode fallback when given.
    ///
    /// # Errors
    /// As [`ArenaBuilder::build`].
    pub fn new(
        weights_path: Option<&Path>,
        total_size: usize,
        weights_base: usize,
        activations_base: usize,
    ) -> Result<BumpArena, ArenaError> {
        let mut b = Self::builder(total_size)
            .weights_base(weights_base)
            .activations_base(activations_base);
        if let Some(p) = weights_path {
            b = b.weights_file(p);
        }
        b.build()
    }

    /// The base address (offset 0). Page aligned; `base +
    /// page_floor(activations_base)` is 2 MiB aligned.
    pub fn as_ptr(&self) -> *const u8 {
        self.parts.storage.base.as_ptr()
    }

    /// Total size in bytes, as requested.
    pub fn total_size(&self) -> usize {
        self.parts.total_size
    }

    /// Offset of the weights region in bytes.
    pub fn weights_base(&self) -> usize {
        self.parts.weights_base
    }

    /// Offset of the runtime region in bytes.
    pub fn activations_base(&self) -> usize {
        self.parts.activations_base
    }

    /// Bytes mapped from [`as_ptr`](Self::as_ptr) on (at least
    /// `total_size`, rounded up to the huge page size of the mapping). The
    /// C ABI reports this as `mapped_len`.
    pub fn mapped_len(&self) -> usize {
        self.parts.storage.mapped_len_from_base()
    }

    /// The exact address range this arena mapped (start, length in bytes). It
    /// starts up to 2 MiB before [`as_ptr`](Self::as_ptr) (see the layout
    /// diagram); after drop nothing is mapped there.
    pub fn mapping(&self) -> (*const u8, usize) {
        (
            self.parts.storage.map_ptr.as_ptr(),
            self.parts.storage.map_len,
        )
    }

    /// The weights file's size in bytes as checked at build time (or by
    /// [`materialize_weights_from`](Self::materialize_weights_from)), `None`
    /// without a file.
    pub fn weights_file_size(&self) -> Option<u64> {
        self.parts.weights_file_size
    }

    /// The mode the arena was built in.
    pub fn mode(&self) -> ArenaMode {
        self.parts.mode
    }

    /// Why a [`ModePolicy::Auto`] arena is in mixed mode (`None` otherwise).
    pub fn fallback_reason(&self) -> Option<&FallbackReason> {
        self.parts.fallback.as_ref()
    }

    /// The pages backing the runtime region: the tier of the huge-page
    /// mapping in anon mode; in mixed mode `Hugetlb` when the options
    /// require it, else `TransparentHuge` when `MADV_HUGEPAGE` was accepted,
    /// else `Normal`.
    pub fn backing(&self) -> Backing {
        self.parts.storage.backing
    }

    /// Whether the weights region still has to be filled by
    /// [`materialize_weights`](Self::materialize_weights): true in anon mode
    /// with a non-empty weights region until that succeeds; false in mixed
    /// mode and without a weights region. (The C ABI's function of the same
    /// name is a property of the mode instead, as in C-Kernel-Engine.)
    pub fn needs_weight_materialization(&self) -> bool {
        !self.parts.materialized
    }

    /// The weights region `[weights_base, activations_base)`. In anon mode it
    /// reads zero until materialized.
    pub fn weights(&self) -> &[u8] {
        // SAFETY: the range is mapped readable in both modes; writes to it
        // need `&mut self` (`weights_mut`, materialization), and allocations
        // never hand it out.
        unsafe {
            std::slice::from_raw_parts(
                self.ptr_at_unchecked(self.parts.weights_base),
                self.parts.activations_base - self.parts.weights_base,
            )
        }
    }

    /// The weights region for writing; `None` in mixed mode, where it is
    /// mapped read-only from the file.
    pub fn weights_mut(&mut self) -> Option<&mut [u8]> {
        if self.parts.mode != ArenaMode::Anon {
            return None;
        }
        // SAFETY: anonymous read-write memory owned by the arena; `&mut self`
        // excludes every other reference into it.
        Some(unsafe {
            std::slice::from_raw_parts_mut(
                self.ptr_at_unchecked(self.parts.weights_base),
                self.parts.activations_base - self.parts.weights_base,
            )
        })
    }

    /// The bytes of tensor `name` of the manifest given to
    /// [`ArenaBuilder::manifest`], read in place at arena offset ==
    /// `file_offset`: never fewer than the entry's shape and dtype need (the
    /// checked manifest's rule 5). `None` for an unknown name, without a manifest, or in
    /// anon mode while [`needs_weight_materialization`](Self::needs_weight_materialization)
    /// (the region would read zero).
    #[cfg(feature = "weights")]
    pub fn tensor(&self, name: &str) -> Option<&[u8]> {
        if !self.parts.materialized {
            return None;
        }
        let e = self.parts.manifest.as_ref()?.get(name)?;
        // Checked at build: wb <= file_offset, file_offset + size <= ab.
        let start = usize::try_from(e.file_offset)
            .ok()?
            .checked_sub(self.parts.weights_base)?;
        let len = usize::try_from(e.size).ok()?;
        self.weights().get(start..start.checked_add(len)?)
    }

    /// The manifest given to [`ArenaBuilder::manifest`].
    #[cfg(feature = "weights")]
    pub fn manifest(&self) -> Option<&crate::weights::CheckedManifest> {
        self.parts.manifest.as_ref()
    }

    /// The arena offset of `ptr` in bytes, or `None` when `ptr` is outside
    /// `[base, base + total_size)`.
    pub fn offset_of(&self, ptr: *const u8) -> Option<usize> {
        let off = (ptr as usize).checked_sub(self.as_ptr() as usize)?;
        (off < self.parts.total_size).then_some(off)
    }

    /// The address of `offset` (0 ..= `total_size`; `total_size` gives the
    /// one-past-the-end pointer), or `None` beyond. Writing through it is
    /// the caller's responsibility (the weights' whole pages are read-only
    /// in mixed mode, and the bump allocator owns the runtime region's
    /// allocated part). The prefix `[0, weights_base)` is writable in both
    /// modes.
    pub fn ptr_at(&self, offset: usize) -> Option<NonNull<u8>> {
        (offset <= self.parts.total_size).then(|| {
            // SAFETY: in bounds (or one past the end) of the mapping.
            unsafe { NonNull::new_unchecked(self.ptr_at_unchecked(offset)) }
        })
    }

    fn ptr_at_unchecked(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset <= self.parts.total_size);
        self.parts.storage.base.as_ptr().wrapping_add(offset)
    }

    fn runtime_start(&self) -> usize {
        self.as_ptr() as usize + self.parts.activations_base
    }

    /// Runtime bytes handed out, including alignment padding, chunks held by
    /// [`LocalArena`] handles and the unused tails of other threads' chunks
    /// (see [`ArenaBuilder::thread_chunks`]), as seen from the calling
    /// thread: exact on the thread that allocates when one thread
    /// allocates (another thread's figure includes that thread's unused
    /// chunk tail). Bytes of the runtime region, from `activations_base`.
    pub fn used(&self) -> usize {
        self.exact_cursor() - self.runtime_start()
    }

    /// Runtime bytes still free (`runtime size - used()`).
    pub fn remaining(&self) -> usize {
        self.end - self.exact_cursor()
    }

    /// The most runtime bytes ever in use at once (since build; a reset or
    /// rewind does not lower it), in bytes. A thread that has allocated from
    /// the arena through `&BumpArena` sees the peaks of its own view (exact
    /// when it is the only thread allocating); any other thread sees the
    /// peak of the shared bump pointer, which counts whole per-thread
    /// chunks. Each view never decreases.
    pub fn high_water_mark(&self) -> usize {
        let top = if self.allocates_here() {
            self.hwm
                .load(Ordering::Relaxed)
                .max(self.exact_cursor())
                .max(self.peak)
        } else {
            self.hwm_shared
                .load(Ordering::Relaxed)
                .max(self.cursor.load(Ordering::Relaxed))
                .max(self.peak_shared)
        };
        top - self.runtime_start()
    }

    /// Huge-page coverage of the weights and the runtime region (what is
    /// resident and how much of it is in huge pages).
    ///
    /// # Errors
    /// The I/O error of reading `/proc/self/pagemap` or `smaps`.
    pub fn coverage(&self) -> io::Result<ArenaCoverage> {
        let w = self.ptr_at_unchecked(self.parts.weights_base);
        let r = self.ptr_at_unchecked(self.parts.activations_base);
        Ok(ArenaCoverage {
            weights: huge_page_coverage(w, self.parts.activations_base - self.parts.weights_base)?,
            runtime: huge_page_coverage(r, self.parts.total_size - self.parts.activations_base)?,
        })
    }

    /// A handle for one thread's hot loop: bumps inside chunks taken from
    /// the shared pointer, without atomics. See [`LocalArena`].
    pub fn local(&self) -> LocalArena<'_> {
        LocalArena::new(self)
    }

    #[cfg(test)]
    pub(crate) fn slot_for_tests(&self) -> usize {
        self.slot
    }

    #[cfg(test)]
    pub(crate) fn heap_for_tests(total: usize, activations_base: usize) -> BumpArena {
        let geometry = Geometry::new(total, 0, activations_base).unwrap();
        let storage = map::heap(&geometry);
        BumpArena::from_parts(
            Parts {
                storage,
                total_size: total,
                weights_base: 0,
                activations_base,
                mode: ArenaMode::Anon,
                fallback: None,
                weights_file_size: None,
                source: None,
                materialized: true,
                release_on_reset: false,
                #[cfg(feature = "weights")]
                manifest: None,
            },
            true,
        )
    }
}

impl Drop for BumpArena {
    fn drop(&mut self) {
        // The mapping itself goes with `storage`.
        self.release_thread_slot();
        if self.holds_slot {
            shared::release_slot(self.slot);
        }
    }
}

#[cfg(test)]
mod tests;
