//! [`CkHuge`]: a global allocator and `allocator_api2` allocator that serves
//! large requests from huge-page mappings (kept for reuse by a process-wide
//! retention cache) and small ones from `System` or another allocator.

use super::first_touch;
use super::retain::{self, MergedAge};
use super::stats::COUNTERS;
use super::{last_map_hugetlb, map_huge, unmap, HugeOptions};
use crate::env;
use crate::sys::{self, Advice, HUGE_PAGE_2M};
use crate::tier::Backing;
use crate::zero_size::empty_block;
use allocator_api2::alloc::{AllocError, Allocator, Layout};
use std::alloc::{GlobalAlloc, System};
use std::ptr::{self, NonNull};

/// Huge-page allocator usable as `#[global_allocator]` and as an
/// `allocator_api2` [`Allocator`].
///
/// Requests of at least [`threshold`](Self::threshold) bytes (default 2 MiB)
/// get a block of their own from the tier ladder (hugetlb, THP, normal pages),
/// rounded up to 2 MiB and aligned to at least 2 MiB (larger alignments are
/// honoured by over-reserving). Smaller requests go to the small allocator
/// `S`, [`std::alloc::System`] by default
/// ([`with_small_allocator`](Self::with_small_allocator) picks another). The
/// path a block takes depends only on its size, so a block is always freed
/// by the path that served it.
///
/// Through [`GlobalAlloc`], freed blocks go to a process-wide retention
/// cache and serve later requests of any length without a system call (a
/// shorter request is carved from a longer block; bounded by a byte cap and
/// decay;
/// [Retention](crate::huge#retention-ckhuge)), and a block whose last 2 MiB
/// page holds less than 1 MiB of the request keeps that page in base pages
/// ([Short tails](crate::huge#short-tails-ckhuge)).
///
/// Through the `allocator_api2` [`Allocator`] interface nothing is retained:
/// every block is mapped and unmapped, so `CachingAllocator<CkHuge>`
/// (IREE's caching allocator on top) is the only cache and its `trim` gives
/// memory back to the kernel. [`huge_alloc`](crate::huge_alloc) and the C
/// ABI's `ck_huge_alloc` map per block as well.
///
/// `realloc` of a mapped block grows in place with `mremap` when the address
/// space after it is free, else moves it with `mremap(MREMAP_FIXED)` into an
/// aligned reservation (a plain `MREMAP_MAYMOVE` could lose the alignment;
/// [Short tails](crate::huge#short-tails-ckhuge) says how blocks of several
/// VMAs grow);
/// hugetlb blocks cannot grow with `mremap`, so they are copied.
///
/// The mapping path never allocates, takes no lock, never panics and never
/// prints; configuration is read with `getenv`. The retention cache's fork
/// hook is registered when the library is loaded, never from this path.
/// Thread-safe.
///
/// `CkHuge<S>` is `Copy` and `Debug` when `S` is: `CkHuge` (with `System`)
/// is both, `CkHuge<mimalloc::MiMalloc>` is neither (`MiMalloc` derives
/// nothing). Equality compares the threshold and the per-value retention
/// cap, not the small allocator.
///
/// ```no_run
/// #[global_allocator]
/// static A: ckalloc::CkHuge = ckalloc::CkHuge::new();
/// ```
#[derive(Clone, Copy, Debug)]
pub struct CkHuge<S = System> {
    pub(super) threshold: usize,
    pub(super) retain_max: usize,
    /// Whether this value serves the preload library's C API (see
    /// [`c_api`](Self::c_api)) rather than Rust programs.
    pub(super) c_api: bool,
    pub(super) small: S,
}

impl<S> PartialEq for CkHuge<S> {
    fn eq(&self, other: &Self) -> bool {
        self.threshold == other.threshold && self.retain_max == other.retain_max
    }
}

impl<S> Eq for CkHuge<S> {}

impl Default for CkHuge {
    fn default() -> Self {
        Self::new()
    }
}

const OPTS: HugeOptions = HugeOptions::new();

/// The interface a call came through, which decides two things: only
/// blocks of `GlobalAlloc` calls are retained (an `Allocator` block's slice
/// covers its whole length, and `CachingAllocator` is the cache there), and
/// only they get a short tail (the caller owns exactly `layout.size()`
/// bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Via {
    GlobalAlloc,
    Allocator,
}

/// Whether the bytes a call hands out must read zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fill {
    Zeroed,
    Uninit,
}

/// A `GlobalAlloc` block whose last 2 MiB page holds fewer bytes of the
/// request than this keeps that page in 4 KiB pages (see
/// [Short tails](crate::huge#short-tails-ckhuge)): clearing the tail's 4 KiB pages costs
/// less than clearing a whole huge page, and the rest of the page stays out
/// of the resident set.
const SHORT_TAIL: usize = HUGE_PAGE_2M / 2;

/// `alloc_zeroed` hits up to this length are cleared with a memset; longer
/// ones with `MADV_DONTNEED`.
const ZERO_BY_MEMSET_MAX: usize = 16 << 20;

impl CkHuge {
    /// A `CkHuge` with the default threshold of 2 MiB, retaining freed
    /// blocks (see [Retention](crate::huge#retention-ckhuge)); small requests go to
    /// `System`.
    pub const fn new() -> CkHuge {
        CkHuge {
            threshold: HUGE_PAGE_2M,
            retain_max: usize::MAX,
            c_api: false,
            small: System,
        }
    }

    /// A `CkHuge` that maps requests of at least `bytes` bytes (`0` and `1`
    /// map every non-empty request).
    pub const fn with_threshold(bytes: usize) -> CkHuge {
        CkHuge::new().threshold_bytes(bytes)
    }

    /// A `CkHuge` that never retains: every huge-page block is mapped on
    /// allocation and unmapped on free (C-Kernel-Engine's `ck_huge_alloc`).
    pub const fn uncached() -> CkHuge {
        CkHuge::new().retain_max_bytes(0)
    }
}

impl<S> CkHuge<S> {
    /// A `CkHuge` with the defaults of [`CkHuge::new`] whose requests below
    /// the threshold go to `small`.
    pub const fn with_small_allocator(small: S) -> Self {
        CkHuge {
            threshold: HUGE_PAGE_2M,
            retain_max: usize::MAX,
            c_api: false,
            small,
        }
    }

    /// This allocator with requests of at least `bytes` bytes mapped.
    pub const fn threshold_bytes(mut self, bytes: usize) -> Self {
        self.threshold = bytes;
        self
    }

    /// This allocator retaining only blocks of at most `bytes` bytes (after
    /// rounding to 2 MiB) in the process-wide cache; `0` retains nothing,
    /// like [`CkHuge::uncached`]. The process-wide cap still applies.
    pub const fn retain_max_bytes(mut self, bytes: usize) -> Self {
        self.retain_max = bytes;
        self
    }

    /// This allocator as the preload library's C API, whose callers are C
    /// programs that count on memory they never write staying uncommitted
    /// and that free and allocate blocks of many lengths:
    ///
    /// - fresh THP blocks get no first-touch policy: they stay advised
    ///   `MADV_HUGEPAGE` and fault in when written, the way glibc's and
    ///   jemalloc's mappings do;
    /// - a zeroed retained block is cleared with `MADV_DONTNEED` whatever
    ///   its length;
    /// - while `CKALLOC_RETAIN_BYTES` is not set, the retention cap is the
    ///   larger of its default and twice the high-water mark of live bytes;
    ///   a freed block that does not fit gives back older ones, and a block
    ///   merged with retained neighbours keeps the decay stamp of the oldest;
    /// - a request that needs no zeroing and that no retained block serves
    ///   grows the longest shorter retained block with `mremap` rather than
    ///   mapping all of its length afresh (not while the hugetlb tier serves
    ///   the mappings: hugetlb blocks cannot grow).
    ///
    /// See [Retention](crate::huge#retention-ckhuge).
    #[cfg_attr(not(feature = "preload"), allow(dead_code))]
    pub(crate) const fn c_api(mut self) -> Self {
        self.c_api = true;
        self
    }

    /// Requests of at least this many bytes get a huge-page mapping.
    pub const fn threshold(&self) -> usize {
        self.threshold
    }

    /// The longest block (bytes) this value puts into the retention cache.
    pub const fn retain_max(&self) -> usize {
        self.retain_max
    }

    /// The allocator of requests below the threshold.
    pub const fn small_allocator(&self) -> &S {
        &self.small
    }
}

impl<S: GlobalAlloc> CkHuge<S> {
    #[inline]
    pub(super) fn is_mapped(&self, size: usize) -> bool {
        size >= self.threshold
    }

    /// The length of the mapping that serves `size` bytes (always
    /// representable: `Layout` sizes are at most `isize::MAX`).
    #[inline]
    pub(super) fn mapped_len(size: usize) -> Option<usize> {
        sys::round_up(size, HUGE_PAGE_2M)
    }

    /// A fresh mapping for `size` bytes, its first touch settled by the
    /// first-touch policy (none for [the C API](Self::c_api)); through
    /// `GlobalAlloc` a short tail stays in base pages.
    #[cold]
    pub(super) fn map(&self, size: usize, align: usize, via: Via) -> *mut u8 {
        match map_huge(size, align, &OPTS) {
            Ok(m) => {
                if m.backing == Backing::TransparentHuge {
                    let mut fill = m.mapped_len;
                    if via == Via::GlobalAlloc && Self::short_tail(size) {
                        // The tail page is advised before anything faults
                        // it in, and the policy leaves it to the caller.
                        Self::advise_tail(m.ptr.as_ptr(), size, m.mapped_len);
                        fill = fill.min(m.mapped_len - HUGE_PAGE_2M);
                    }
                    if !self.c_api {
                        first_touch::settle(m.ptr.as_ptr(), m.mapped_len, fill);
                    }
                }
                m.ptr.as_ptr()
            }
            Err(_) => ptr::null_mut(),
        }
    }

    /// Whether `size` leaves a short tail in its last 2 MiB page (see
    /// [Short tails](crate::huge#short-tails-ckhuge)).
    #[inline]
    pub(super) fn short_tail(size: usize) -> bool {
        let tail = size % HUGE_PAGE_2M;
        tail != 0 && tail < SHORT_TAIL
    }

    /// Advise the last 2 MiB page of a THP block of `len` bytes for `size`:
    /// `MADV_NOHUGEPAGE` when `size` leaves a short tail in it, else
    /// `MADV_HUGEPAGE`. Advice only: if it fails, the page keeps its advice.
    pub(super) fn advise_tail(p: *mut u8, size: usize, len: usize) {
        if len < HUGE_PAGE_2M {
            return;
        }
        let advice = if Self::short_tail(size) {
            Advice::NoHugePage
        } else {
            Advice::HugePage
        };
        // `len - 2 MiB` is inside the block.
        let _ = sys::madvise(p.wrapping_add(len - HUGE_PAGE_2M), HUGE_PAGE_2M, advice);
    }

    /// The most bytes the retention cache may hold when this value frees a
    /// block: `CKALLOC_RETAIN_BYTES` ([`env::retain_bytes`]), or, for a
    /// value for [the C API](Self::c_api) while the variable is unset, the
    /// larger of that default and twice the high-water mark of live bytes.
    #[inline]
    pub(crate) fn retain_cap(&self) -> usize {
        let cap = env::retain_bytes();
        if !self.c_api || env::retain_bytes_set() {
            return cap;
        }
        let peak = usize::try_from(COUNTERS.live_peak()).unwrap_or(usize::MAX);
        cap.max(peak.saturating_mul(2))
    }

    /// Whether this value uses the retention cache for a block of `len`
    /// bytes (only through `GlobalAlloc`).
    #[inline]
    pub(super) fn retains(&self, len: usize, via: Via) -> bool {
        via == Via::GlobalAlloc && len <= self.retain_max && env::retain_bytes() != 0
    }

    /// A block for `size` bytes aligned to `align`: a retained one when
    /// [`retains`](Self::retains) allows (cleared for `Fill::Zeroed`); for
    /// [the C API](Self::c_api), an uninitialized request no retained block
    /// serves grows the longest shorter one; else a fresh mapping (which the
    /// kernel zero-fills). When that mapping fails, the retention cache is
    /// given back and the mapping tried once more.
    #[inline]
    pub(super) fn map_block(&self, size: usize, align: usize, fill: Fill, via: Via) -> *mut u8 {
        let Some(len) = Self::mapped_len(size) else {
            return ptr::null_mut();
        };
        if self.retains(len, via) {
            retain::tick();
            let block_align = align.max(HUGE_PAGE_2M);
            if let Some(p) = retain::take(len, block_align) {
                if fill == Fill::Zeroed {
                    self.zero_hit(p.as_ptr(), size, len);
                }
                return p.as_ptr();
            }
            // hugetlb blocks cannot grow: while the hugetlb tier serves
            // the mappings, a miss maps a fresh hugetlb block instead.
            if self.c_api && fill == Fill::Uninit && !last_map_hugetlb() {
                if let Some(p) = self.grow_retained(size, len, block_align, via) {
                    return p.as_ptr();
                }
            }
            let p = self.map(size, align, via);
            // Address space or the VMA limit may be short because of the
            // retained blocks: give them back and try once more.
            if p.is_null() && retain::release_retained() > 0 {
                return self.map(size, align, via);
            }
            return p;
        }
        self.map(size, align, via)
    }

    /// Clear the first `size` bytes of a retained block of `len` bytes
    /// (see [Retention](crate::huge#retention-ckhuge) for the cutoff). Without
    /// the first-touch policy (the C API) every length is given back with
    /// `MADV_DONTNEED`: a memset would commit pages the caller may never
    /// write.
    #[cold]
    fn zero_hit(&self, p: *mut u8, size: usize, len: usize) {
        let by_madvise = len > ZERO_BY_MEMSET_MAX || self.c_api;
        if by_madvise && sys::madvise(p, len, Advice::DontNeed).is_ok() {
            return;
        }
        // SAFETY: the block is `len >= size` bytes, ours and unreferenced.
        unsafe { ptr::write_bytes(p, 0, size) };
    }

    /// Free a mapped block of `size` bytes: into the retention cache when
    /// [`retains`](Self::retains) allows and it has room, else unmapped.
    ///
    /// # Safety
    /// `ptr` is a mapped block of `mapped_len(size)` bytes, no longer used.
    #[inline]
    pub(super) unsafe fn release_block(&self, ptr: *mut u8, size: usize, via: Via) {
        let (Some(p), Some(len)) = (NonNull::new(ptr), Self::mapped_len(size)) else {
            return;
        };
        if self.retains(len, via) {
            retain::tick();
            let cap = self.retain_cap();
            let age = if self.c_api {
                MergedAge::Oldest
            } else {
                MergedAge::Reset
            };
            if retain::put(p, len, cap, age) {
                return;
            }
            // The C API's newest block displaces older ones rather than
            // being unmapped itself.
            if self.c_api && retain::make_room(len, cap) && retain::put(p, len, cap, age) {
                return;
            }
        }
        unmap(p, len);
    }
}

// SAFETY: `alloc` returns blocks of at least `layout.size()` bytes aligned to
// `layout.align()` (`S`'s, a mapping aligned to max(align, 2 MiB), or
// retained memory of the request's 2 MiB-rounded length, a whole block or
// the front of a longer one, whose address meets the alignment), or null;
// `alloc_zeroed` clears retained blocks; `dealloc` routes by size
// exactly as `alloc` did; `realloc` keeps the contents up to the smaller size
// and leaves the block intact on failure.
unsafe impl<S: GlobalAlloc> GlobalAlloc for CkHuge<S> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !self.is_mapped(layout.size()) {
            retain::tick_small();
            // SAFETY: the caller's contract (non-zero size) is `S`'s.
            return unsafe { self.small.alloc(layout) };
        }
        self.map_block(
            layout.size(),
            layout.align(),
            Fill::Uninit,
            Via::GlobalAlloc,
        )
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !self.is_mapped(layout.size()) {
            retain::tick_small();
            // SAFETY: as in `alloc`.
            return unsafe { self.small.alloc_zeroed(layout) };
        }
        self.map_block(
            layout.size(),
            layout.align(),
            Fill::Zeroed,
            Via::GlobalAlloc,
        )
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !self.is_mapped(layout.size()) {
            // SAFETY: small blocks came from `S` with this layout.
            return unsafe { self.small.dealloc(ptr, layout) };
        }
        // SAFETY: mapped blocks are `mapped_len(size)` long at `ptr`.
        unsafe { self.release_block(ptr, layout.size(), Via::GlobalAlloc) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: GlobalAlloc's realloc contract is `resize`'s.
        unsafe {
            self.resize(
                ptr,
                layout.size(),
                layout.align(),
                new_size,
                Fill::Uninit,
                Via::GlobalAlloc,
            )
        }
    }
}

impl<S: GlobalAlloc> CkHuge<S> {
    /// The slice a block of `size` bytes may use: the whole mapping for
    /// mapped blocks (any size in between is valid when freeing, since it
    /// rounds to the same mapping and stays on the mapping path).
    #[inline]
    fn usable(&self, ptr: *mut u8, size: usize) -> Result<NonNull<[u8]>, AllocError> {
        let p = NonNull::new(ptr).ok_or(AllocError)?;
        let len = if self.is_mapped(size) {
            Self::mapped_len(size).ok_or(AllocError)?
        } else {
            size
        };
        Ok(NonNull::slice_from_raw_parts(p, len))
    }

    /// Grow/shrink for the `Allocator` trait, moving when the alignment changes.
    ///
    /// # Safety
    /// `Allocator::grow`/`shrink`'s contract.
    unsafe fn reallocate(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
        fill: Fill,
    ) -> Result<NonNull<[u8]>, AllocError> {
        if old.size() == 0 {
            return if fill == Fill::Zeroed {
                self.allocate_zeroed(new)
            } else {
                self.allocate(new)
            };
        }
        if new.size() == 0 {
            // SAFETY: the caller's contract.
            unsafe { self.deallocate(ptr, old) };
            return Ok(empty_block(new.align()));
        }
        if old.align() == new.align() {
            // SAFETY: forwarded contract; sizes are valid for the alignment.
            let p = unsafe {
                self.resize(
                    ptr.as_ptr(),
                    old.size(),
                    old.align(),
                    new.size(),
                    fill,
                    Via::Allocator,
                )
            };
            return self.usable(p, new.size());
        }
        let fresh = if fill == Fill::Zeroed {
            self.allocate_zeroed(new)?
        } else {
            self.allocate(new)?
        };
        // SAFETY: disjoint blocks; both hold at least min(old, new) bytes.
        unsafe {
            ptr::copy_nonoverlapping(
                ptr.as_ptr(),
                fresh.as_ptr().cast::<u8>(),
                old.size().min(new.size()),
            );
            self.deallocate(ptr, old);
        }
        Ok(fresh)
    }
}

// SAFETY: blocks stay valid until deallocated, since `CkHuge` holds no state
// of its own besides `S` (copies share `S`'s contract); zero-size requests get
// a dangling, aligned pointer and are never passed on. Mapped blocks are
// fresh mappings (zero-filled by the kernel) and are unmapped on free: this
// interface never uses the retention cache.
unsafe impl<S: GlobalAlloc> Allocator for CkHuge<S> {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            return Ok(empty_block(layout.align()));
        }
        let p = if self.is_mapped(layout.size()) {
            self.map_block(layout.size(), layout.align(), Fill::Uninit, Via::Allocator)
        } else {
            // SAFETY: non-zero size.
            unsafe { self.small.alloc(layout) }
        };
        self.usable(p, layout.size())
    }

    #[inline]
    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            return Ok(empty_block(layout.align()));
        }
        let p = if self.is_mapped(layout.size()) {
            self.map_block(layout.size(), layout.align(), Fill::Zeroed, Via::Allocator)
        } else {
            // SAFETY: non-zero size.
            unsafe { self.small.alloc_zeroed(layout) }
        };
        self.usable(p, layout.size())
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        if self.is_mapped(layout.size()) {
            // SAFETY: a mapped block of `mapped_len(size)` bytes.
            unsafe { self.release_block(ptr.as_ptr(), layout.size(), Via::Allocator) }
        } else {
            // SAFETY: small blocks came from `S` with this layout.
            unsafe { self.small.dealloc(ptr.as_ptr(), layout) }
        }
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded contract.
        unsafe { self.reallocate(ptr, old, new, Fill::Uninit) }
    }

    unsafe fn grow_zeroed(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded contract.
        unsafe { self.reallocate(ptr, old, new, Fill::Zeroed) }
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded contract.
        unsafe { self.reallocate(ptr, old, new, Fill::Uninit) }
    }
}
