//! [`CkHuge`]: the huge-page engine's Rust front, as a global allocator and
//! an `allocator_api2` allocator; small requests go to `System` or another
//! allocator.

use super::engine::{Fill, ENGINE};
use super::policy::Policy;
use crate::sys::HUGE_PAGE_2M;
use crate::zero_size::empty_block;
use allocator_api2::alloc::{AllocError, Allocator, Layout};
use std::alloc::{GlobalAlloc, System};
use std::ptr::{self, NonNull};

/// Huge-page allocator usable as `#[global_allocator]` and as an
/// `allocator_api2` [`Allocator`].
///
/// Requests of at least [`threshold`](Self::threshold) bytes (default
/// 2 MiB) get a block of the huge-page engine: the request rounded up to
/// 2 MiB (all of it usable), aligned to at least 2 MiB (larger alignments
/// are honoured), on the tier ladder (hugetlb, THP, normal pages). Smaller
/// requests go to the small allocator `S` ([`System`] by default, see
/// [`with_small_allocator`](Self::with_small_allocator)); the path depends
/// only on the size, so a block is freed by the path that served it.
///
/// Through [`GlobalAlloc`] the front's policy is [`Policy::RUST_GLOBAL`]:
/// freed blocks are retained for later requests of any length, up to
/// `CKALLOC_RETAIN_BYTES`, and purged by decay (`CKALLOC_RETAIN_DECAY_MS`);
/// fresh THP blocks are faulted in by the first-touch probe. `CkHuge`
/// starts no thread on its own: decay then runs on its calls. With the
/// engine's background thread
/// ([`enable_background_thread`](super::enable_background_thread), or
/// `CKALLOC_BACKGROUND_THREAD=1`) decay runs by the clock, fresh blocks
/// fault in base pages with no probe (where THP's `defrag` mode would make
/// a huge-page fault compact memory synchronously) and are collapsed into
/// huge pages once they have lived 250 ms: a written 64 MiB `Vec` is huge
/// within about 1.5 s here ([docs/engine.md](https://github.com/ckalloc/ckalloc/blob/main/docs/engine.md#the-background-thread)). Through
/// [`Allocator`] it is [`Policy::RUST_ALLOCATOR`]: nothing is retained, so
/// `CachingAllocator<CkHuge>` is the only cache and its `trim` reaches the
/// kernel. Every rule is a row of
/// [docs/engine.md](https://github.com/ckalloc/ckalloc/blob/main/docs/engine.md#the-rules).
///
/// `realloc`, `grow` and `shrink` resize in place when the length stays,
/// shrinks, or the units after the block are free; else the block's pages
/// move with `mremap` (hugetlb blocks are copied). A failed resize leaves
/// the block as it was. The paths never allocate, take no lock, never
/// panic and never print. Thread-safe.
///
/// `CkHuge<S>` is `Copy` and `Debug` when `S` is. Equality compares the
/// threshold and the per-value retention limit, not the small allocator.
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

impl CkHuge {
    /// A `CkHuge` with the default threshold of 2 MiB, retaining freed
    /// blocks; small requests go to `System`.
    pub const fn new() -> CkHuge {
        CkHuge::with_small_allocator(System)
    }

    /// A `CkHuge` that serves requests of at least `bytes` bytes from the
    /// engine (`0` and `1` serve every non-empty request).
    pub const fn with_threshold(bytes: usize) -> CkHuge {
        CkHuge::new().threshold_bytes(bytes)
    }

    /// A `CkHuge` that never retains: every freed block is purged at once.
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

    /// This allocator with requests of at least `bytes` bytes served by the
    /// engine.
    pub const fn threshold_bytes(mut self, bytes: usize) -> Self {
        self.threshold = bytes;
        self
    }

    /// This allocator retaining only blocks of at most `bytes` bytes (after
    /// rounding to 2 MiB; `0`: none). The process-wide cap still applies.
    pub const fn retain_max_bytes(mut self, bytes: usize) -> Self {
        self.retain_max = bytes;
        self
    }

    /// Requests of at least this many bytes get a huge-page block.
    pub const fn threshold(&self) -> usize {
        self.threshold
    }

    /// The longest block (bytes) this value retains.
    pub const fn retain_max(&self) -> usize {
        self.retain_max
    }

    /// The allocator of requests below the threshold.
    pub const fn small_allocator(&self) -> &S {
        &self.small
    }

    /// The policy of this value's `GlobalAlloc` front.
    pub const fn policy(&self) -> Policy {
        Policy {
            retain_max: self.retain_max,
            ..Policy::RUST_GLOBAL
        }
    }
}

impl<S: GlobalAlloc> CkHuge<S> {
    #[inline]
    fn is_huge(&self, size: usize) -> bool {
        size >= self.threshold
    }

    /// A block of the engine, or null.
    #[inline]
    fn engine_alloc(&self, layout: Layout, fill: Fill, policy: &Policy) -> Option<NonNull<[u8]>> {
        ENGINE
            .alloc(layout.size(), layout.align(), fill, policy)
            .map(|b| NonNull::slice_from_raw_parts(b.ptr, b.len))
    }

    /// Resize a block of `old` to `new_size` bytes keeping its alignment,
    /// across the threshold either way, the added bytes reading zero for
    /// `Fill::Zeroed`; `None` on failure, the old block intact.
    ///
    /// # Safety
    /// `ptr` was allocated by `self` with `old`; `new_size` is a valid,
    /// non-zero `Layout` size for `old.align()`.
    unsafe fn resize(
        &self,
        ptr: *mut u8,
        old: Layout,
        new_size: usize,
        fill: Fill,
        policy: &Policy,
    ) -> Option<NonNull<[u8]>> {
        let align = old.align();
        // SAFETY: the caller's contract.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, align) };
        let p = NonNull::new(ptr)?;
        match (self.is_huge(old.size()), self.is_huge(new_size)) {
            (true, true) => {
                // SAFETY: an engine block of the caller's.
                let b = unsafe { ENGINE.resize(ptr, old.size(), new_size, align, fill, policy) }
                    .ok()?;
                Some(NonNull::slice_from_raw_parts(b.ptr, b.len))
            }
            (false, false) => {
                // SAFETY: the caller's contract is `S`'s for small blocks.
                let q = NonNull::new(unsafe { self.small.realloc(ptr, old, new_size) })?;
                if fill == Fill::Zeroed && new_size > old.size() {
                    // SAFETY: `q` holds `new_size` bytes.
                    unsafe {
                        ptr::write_bytes(q.as_ptr().add(old.size()), 0, new_size - old.size())
                    };
                }
                Some(NonNull::slice_from_raw_parts(q, new_size))
            }
            (from_huge, _) => {
                let q = if from_huge {
                    // SAFETY: non-zero size.
                    let q = unsafe { self.small.alloc(new) };
                    NonNull::slice_from_raw_parts(NonNull::new(q)?, new_size)
                } else {
                    self.engine_alloc(new, fill, policy)?
                };
                // SAFETY: disjoint blocks holding at least the smaller size;
                // a fresh engine block reads zero past it when `fill` asks.
                unsafe {
                    let n = old.size().min(new_size);
                    ptr::copy_nonoverlapping(p.as_ptr(), q.as_ptr().cast(), n);
                    if from_huge {
                        // Moved: what the program did to the block went with it.
                        ENGINE.free_moved(p.as_ptr(), policy);
                    } else {
                        self.small.dealloc(p.as_ptr(), old);
                    }
                }
                Some(q)
            }
        }
    }

    /// Free a block of `layout` by the path that served it.
    ///
    /// # Safety
    /// `p` was allocated by `self` with `layout` and is not used afterwards.
    #[inline]
    unsafe fn release(&self, p: NonNull<u8>, layout: Layout, policy: &Policy) {
        if self.is_huge(layout.size()) {
            // SAFETY: an engine block, no longer used.
            unsafe { ENGINE.free(p.as_ptr(), policy) };
        } else {
            // SAFETY: small blocks came from `S` with this layout.
            unsafe { self.small.dealloc(p.as_ptr(), layout) }
        }
    }
}

fn thin(p: Option<NonNull<[u8]>>) -> *mut u8 {
    p.map_or(ptr::null_mut(), |p| p.as_ptr().cast())
}

// SAFETY: `alloc` returns blocks of at least `layout.size()` bytes aligned to
// `layout.align()` (`S`'s, or an engine block of the request's 2 MiB-rounded
// length aligned to max(align, 2 MiB)), or null; `alloc_zeroed` blocks read
// zero (the engine clears retained units); `dealloc` routes by size exactly
// as `alloc` did; `realloc` keeps the contents up to the smaller size and
// leaves the block intact on failure.
unsafe impl<S: GlobalAlloc> GlobalAlloc for CkHuge<S> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !self.is_huge(layout.size()) {
            ENGINE.small_call();
            // SAFETY: the caller's contract (non-zero size) is `S`'s.
            return unsafe { self.small.alloc(layout) };
        }
        thin(self.engine_alloc(layout, Fill::Uninit, &self.policy()))
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !self.is_huge(layout.size()) {
            ENGINE.small_call();
            // SAFETY: as in `alloc`.
            return unsafe { self.small.alloc_zeroed(layout) };
        }
        thin(self.engine_alloc(layout, Fill::Zeroed, &self.policy()))
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if let Some(p) = NonNull::new(ptr) {
            // SAFETY: the caller's contract.
            unsafe { self.release(p, layout, &self.policy()) }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: GlobalAlloc's realloc contract is `resize`'s.
        thin(unsafe { self.resize(ptr, layout, new_size, Fill::Uninit, &self.policy()) })
    }
}

impl<S: GlobalAlloc> CkHuge<S> {
    /// A block for `layout` through the `Allocator` front.
    fn allocate_as(&self, layout: Layout, fill: Fill) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            return Ok(empty_block(layout.align()));
        }
        if self.is_huge(layout.size()) {
            return self
                .engine_alloc(layout, fill, &Policy::RUST_ALLOCATOR)
                .ok_or(AllocError);
        }
        // SAFETY: non-zero size.
        let p = unsafe {
            match fill {
                Fill::Zeroed => self.small.alloc_zeroed(layout),
                Fill::Uninit => self.small.alloc(layout),
            }
        };
        NonNull::new(p)
            .map(|p| NonNull::slice_from_raw_parts(p, layout.size()))
            .ok_or(AllocError)
    }

    /// Grow or shrink for the `Allocator` trait, moving when the alignment
    /// changes.
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
            return self.allocate_as(new, fill);
        }
        if new.size() == 0 {
            // SAFETY: the caller's contract.
            unsafe { self.deallocate(ptr, old) };
            return Ok(empty_block(new.align()));
        }
        if old.align() == new.align() {
            // SAFETY: forwarded contract; sizes are valid for the alignment.
            let p = unsafe {
                self.resize(ptr.as_ptr(), old, new.size(), fill, &Policy::RUST_ALLOCATOR)
            };
            return p.ok_or(AllocError);
        }
        let fresh = self.allocate_as(new, fill)?;
        // SAFETY: disjoint blocks; both hold at least min(old, new) bytes.
        unsafe {
            let n = old.size().min(new.size());
            ptr::copy_nonoverlapping(ptr.as_ptr(), fresh.as_ptr().cast::<u8>(), n);
            self.deallocate(ptr, old);
        }
        Ok(fresh)
    }
}

// SAFETY: blocks stay valid until deallocated, since `CkHuge` holds no state
// of its own besides `S` (copies share `S`'s contract and the one engine);
// zero-size requests get a dangling, aligned pointer and are never passed on.
// An engine block's slice is its whole length, all of it the caller's.
unsafe impl<S: GlobalAlloc> Allocator for CkHuge<S> {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        self.allocate_as(layout, Fill::Uninit)
    }

    #[inline]
    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        self.allocate_as(layout, Fill::Zeroed)
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() != 0 {
            // SAFETY: the caller's contract.
            unsafe { self.release(ptr, layout, &Policy::RUST_ALLOCATOR) }
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
