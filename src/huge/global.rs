//! [`CkHuge`]: a global allocator and `allocator_api2` allocator that serves
//! large requests from huge-page mappings (kept for reuse by a process-wide
//! retention cache) and small ones from `System` or another allocator.

use super::retain;
use super::stats::COUNTERS;
use super::{map_huge, unmap, HugeOptions};
use crate::env;
use crate::sys::{self, Advice, HUGE_PAGE_2M};
use crate::tier::{self, Backing};
use crate::zero_size::empty_block;
use allocator_api2::alloc::{AllocError, Allocator, Layout};
use std::alloc::{GlobalAlloc, System};
use std::ptr::{self, NonNull};
use std::sync::atomic::Ordering;

/// Huge-page allocator usable as `#[global_allocator]` and as an
/// `allocator_api2` [`Allocator`].
///
/// Requests of at least [`threshold`](Self::threshold) bytes (default 2 MiB)
/// get a block of their own from the tier ladder (hugetlb, THP, plain pages),
/// rounded up to 2 MiB and aligned to at least 2 MiB (larger alignments are
/// honoured by over-reserving). Smaller requests go to the small allocator
/// `S`, [`std::alloc::System`] by default
/// ([`with_small_allocator`](Self::with_small_allocator) picks another). The
/// path a block takes depends only on its size, so a block is always freed
/// by the path that served it.
///
/// # Retention
///
/// Through [`GlobalAlloc`], a freed huge-page block is not unmapped at once:
/// it goes to one process-wide retention cache shared by every `CkHuge`
/// value, and a later request whose 2 MiB-rounded length is the block's
/// exact length (and whose alignment the block's address meets) gets it back
/// without a system call, as glibc's `malloc` and mimalloc reuse freed
/// memory. When no block has the exact length, the shortest longer one that
/// meets the alignment is trimmed to the request with one `munmap` of its
/// tail (cheaper than mapping fresh pages the kernel must clear); only when
/// there is none is a new block mapped. Retained blocks always have the
/// exact length `dealloc` and `realloc` rebuild from the layout. The cache
/// is bounded:
///
/// - **cap**: at most [`env::retain_bytes`](crate::env::retain_bytes) bytes
///   (`CKALLOC_RETAIN_BYTES`, default 128 MiB) and 64 blocks are retained,
///   process-wide; a block that does not fit, or is longer than a quarter
///   of the cap (one freed buffer must not hold most of it), is unmapped. Per value,
///   [`retain_max_bytes`](Self::retain_max_bytes) bounds the length of the
///   blocks it puts into (and takes from) the cache;
///   [`uncached`](CkHuge::uncached) retains nothing and maps every block
///   afresh (C-Kernel-Engine's `ck_huge_alloc` behaviour).
/// - **decay**: a block unused for
///   [`env::retain_decay_ms`](crate::env::retain_decay_ms)
///   (`CKALLOC_RETAIN_DECAY_MS`, default 1000 ms; after mimalloc's
///   `purge_delay` and jemalloc's `dirty_decay_ms`) is unmapped by a later
///   allocator call: every 256 calls of a thread (mapped-path calls, and
///   small-path allocations while a block is retained) read the monotonic
///   clock and give back at most 4 expired blocks. A global allocator has no
///   thread of its own, so a process that frees large blocks and then makes
///   no allocator calls (sleeps, waits on I/O) keeps up to the cap mapped
///   and resident until its next calls; [`release_retained`](crate::release_retained) gives
///   everything back at once.
/// - **zeroing**: an `alloc_zeroed` hit of at most 16 MiB is cleared with a
///   memset (its pages are resident, and clearing them costs less than
///   faulting them back in for the kernel to clear); a larger hit is given
///   back with `madvise(MADV_DONTNEED)`, after which its anonymous pages
///   read as zero and fault in on first touch (memset if `madvise` fails).
/// - **hugetlb** blocks are retained like the others and count against the
///   cap: they come from the reserved pool, and retaining one keeps it out
///   of that pool until it decays or is released.
/// - **threads**: the cache is 4 shards of 16 slots; a thread claims a slot
///   with one compare-and-swap and releases it with a store, starting at its
///   own shard, so no thread ever waits for another (no lock, no convoy).
///   The thread-local state (shard number, call counter) is `const`
///   initialised, has no destructor and is reached with `try_with`; the
///   blocks an exiting thread freed stay in the shared slots for other
///   threads.
/// - **fork**: nothing blocks, so the child of `fork()` can allocate whatever
///   the other threads of the parent were doing; a `pthread_atfork` child
///   handler (registered on the first retained block) empties slots that
///   were mid-operation at the fork and recounts the retained bytes.
/// - [`huge_stats`](crate::huge_stats) reports the retained bytes, hits,
///   misses and the bytes decay gave back;
///   [`live_bytes`](crate::HugeStats::live_bytes) excludes retained blocks.
///
/// # Short tails
///
/// Through [`GlobalAlloc`] the caller owns exactly `layout.size()` bytes, so
/// when a THP block's last 2 MiB page holds less than 1 MiB of the request
/// (`size % 2 MiB` is neither 0 nor 1 MiB or more), that page is advised
/// `MADV_NOHUGEPAGE` (`madvise(2)`) and faults in as 4 KiB pages: a
/// 2.25 MiB request whose bytes are all written clears and keeps resident
/// 2.25 MiB, not 4 MiB (a block below 2 MiB, with a lower threshold, is all
/// 4 KiB pages). Longer tails, sizes that are multiples of 2 MiB, and every
/// block served through [`Allocator`] (whose slice covers the whole
/// 2 MiB-rounded length) stay huge. Plain-page blocks (THP off,
/// `CKALLOC_THP=0`) get no advice, and hugetlb blocks none when mapped
/// (`realloc` cannot tell them from THP blocks and may advise their last
/// page, which leaves hugetlb pages as they are).
///
/// - **Advice is about future faults.** A page already faulted in keeps
///   its page size: a huge page stays huge when later advised
///   `MADV_NOHUGEPAGE`, and 4 KiB pages stay 4 KiB pages when later advised
///   `MADV_HUGEPAGE` (until khugepaged collapses them).
/// - **Retained blocks** keep the advice they have: a block mapped for a
///   short tail and reused for a long tail (same rounded length) serves its
///   last page as 4 KiB pages; a block mapped for a long tail and reused for
///   a short tail keeps its whole last page huge (and resident, if it was
///   touched before).
/// - **`realloc`** advises the new last page `MADV_NOHUGEPAGE` when the new
///   size leaves a short tail (growing, shrinking to a shorter mapping, or
///   within the same length from a long tail), and `MADV_HUGEPAGE` when it
///   grows past one or, within the same length, goes from a short tail to a
///   long one.
/// - **VMAs**: an advised block is two VMAs (two lines of
///   `/proc/self/maps`, counted against `vm.max_map_count`), more after it
///   grew; freeing the block unmaps all of them. `mremap` resizes one VMA
///   only, so `realloc` grows such a block by resizing its last 2 MiB page
///   in place when the address space after the block is free, and
///   otherwise copies it into a new block (as mimalloc's `realloc` does
///   for large blocks). Blocks of one VMA (no short tail) move with
///   `mremap` as below.
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
/// [Short tails](CkHuge#short-tails) says how blocks of several VMAs grow);
/// hugetlb blocks cannot grow with `mremap`, so they are copied.
///
/// The mapping path never allocates, takes no lock of its own, never panics
/// and never prints; configuration is read with `getenv`. The first block
/// the process retains registers the fork child handler with
/// `pthread_atfork(3)`, which takes the C library's handler lock once (also
/// safe from inside another library's fork prepare handler). Thread-safe.
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
    threshold: usize,
    retain_max: usize,
    small: S,
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

/// A `GlobalAlloc` block whose last 2 MiB page holds fewer bytes of the
/// request than this keeps that page in 4 KiB pages (see
/// [Short tails](CkHuge#short-tails)): clearing the tail's 4 KiB pages costs
/// less than clearing a whole huge page, and the rest of the page stays out
/// of the resident set.
const SHORT_TAIL: usize = HUGE_PAGE_2M / 2;

/// `alloc_zeroed` hits up to this length are cleared with a memset; longer
/// ones with `MADV_DONTNEED`.
const ZERO_BY_MEMSET_MAX: usize = 16 << 20;

impl CkHuge {
    /// A `CkHuge` with the default threshold of 2 MiB, retaining freed
    /// blocks (see [Retention](CkHuge#retention)); small requests go to
    /// `System`.
    pub const fn new() -> CkHuge {
        CkHuge {
            threshold: HUGE_PAGE_2M,
            retain_max: usize::MAX,
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
    fn is_mapped(&self, size: usize) -> bool {
        size >= self.threshold
    }

    /// The length of the mapping that serves `size` bytes (always
    /// representable: `Layout` sizes are at most `isize::MAX`).
    #[inline]
    fn mapped_len(size: usize) -> Option<usize> {
        sys::round_up(size, HUGE_PAGE_2M)
    }

    /// A fresh mapping for `size` bytes; `global`: the call comes through
    /// `GlobalAlloc`, so a short tail stays in base pages.
    #[cold]
    fn map(size: usize, align: usize, global: bool) -> *mut u8 {
        match map_huge(size, align, &OPTS) {
            Ok(m) => {
                if global && m.backing == Backing::TransparentHuge && Self::short_tail(size) {
                    Self::advise_tail(m.ptr.as_ptr(), size, m.mapped_len);
                }
                m.ptr.as_ptr()
            }
            Err(_) => ptr::null_mut(),
        }
    }

    /// Whether `size` leaves a short tail in its last 2 MiB page (see
    /// [Short tails](CkHuge#short-tails)).
    #[inline]
    fn short_tail(size: usize) -> bool {
        let tail = size % HUGE_PAGE_2M;
        tail != 0 && tail < SHORT_TAIL
    }

    /// Advise the last 2 MiB page of a THP block of `len` bytes for `size`:
    /// `MADV_NOHUGEPAGE` when `size` leaves a short tail in it, else
    /// `MADV_HUGEPAGE`. Advice only: if it fails, the page keeps its advice.
    fn advise_tail(p: *mut u8, size: usize, len: usize) {
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

    /// Whether this value uses the retention cache for a block of `len`
    /// bytes (`retain`: the call comes through `GlobalAlloc`).
    #[inline]
    fn retains(&self, len: usize, retain: bool) -> bool {
        retain && len <= self.retain_max && env::retain_bytes() != 0
    }

    /// A block for `size` bytes aligned to `align`: a retained one when
    /// `retain` allows (cleared when `zero`), else a fresh mapping (which
    /// the kernel zero-fills). `retain`: the call comes through
    /// `GlobalAlloc` (see [`retains`](Self::retains)).
    #[inline]
    fn map_block(&self, size: usize, align: usize, zero: bool, retain: bool) -> *mut u8 {
        let Some(len) = Self::mapped_len(size) else {
            return ptr::null_mut();
        };
        if self.retains(len, retain) {
            retain::tick();
            if let Some(p) = retain::take(len, align.max(HUGE_PAGE_2M)) {
                if zero {
                    Self::zero_hit(p.as_ptr(), size, len);
                }
                return p.as_ptr();
            }
        }
        Self::map(size, align, retain)
    }

    /// Clear the first `size` bytes of a retained block of `len` bytes
    /// (see [Retention](CkHuge#retention) for the cutoff).
    #[cold]
    fn zero_hit(p: *mut u8, size: usize, len: usize) {
        if len > ZERO_BY_MEMSET_MAX && sys::madvise(p, len, Advice::DontNeed).is_ok() {
            return;
        }
        // SAFETY: the block is `len >= size` bytes, ours and unreferenced.
        unsafe { ptr::write_bytes(p, 0, size) };
    }

    /// Free a mapped block of `size` bytes: into the retention cache when
    /// `retain` allows and it has room, else unmapped.
    ///
    /// # Safety
    /// `ptr` is a mapped block of `mapped_len(size)` bytes, no longer used.
    #[inline]
    unsafe fn release_block(&self, ptr: *mut u8, size: usize, retain: bool) {
        let (Some(p), Some(len)) = (NonNull::new(ptr), Self::mapped_len(size)) else {
            return;
        };
        if self.retains(len, retain) {
            retain::tick();
            if retain::put(p, len) {
                return;
            }
        }
        unmap(p, len);
    }

    /// Resize a block to `new_size` keeping `align`; `zero` asks for the
    /// bytes from the old size to the new size to read as zero. Returns null
    /// and leaves the old block intact on failure.
    ///
    /// # Safety
    /// `ptr` was allocated by `self` with `Layout(old_size, align)`, and
    /// `new_size` is a valid `Layout` size for `align` (non-zero).
    unsafe fn resize(
        &self,
        ptr: *mut u8,
        old_size: usize,
        align: usize,
        new_size: usize,
        zero: bool,
        retain: bool,
    ) -> *mut u8 {
        let copy = old_size.min(new_size);
        let zero_tail = |p: *mut u8, from: usize, to: usize| {
            if zero && to > from {
                // SAFETY: `p..p+to` is inside the resized block.
                unsafe { ptr::write_bytes(p.add(from), 0, to - from) };
            }
        };
        match (self.is_mapped(old_size), self.is_mapped(new_size)) {
            (false, false) => {
                // SAFETY: the caller's contract is `S`'s for small blocks.
                let layout = unsafe { Layout::from_size_align_unchecked(old_size, align) };
                // SAFETY: as above; `S` handles any alignment it gave.
                let p = unsafe { self.small.realloc(ptr, layout, new_size) };
                if !p.is_null() {
                    zero_tail(p, old_size, new_size);
                }
                p
            }
            (false, true) => {
                let p = self.map_block(new_size, align, zero, retain);
                if !p.is_null() {
                    // SAFETY: both blocks hold at least `copy` bytes and do
                    // not overlap (another mapping). The tail reads as zero
                    // when `zero` asked for it (fresh or cleared block).
                    unsafe {
                        ptr::copy_nonoverlapping(ptr, p, copy);
                        self.small
                            .dealloc(ptr, Layout::from_size_align_unchecked(old_size, align));
                    }
                }
                p
            }
            (true, false) => {
                // SAFETY: new_size is non-zero and valid for `align`.
                let p = unsafe {
                    self.small
                        .alloc(Layout::from_size_align_unchecked(new_size, align))
                };
                if !p.is_null() {
                    // SAFETY: disjoint blocks, `copy` bytes in both; this
                    // branch only shrinks, so there is no tail to zero.
                    unsafe {
                        ptr::copy_nonoverlapping(ptr, p, copy);
                        self.release_block(ptr, old_size, retain);
                    }
                }
                p
            }
            // SAFETY: forwarded contract.
            (true, true) => unsafe { self.remap(ptr, old_size, align, new_size, zero, retain) },
        }
    }

    /// Grow a `GlobalAlloc` THP block of `old_len` bytes at `base` to
    /// `new_len` bytes with `mremap`, without copying. `mremap` resizes one
    /// VMA only (`EFAULT` across two), and such a block is two or more VMAs
    /// once its last 2 MiB page was advised `MADV_NOHUGEPAGE` (a short tail,
    /// or an earlier one grown past: advice does not merge VMAs whose pages
    /// were faulted in apart). So the last page is grown on its own, in place
    /// when the address space after the block is free; else a block of one
    /// VMA moves whole onto an aligned reservation (`MREMAP_FIXED`), and a
    /// block of several VMAs fails here and is copied by the caller. On error
    /// the block is as it was.
    fn grow_split(
        base: NonNull<u8>,
        old_len: usize,
        new_len: usize,
        align: usize,
    ) -> std::io::Result<NonNull<u8>> {
        let head = old_len - HUGE_PAGE_2M;
        // `head` is inside the block, so the pointer is never null.
        let Some(last) = NonNull::new(base.as_ptr().wrapping_add(head)) else {
            return Err(std::io::ErrorKind::InvalidInput.into());
        };
        if sys::mremap(last, HUGE_PAGE_2M, new_len - head, None).is_ok() {
            return Ok(base);
        }
        let dst = sys::reserve_aligned(new_len, align)?;
        sys::mremap(base, old_len, new_len, Some(dst)).inspect_err(|_| {
            let _ = sys::munmap_best_effort(dst.as_ptr(), new_len);
        })
    }

    /// Mapped-to-mapped resize.
    ///
    /// # Safety
    /// As [`resize`](Self::resize), with both sizes on the mapping path.
    #[cold]
    unsafe fn remap(
        &self,
        ptr: *mut u8,
        old_size: usize,
        align: usize,
        new_size: usize,
        zero: bool,
        retain: bool,
    ) -> *mut u8 {
        let (Some(old_len), Some(new_len), Some(base)) = (
            Self::mapped_len(old_size),
            Self::mapped_len(new_size),
            NonNull::new(ptr),
        ) else {
            return ptr::null_mut();
        };
        // Bytes between the old size and the old mapping's end may hold data
        // from before an earlier shrink; pages past the old mapping are fresh.
        let zero_dirty = |p: *mut u8| {
            let end = new_size.min(old_len);
            if zero && end > old_size {
                // SAFETY: `p..p+end` lies inside the resized mapping.
                unsafe { ptr::write_bytes(p.add(old_size), 0, end - old_size) };
            }
        };
        if new_len == old_len {
            if retain
                && Self::short_tail(old_size) != Self::short_tail(new_size)
                && tier::anon_tier() == Backing::TransparentHuge
            {
                Self::advise_tail(ptr, new_size, new_len);
            }
            zero_dirty(ptr);
            return ptr;
        }
        if new_len < old_len {
            // Shrink: give back whole 2 MiB pages at the tail (valid for
            // hugetlb too). If that fails the block keeps its old length,
            // so report failure and leave it as it was.
            // SAFETY: the tail lies inside our mapping.
            let tail = unsafe { ptr.add(new_len) };
            return match sys::munmap(tail, old_len - new_len) {
                Ok(()) => {
                    COUNTERS.record_unmap(old_len - new_len);
                    COUNTERS.remaps.fetch_add(1, Ordering::Relaxed);
                    if retain
                        && Self::short_tail(new_size)
                        && tier::anon_tier() == Backing::TransparentHuge
                    {
                        Self::advise_tail(ptr, new_size, new_len);
                    }
                    ptr
                }
                Err(_) => ptr::null_mut(),
            };
        }
        // Grow 1: in place, when the address space after the block is free.
        // 2: move onto an aligned reservation with MREMAP_FIXED.
        // hugetlb mappings refuse both (EINVAL), and fall through to 3: map,
        // copy, unmap. A `GlobalAlloc` block on THP may be two VMAs (see
        // `grow_split`).
        let align = align.max(HUGE_PAGE_2M);
        let grown = if retain && tier::anon_tier() == Backing::TransparentHuge {
            Self::grow_split(base, old_len, new_len, align)
        } else {
            sys::mremap(base, old_len, new_len, None).or_else(|_| {
                let dst = sys::reserve_aligned(new_len, align)?;
                sys::mremap(base, old_len, new_len, Some(dst)).inspect_err(|_| {
                    let _ = sys::munmap_best_effort(dst.as_ptr(), new_len);
                })
            })
        };
        if let Ok(p) = grown {
            let backing = tier::anon_tier();
            if backing == Backing::TransparentHuge {
                let _ = sys::madvise(p.as_ptr(), new_len, Advice::HugePage);
                if retain && Self::short_tail(new_size) {
                    Self::advise_tail(p.as_ptr(), new_size, new_len);
                }
            }
            COUNTERS.record_grow(old_len, new_len, backing);
            zero_dirty(p.as_ptr());
            return p.as_ptr();
        }
        let p = self.map_block(new_size, align, zero, retain);
        if !p.is_null() {
            // SAFETY: disjoint mappings; `old_size` bytes are readable in the
            // old block and writable in the new one (new_size > old_size);
            // the old block is no longer used.
            unsafe {
                ptr::copy_nonoverlapping(ptr, p, old_size);
                self.release_block(ptr, old_size, retain);
            }
        }
        p
    }
}

// SAFETY: `alloc` returns blocks of at least `layout.size()` bytes aligned to
// `layout.align()` (`S`'s, a mapping aligned to max(align, 2 MiB), or a
// retained mapping of the same length whose address meets the alignment), or
// null; `alloc_zeroed` clears retained blocks; `dealloc` routes by size
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
        self.map_block(layout.size(), layout.align(), false, true)
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !self.is_mapped(layout.size()) {
            retain::tick_small();
            // SAFETY: as in `alloc`.
            return unsafe { self.small.alloc_zeroed(layout) };
        }
        self.map_block(layout.size(), layout.align(), true, true)
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !self.is_mapped(layout.size()) {
            // SAFETY: small blocks came from `S` with this layout.
            return unsafe { self.small.dealloc(ptr, layout) };
        }
        // SAFETY: mapped blocks are `mapped_len(size)` long at `ptr`.
        unsafe { self.release_block(ptr, layout.size(), true) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: GlobalAlloc's realloc contract is `resize`'s.
        unsafe { self.resize(ptr, layout.size(), layout.align(), new_size, false, true) }
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
        zero: bool,
    ) -> Result<NonNull<[u8]>, AllocError> {
        if old.size() == 0 {
            return if zero {
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
                    zero,
                    false,
                )
            };
            return self.usable(p, new.size());
        }
        let fresh = if zero {
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
            self.map_block(layout.size(), layout.align(), false, false)
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
            self.map_block(layout.size(), layout.align(), true, false)
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
            unsafe { self.release_block(ptr.as_ptr(), layout.size(), false) }
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
        unsafe { self.reallocate(ptr, old, new, false) }
    }

    unsafe fn grow_zeroed(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded contract.
        unsafe { self.reallocate(ptr, old, new, true) }
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded contract.
        unsafe { self.reallocate(ptr, old, new, false) }
    }
}
